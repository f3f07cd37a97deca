"""A real ipykernel driven through jupyter_client, as a notebook front end drives it."""

from __future__ import annotations

import json
import queue
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager


#: what every test kernel runs first
SETUP = "import torch\ntorch.set_num_threads(1)\n%load_ext torchmem_magic\nimport torchmem_magic"


#: DDP ranks forked from a cell (gloo on CPU): `train(rank, world, port, leak_rank)`; the leaking rank keeps
#: every output, with its graph, in its own list `outputs`
RANK_TRAINING = '''
import os, time, torch, torch.distributed as dist, torch.multiprocessing as mp

def train(rank, world, port, leak_rank, steps=200):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    outputs = []  # on the leaking rank: every output and its graph
    for step in range(steps):
        out = model(torch.randn(64, 256))
        opt.zero_grad(); out.pow(2).mean().backward(); opt.step()
        if rank == leak_rank:
            outputs.append(out)
        time.sleep(0.01)
    dist.barrier()
    dist.destroy_process_group()
'''


@dataclass
class Execution:
    """Everything one execute_request produced, iopub messages in arrival order."""

    reply: dict[str, Any]
    iopub: list[dict[str, Any]] = field(default_factory=list)
    reply_index: int = -1  # how many iopub messages had arrived when the reply came

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [m for m in self.iopub if m["msg_type"] == msg_type]

    @property
    def stdout(self) -> str:
        return "".join(m["content"]["text"] for m in self.of_type("stream") if m["content"]["name"] == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(m["content"]["text"] for m in self.of_type("stream") if m["content"]["name"] == "stderr")

    @property
    def error(self) -> dict[str, Any] | None:
        errors = self.of_type("error")
        return errors[0]["content"] if errors else None

    def results(self) -> list[dict[str, Any]]:
        return [m["content"]["data"] for m in self.of_type("execute_result")]


REPO = Path(__file__).resolve().parents[2]
# the oldest supported stack in a venv of its own beside the project's: `make test` creates it from
# constraints/minimum.txt (the declared floors of IPython, ipywidgets, bqplot, psutil, and ipykernel 6 at its
# floor: no subshells) with the newer torch build and this checkout installed editable (one environment, as a
# user of those versions has it)
FLOORS = REPO / ".venv-floors"
# ipykernel 7.0.0 (the first release with subshells, whose threads' messages look their parent up in the
# thread's own context) with the newest of everything else, torch 2.13.0 and this checkout (editable):
# `make test` creates it too (`make ipykernel70`)
IPYKERNEL70 = REPO / ".venv-ipykernel70"
IPYKERNEL70_VERSION = "7.0.0"
#: "newest": this interpreter (the project's venv: newest IPython & co.); "floors", "ipykernel70": the venvs above
FLAVOURS = ("newest", "floors")
#: each flavour's venv but the newest's
VENVS = {"floors": FLOORS, "ipykernel70": IPYKERNEL70}


def pinned_floors() -> dict[str, str]:
    """name -> version pinned in constraints/minimum.txt (what the floors venv was built with)."""
    pins = {}
    for line in (REPO / "constraints" / "minimum.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def kernel_python(flavour: str) -> str:
    """The interpreter a kernel of this flavour runs in."""
    if flavour == "newest":
        return sys.executable  # the project's venv, whatever kernelspecs the machine has
    if flavour in VENVS:
        return str(VENVS[flavour] / "bin" / "python")
    raise ValueError(flavour)


class Kernel:
    def __init__(self, flavour: str = "newest", python: str | None = None, cwd: str | None = None) -> None:
        """A kernel of `flavour`, or one run by the interpreter `python` (another environment), in `cwd`."""
        self.flavour = flavour
        # a kernelspec of our own names the interpreter (jupyter_client 8 ignores KernelManager.kernel_cmd)
        self._spec_dir = tempfile.TemporaryDirectory(prefix="torchmem-kernelspec-")
        spec = Path(self._spec_dir.name) / flavour
        spec.mkdir()
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [python or kernel_python(flavour), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python 3 ({flavour})", "language": "python",
        }))
        self.km = KernelManager(
            kernel_name=flavour, kernel_spec_manager=KernelSpecManager(kernel_dirs=[self._spec_dir.name])
        )
        self.km.start_kernel(**({} if cwd is None else {"cwd": cwd}))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.ipykernel_version: str = self.value("__import__('ipykernel').__version__", store_history=False)

    @property
    def has_subshells(self) -> bool:
        """ipykernel 7+: comm messages can run while a cell is busy."""
        return int(self.ipykernel_version.split(".")[0]) >= 7

    def execute(
        self, code: str, timeout_s: float = 120.0, interrupt_after_s: float | None = None, store_history: bool = True,
        interrupt_when_printed: str | None = None,
    ) -> Execution:
        """Run `code`; collect iopub until the kernel is idle again; note when the reply arrived. Interrupt
        it (SIGINT, as the Stop button does) `interrupt_after_s` after the request, or once its stdout
        holds `interrupt_when_printed`."""
        msg_id = self.kc.execute(code, store_history=store_history)
        deadline = time.monotonic() + timeout_s
        interrupt_at = None if interrupt_after_s is None else time.monotonic() + interrupt_after_s
        execution = Execution(reply={})
        idle = False
        while not (idle and execution.reply):
            if time.monotonic() > deadline:
                raise TimeoutError(f"kernel did not finish within {timeout_s}s: {code[:80]!r}")
            if (interrupt_at is not None and time.monotonic() >= interrupt_at) or (
                interrupt_when_printed is not None and interrupt_when_printed in execution.stdout
            ):
                self.km.interrupt_kernel()
                interrupt_at = interrupt_when_printed = None
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                msg = None
            if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                execution.iopub.append(msg)
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    idle = True
            if not execution.reply:
                try:
                    reply = self.kc.get_shell_msg(timeout=0.0 if msg is not None else 0.01)
                except queue.Empty:
                    continue
                if reply["parent_header"].get("msg_id") == msg_id:
                    execution.reply = reply
                    execution.reply_index = len(execution.iopub)
        return execution

    def ok(self, code: str, **kwargs: Any) -> Execution:
        """Execute and fail the test with the kernel's traceback if it did not succeed."""
        execution = self.execute(code, **kwargs)
        if execution.status != "ok":
            error = execution.error or {}
            pytest.fail(f"cell failed: {error.get('ename')}: {error.get('evalue')}\n" + "\n".join(error.get("traceback", [])))
        return execution

    def value(self, expr: str, store_history: bool = True) -> Any:
        """Evaluate `expr` in the kernel and return it through JSON."""
        execution = self.ok(f"import json as _j; print(_j.dumps({expr}))", store_history=store_history)
        return json.loads(execution.stdout.strip().splitlines()[-1])

    def send_comm(self, comm_id: str, data: dict[str, Any], subshell_id: str | None = None) -> str:
        """Send a widget message the way JupyterLab does (optionally to a kernel subshell)."""
        msg = self.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def click(self, comm_id: str, subshell_id: str | None = None) -> str:
        return self.send_comm(comm_id, {"method": "custom", "content": {"event": "click"}}, subshell_id)

    def create_subshell(self) -> str:
        msg = self.kc.session.msg("create_subshell_request", {})
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            reply = self.kc.get_control_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]["subshell_id"]
        raise TimeoutError("no create_subshell_reply")

    def iopub_until(self, predicate: Any, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Collect iopub messages (any parent) until `predicate(msg)` holds; returns them all."""
        seen = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                continue
            seen.append(msg)
            if predicate(msg):
                return seen
        raise TimeoutError("iopub condition not met")

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self._spec_dir.cleanup()


def free_port() -> int:
    """A TCP port nobody listens on now (fixed ports collide when test runs overlap on one machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port

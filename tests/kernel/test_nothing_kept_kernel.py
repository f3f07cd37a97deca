"""Nothing of the user's is kept by `%%memwatch`, each cell of the matrix in a fresh kernel: torch cold (the
kernel's first optimizer step inside the watched cell) or warm, times each way a cell ends: well, the user's
exception, a Ctrl-C (the kernel interrupted, SIGINT), the Stop button (a real click on its comm, from a
subshell), the memory guard. The live figure is shown, as a user sees it.

Afterwards the session is freed; the training function's 16 MiB local is freed once the user drops what
IPython keeps of the failed cell (`release_last_exception()`: `sys.last_*`, `InteractiveTB.tb`, the last
execution result), and at once where the cell ended well or by the Stop button; no hook, thread or file
descriptor of ours is left (ipykernel closes the iopub pipe it made for the sampler thread at its
next sweep of finished threads' pipes, every 10 s: the test waits for it), fd 2 is the one it was, and the environment is as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kernel_client import Kernel
from test_controls import _status_step, _widget_ids

pytestmark = [pytest.mark.kernel]

MIB = 1 << 20
#: what torch's first optimizer step sets in the environment itself (tests/leaks compares with a bare loop)
TORCH_SETS = {"TORCHINDUCTOR_CACHE_DIR"}

SETUP = """\
import gc, os, signal, threading, weakref, json
import torch
import torchmem_magic
from torchmem_magic.session.run import active_session
torch.set_num_threads(1)
%load_ext torchmem_magic
refs = {}
kept = []
def state():
    pipes = get_ipython().kernel.iopub_thread._event_pipes  # ipykernel's iopub pipe of each thread that sent
    return {"fds": sorted(os.listdir("/proc/self/fd")), "environ": dict(os.environ), "stderr": list(os.fstat(2)[:2]),
            "pipes": sorted(t.name for t in pipes if t.is_alive()),
            "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("torchmem_magic"))}
def train(ending, steps=60):
    big = torch.zeros(16 * 2**20 // 4)
    refs["big"] = weakref.ref(big)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10_000 if ending in ("guard", "stop") else steps):
        optimizer.zero_grad(); model(torch.randn(4, 8)).pow(2).mean().backward(); optimizer.step()
        if "session" not in refs and active_session() is not None:
            refs["session"] = weakref.ref(active_session())
        if ending == "guard":
            kept.append(torch.ones(5 * 2**20 // 4))
        if step == 30 and ending == "error":
            raise ValueError("the user's own error")
        if step == 30 and ending == "interrupt":
            print("interrupt me", flush=True)
        if ending in ("interrupt", "stop"):
            __import__("time").sleep(0.01)
"""

WARM = """\
_m = torch.nn.Linear(2, 1); _o = torch.optim.SGD(_m.parameters(), lr=0.1)
_m(torch.ones(1, 2)).sum().backward(); _o.step(); del _m, _o
"""

GUARD_LIMIT = """\
import psutil
from torchmem_magic.probes.limits import RAM_LIMIT_VARIABLE
os.environ[RAM_LIMIT_VARIABLE] = str(int((psutil.Process().memory_info().rss + 150 * 2**20) / 0.9))
"""

AFTER = """\
kept.clear(); os.environ.pop("TORCHMEM_MAGIC_RAM_LIMIT", None)
gc.collect(); gc.collect()
alive = {name: ref() is not None for name, ref in refs.items()}
torchmem_magic.release_last_exception()
gc.collect()
import time
waited_s = time.monotonic()
while set(state()["fds"]) - set(before["fds"]) and time.monotonic() - waited_s < 30:
    time.sleep(0.1)  # ipykernel closes a finished thread's iopub pipe (an eventfd) at its next sweep, 10 s apart
after = state()
from torchmem_magic.tracing.hooks import installed_hook_count
print(json.dumps({"alive": alive, "alive_after_release": {n: r() is not None for n, r in refs.items()},
                  "report": torchmem_magic.last_report().status, "hooks": installed_hook_count(),
                  "threads": after["threads"], "fds_left": sorted(os.path.realpath(f"/proc/self/fd/{fd}") for fd in set(after["fds"]) - set(before["fds"])),
                  "environ_changed": sorted(k for k in {*before["environ"], *after["environ"]}
                                            if before["environ"].get(k) != after["environ"].get(k)),
                  "stderr_same": before["stderr"] == after["stderr"],
                  "new_pipes": sorted(set(after["pipes"]) - set(before["pipes"]))}))
"""


def _run_stopped(k: Kernel, subshell: str) -> None:
    """The watched cell, ended by a click on its Stop button (from a subshell, as JupyterLab sends it)."""
    msg_id = k.kc.execute("%%memwatch --interval 20\ntrain('stop')\n")
    seen = k.iopub_until(lambda m: m["msg_type"] == "comm_msg" and _status_step(m) >= 5)
    k.click(_widget_ids(seen)["Stop"], subshell_id=subshell)
    k.iopub_until(lambda m: m["msg_type"] == "status" and m["parent_header"].get("msg_id") == msg_id
                  and m["content"]["execution_state"] == "idle", timeout_s=60)


def _run_cell(k: Kernel, ending: str, subshell: str | None) -> str:
    """The watched cell, ended by `ending` (a click comes from `subshell`); the execute reply's status."""
    if subshell is not None:
        _run_stopped(k, subshell)
        return "ok"
    guard = " --guard 90%" if ending == "guard" else ""
    execution = k.execute(f"%%memwatch --interval 20{guard}\ntrain({ending!r})\n",
                          interrupt_when_printed="interrupt me" if ending == "interrupt" else None)
    return execution.status


@pytest.mark.parametrize("ending", ["ok", "error", "interrupt", "stop", "guard"])
@pytest.mark.parametrize("torch_state", ["cold", "warm"])
def test_a_watched_cell_keeps_nothing_of_the_users(fresh_kernel: Kernel, torch_state: str, ending: str) -> None:
    k = fresh_kernel
    if ending == "stop" and not k.has_subshells:
        pytest.skip("a click acts mid-cell only with ipykernel 7's subshells")
    k.ok(SETUP + (WARM if torch_state == "warm" else ""), store_history=False)
    subshell = k.create_subshell() if ending == "stop" else None  # its sockets are the kernel's, made before
    k.ok("before = state()" + ("\n" + GUARD_LIMIT if ending == "guard" else ""), store_history=False)
    status = _run_cell(k, ending, subshell)
    execution = k.ok(AFTER, store_history=False)
    result: dict[str, Any] = json.loads(execution.stdout.strip().splitlines()[-1])
    assert status == ("ok" if ending in ("ok", "stop") else "error")
    assert result["report"] == {"ok": "ok", "error": "error", "interrupt": "interrupted", "stop": "interrupted",
                                "guard": "error"}[ending]
    assert not result["alive"]["session"], "the session outlives the cell"
    if ending in ("ok", "stop"):  # nothing of IPython's holds the frames of a cell that ended well
        assert not result["alive"]["big"], "the training function's local outlives the cell"
    assert not any(result["alive_after_release"].values()), "release_last_exception() did not free the frames"
    assert (result["hooks"], result["threads"]) == (0, [])
    # the subshell that sent the click keeps its own iopub pipe (an eventfd), as the kernel's thread it is
    kernels = [name for name in result["new_pipes"] if not name.startswith("torchmem_magic")]
    assert len(result["fds_left"]) <= len(kernels) and all(fd.endswith("[eventfd]") for fd in result["fds_left"])
    assert result["stderr_same"]
    assert set(result["environ_changed"]) <= (TORCH_SETS if torch_state == "cold" else set())

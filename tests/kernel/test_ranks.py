"""Every rank of a DDP run launched from a notebook cell (torch.multiprocessing, fork, gloo on CPU) is
watched from inside itself: per-rank verdicts and holders, the worst rank, a rank that dies."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from kernel_client import Kernel, free_port

pytestmark = pytest.mark.kernel

TRAIN = '''
import os, signal, time, torch, torch.distributed as dist, torch.multiprocessing as mp

def train(rank, world, port, leak_rank, steps=150, kill_at=None):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    outputs = []  # this rank's own list: on the leaking rank it keeps every output and its graph
    for step in range(steps):
        out = model(torch.randn(64, 256))
        loss = out.pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        if rank == leak_rank:
            outputs.append(out)
        time.sleep(0.005)  # a step of a few ms, as a small real model's
        if step == kill_at and rank == leak_rank:
            os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    dist.destroy_process_group()
'''

# what one kept output frees when deleted (after its backward ran), measured in the kernel without the tool
FREED_PER_OUTPUT = '''
import ctypes, gc
class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
_libc = ctypes.CDLL("libc.so.6"); _libc.mallinfo2.restype = _MallInfo2
def _heap():
    info = _libc.mallinfo2(); return info.uordblks + info.hblkhd
_m = torch.nn.Linear(256, 256); _kept = []
for _ in range(200):
    _o = _m(torch.randn(64, 256)); _o.pow(2).mean().backward(); _kept.append(_o)
del _o; gc.collect(); _before = _heap(); _kept.clear(); gc.collect()
freed_per_output = (_before - _heap()) / 200
'''

RANK_KEYS = ("rank", "verdict", "leak_kind", "resource", "per_step", "status", "ended", "steps", "suspects", "vram", "ram")


def _run(kernel: Kernel, world: int, port: int, kill_at: int | None = None) -> dict[str, Any]:
    kernel.execute(
        "%%memwatch -q\n"
        f"mp.start_processes(train, args=({world}, {port}, 1, 150, {kill_at}), nprocs={world}, start_method='fork')",
        timeout_s=240,
    )
    report: dict[str, Any] = kernel.value(
        "{k: v for k, v in torchmem_magic.last_report().to_dict().items() "
        "if k in ('verdict', 'worst_rank', 'ranks', 'status', 'advice', 'steps', 'clock')}"
    )
    return report


@pytest.fixture(scope="module")
def k(kernel: Kernel) -> Kernel:
    kernel.ok(TRAIN + FREED_PER_OUTPUT + "import torchmem_magic.tracing.hooks, threading")
    return kernel


def _leftovers(kernel: Kernel) -> list[str]:
    """The kernel's own rank sockets' directories still on disk."""
    pid = kernel.value("__import__('os').getpid()")
    return sorted(p.name for p in Path(tempfile.gettempdir()).glob(f"torchmem_magic-{pid}-*"))


@pytest.mark.parametrize("run", [1, 2, 3])
@pytest.mark.parametrize("world", [2, 4])
def test_the_leaking_rank_is_named_with_its_holder_and_the_others_are_clean(k: Kernel, world: int, run: int) -> None:
    report = _run(k, world, free_port())
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == list(range(world)), report
    leaking = ranks[1]
    assert (leaking["verdict"], leaking["leak_kind"], leaking["status"]) == ("leak", "per-iteration", "ok"), leaking
    assert "outputs" in [s["name"] for s in leaking["suspects"]], leaking["suspects"]
    freed = k.value("freed_per_output")
    assert abs(leaking["per_step"] - freed) <= 0.2 * freed, (leaking["per_step"], freed)
    for other in ranks[:1] + ranks[2:]:
        assert other["verdict"] == "clean", other
        assert other["steps"] == 150 and other["vram"] is None  # CPU only: no VRAM, never zeros
    assert report["worst_rank"] == 1 and report["verdict"] == "leak" and report["steps"] == 150
    line = next(a for a in report["advice"] if a.startswith("rank 1: leak"))
    holder = next(s for s in leaking["suspects"] if s["name"] == "outputs")
    # too few mid-run scans on a crowded machine give the holder no rate: it is then named as holding the memory
    assert ("outputs grows +" if holder["growth_per_step"] is not None else "held by outputs") in line, line
    # nothing left behind in the kernel: hooks, the sampler thread, the sink's directory
    assert k.value("torchmem_magic.tracing.hooks.installed_hook_count()") == 0
    assert k.value("[t.name for t in threading.enumerate() if t.name.startswith('torchmem_magic')]") == []
    assert _leftovers(k) == []


@pytest.mark.floors
def test_a_rank_killed_mid_run_is_named_with_its_last_readings(k: Kernel) -> None:
    report = _run(k, 2, free_port(), kill_at=80)
    assert report["status"] == "error"  # the launcher raised ProcessExitedException into the cell
    killed = report["ranks"][1]
    assert killed["status"] == "killed" and killed["ended"] == "SIGKILL", killed
    # what it streamed until a quarter second before its death (80 steps take about 0.6 s)
    assert 30 <= killed["steps"] <= 81, killed
    assert killed["ram"]["end"] > 0
    assert report["worst_rank"] == 1
    death = next(line for line in report["advice"] if line.startswith("rank 1 (pid"))
    assert "stopped without finishing (SIGKILL)" in death and "last readings: RAM" in death, death
    survivor = report["ranks"][0]
    assert survivor["steps"] >= 30 and survivor["ram"]["peak"] > 0, survivor  # its report is intact


def test_dataloader_workers_never_become_ranks_even_when_they_run_modules(k: Kernel) -> None:
    """Workers are forked from the cell and inherit the hooks; a transform that is an nn.Module fires
    them there. A run of one process keeps `ranks: null`."""
    k.ok(
        "%%memwatch -q\n"
        "class Augment(torch.utils.data.Dataset):\n"
        "    def __init__(self): self.noise = torch.nn.Dropout(0.1)\n"
        "    def __len__(self): return 256\n"
        "    def __getitem__(self, i): return self.noise(torch.randn(32))\n"
        "net = torch.nn.Linear(32, 1); opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for batch in torch.utils.data.DataLoader(Augment(), batch_size=16, num_workers=2):\n"
        "    opt.zero_grad(); net(batch).sum().backward(); opt.step()\n",
        timeout_s=120,
    )
    report = k.value("{k: torchmem_magic.last_report().to_dict()[k] for k in ('ranks', 'worst_rank', 'steps', 'workers')}")
    assert (report["ranks"], report["worst_rank"], report["steps"]) == (None, None, 16), report
    assert report["workers"]["max"] == 2
    assert _leftovers(k) == []

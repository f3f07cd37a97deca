"""The launchers people use from a notebook fork their ranks the way torchmem_magic watches: Lightning's
`ddp_notebook` strategy and Accelerate's `notebook_launcher`, on CPU with gloo, one rank leaking."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_client import SETUP, Kernel, free_port

pytestmark = [pytest.mark.kernel, pytest.mark.usefixtures("nothing_left_behind")]

ROOT = Path(__file__).resolve().parents[2]
OUTPUT_BYTES = 64 * 256 * 4  # what one kept output of the tiny models below holds, without its graph
STEPS = 300  # about 2 s a run; enough mid-run holder scans to measure the holder's growth on a busy machine

LIGHTNING = '''
import logging, lightning as L, torch
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no banners in the kernel's output
kept = []  # rank 1 appends every output (and its graph) here: the leak

class Tiny(L.LightningModule):
    def __init__(self, holder="global"):
        super().__init__()
        self.layer = torch.nn.Linear(256, 256)
        self.holder, self.kept = holder, []

    def training_step(self, batch, batch_idx):
        out = self.layer(batch[0])
        if self.global_rank == 1:
            (kept if self.holder == "global" else self.kept).append(out)
        return out.pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

def make_trainer(steps):
    return L.Trainer(accelerator="cpu", devices=2, strategy="ddp_notebook", max_steps=steps, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)

def batches(steps):
    data = torch.utils.data.TensorDataset(torch.randn(64 * steps, 256))
    return torch.utils.data.DataLoader(data, batch_size=64)
'''

ACCELERATE = '''
import os, torch
from accelerate import Accelerator, debug_launcher, notebook_launcher

def train_accelerate(leak_rank, steps, cpu=True):
    accelerator = Accelerator(cpu=cpu)  # cpu=True: gloo across the processes; without it, each trains alone
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    outputs = []  # this rank's own list: on the leaking rank it keeps every output and its graph
    for step in range(steps):
        out = model(torch.randn(64, 256))
        loss = out.pow(2).mean()
        optimizer.zero_grad(); accelerator.backward(loss); optimizer.step()
        if accelerator.process_index == leak_rank:
            outputs.append(out)
    state = accelerator.state
    with open(os.path.join(launch_dir, str(os.getpid())), "w") as file:
        file.write(f"{state.process_index} {state.num_processes} {state.distributed_type.value} {state.backend}")
    accelerator.wait_for_everyone()
'''


def _report(kernel: Kernel, cell: str) -> dict[str, Any]:
    kernel.ok("%%memwatch -q\n" + cell, timeout_s=240)
    report: dict[str, Any] = kernel.value(
        "{k: v for k, v in torchmem_magic.last_report().to_dict().items() "
        "if k in ('verdict', 'worst_rank', 'ranks', 'status', 'advice', 'steps')}"
    )
    return report


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("torchmem_magic-*"))


def _check_rank_1_leaks(report: dict[str, Any], steps: int, holder: str | None) -> dict[str, Any]:
    """Two ranks; rank 1 leaks one output a step and is the worst, named with `holder` (None: named by
    none); rank 0 is clean. Returns rank 1's entry."""
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1], report
    clean, leaking = ranks
    assert clean["verdict"] == "clean" and clean["suspects"] == [], clean
    assert (leaking["verdict"], leaking["leak_kind"], leaking["status"]) == ("leak", "per-iteration", "ok"), leaking
    # the heap grows by the output plus its graph's nodes
    assert OUTPUT_BYTES <= leaking["per_step"] <= 1.5 * OUTPUT_BYTES, leaking["per_step"]
    for rank in ranks:
        assert rank["steps"] == steps and rank["status"] == "ok", rank
    assert report["worst_rank"] == 1 and report["verdict"] == "leak", report
    assert "rank 0: clean" in report["advice"], report["advice"]
    line = next(a for a in report["advice"] if a.startswith("rank 1: leak (per-iteration)"))
    if holder is None:
        assert leaking["suspects"] == [] and "grows" not in line, (leaking["suspects"], line)
        return leaking
    top = leaking["suspects"][0]
    assert top["name"] == holder and top["rank"] == 1, leaking["suspects"]
    if top["growth_per_step"] is None:  # too few scans on a crowded machine to give the holder a rate
        assert f"held by {holder}" in line, line
        return leaking
    assert OUTPUT_BYTES <= top["growth_per_step"] <= 1.2 * OUTPUT_BYTES, top
    assert f"{holder} grows +" in line, line
    return leaking


@pytest.fixture(scope="module")
def kernel_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernel-tmp")


@pytest.fixture(scope="module")
def k(kernel_tmp: Path) -> Iterator[Kernel]:
    """A kernel with a temporary directory of its own, so what its runs leave there is theirs alone
    (other test runs on the machine make and remove their own sink directories meanwhile)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(kernel_tmp))
        kernel = Kernel()
    kernel.ok(SETUP + f"\nimport threading, torchmem_magic.tracing.hooks\nSTEPS = {STEPS}")
    assert Path(kernel.value("torchmem_magic.__file__")).parent == ROOT / "torchmem_magic"  # this tree's code
    assert kernel.value("__import__('tempfile').gettempdir()") == str(kernel_tmp)
    yield kernel
    kernel.shutdown()


@pytest.fixture()
def nothing_left_behind(k: Kernel, kernel_tmp: Path) -> Iterator[None]:
    """No hook, sampler thread or sink directory outlives the watched cell."""
    before = _leftovers(kernel_tmp)
    yield
    assert k.value("torchmem_magic.tracing.hooks.installed_hook_count()") == 0
    assert k.value("[t.name for t in threading.enumerate() if t.name.startswith('torchmem_magic')]") == []
    assert _leftovers(kernel_tmp) == before


@pytest.fixture(scope="module")
def lightning(k: Kernel) -> Kernel:
    pytest.importorskip("lightning", reason="lightning is not installed (pip install lightning, CPU torch pinned)")
    k.ok(LIGHTNING)
    return k


@pytest.fixture(scope="module")
def accelerate(k: Kernel, tmp_path_factory: pytest.TempPathFactory) -> Kernel:
    pytest.importorskip("accelerate", reason="accelerate is not installed (pip install accelerate, CPU torch pinned)")
    k.ok(ACCELERATE + f"import pathlib\nlaunch_dir = {str(tmp_path_factory.mktemp('launch'))!r}")
    return k


def test_lightning_ddp_notebook_names_the_rank_that_keeps_outputs_in_a_notebook_list(lightning: Kernel) -> None:
    report = _report(lightning, "make_trainer(STEPS).fit(Tiny('global'), batches(STEPS))")
    _check_rank_1_leaks(report, STEPS, holder="kept")


@pytest.mark.parametrize(
    ("cell", "holder", "path_end"),
    [
        # the module is a notebook name: the attribute is found through it
        ("model = Tiny('attribute')\nmake_trainer(STEPS).fit(model, batches(STEPS))", "model", ".kept[0]"),
        # only the trainer is: found through the trainer's reference to the module
        ("trainer = make_trainer(STEPS)\ntrainer.fit(Tiny('attribute'), batches(STEPS))", "trainer", ".kept[0]"),
        # neither is named anywhere: the rank's search back finds the module where it is, a local of
        # Lightning's `fit()` on the rank's main thread (the search's finding reaches the watcher with the rest)
        ("make_trainer(STEPS).fit(Tiny('attribute'), batches(STEPS))", "thread 'MainThread'", "fit() local model"),
    ],
    ids=["module-is-a-name", "trainer-is-a-name", "nothing-named"],
)
def test_lightning_module_attribute_is_named_through_what_the_notebook_holds(
    lightning: Kernel, cell: str, holder: str, path_end: str
) -> None:
    leaking = _check_rank_1_leaks(_report(lightning, cell), STEPS, holder)
    assert leaking["suspects"][0]["path"].endswith(path_end), leaking["suspects"][0]


def _processes(k: Kernel) -> dict[int, list[str]]:
    """What each launched process said about itself (pid -> process index, processes, type, backend)."""
    seen: dict[str, str] = k.value("{p.name: p.read_text() for p in pathlib.Path(launch_dir).iterdir()}")
    k.ok("for p in pathlib.Path(launch_dir).iterdir(): p.unlink()")
    return {int(pid): text.split() for pid, text in seen.items()}


def test_accelerate_notebook_launcher_forks_two_gloo_ranks_on_cpu(accelerate: Kernel) -> None:
    """Without a GPU, notebook_launcher still takes its multi-device path (it prints "Launching training on
    2 CUDAs."): torch's elastic agent runs in the kernel and forks the processes, and
    `Accelerator(cpu=True)` joins them with gloo."""
    report = _report(accelerate, f"notebook_launcher(train_accelerate, args=(1, STEPS), num_processes=2, use_port='{free_port()}')")
    processes = _processes(accelerate)  # read (and cleared) first: the next test's launch writes there too
    leaking = _check_rank_1_leaks(report, STEPS, holder="outputs")
    assert sorted(processes.values()) == [["0", "2", "MULTI_CPU", "gloo"], ["1", "2", "MULTI_CPU", "gloo"]], processes
    assert processes[leaking["pid"]][0] == "1" and accelerate.value("os.getpid()") not in processes


def test_accelerate_without_cpu_flag_trains_each_process_alone_still_two_ranks(accelerate: Kernel) -> None:
    """`Accelerator()` without `cpu=True` on a machine without a GPU does not set up a process group: each
    forked process trains on its own (process index 0 of 1). They are still told apart as ranks 0 and 1
    by the launcher's RANK."""
    report = _report(
        accelerate, f"notebook_launcher(train_accelerate, args=(1, STEPS, False), num_processes=2, use_port='{free_port()}')"
    )
    processes = _processes(accelerate)
    assert sorted(processes.values()) == [["0", "1", "NO", "None"]] * 2, processes
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["pid"] for r in ranks} == set(processes), report
    assert all(r["verdict"] == "clean" and r["steps"] == STEPS for r in ranks), ranks  # index 1 never comes


def test_accelerate_debug_launcher_forks_two_gloo_ranks(accelerate: Kernel) -> None:
    """Accelerate's CPU-only launcher: torch.multiprocessing fork, gloo over a file store."""
    report = _report(accelerate, "debug_launcher(train_accelerate, args=(1, STEPS), num_processes=2)")
    _check_rank_1_leaks(report, STEPS, holder="outputs")
    assert sorted(_processes(accelerate).values()) == [["0", "2", "MULTI_CPU", "gloo"], ["1", "2", "MULTI_CPU", "gloo"]]

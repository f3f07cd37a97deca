"""The trainers' callbacks in a real kernel, as a notebook runs them: the live figure under the cell that calls
`fit` (its updates leave the kernel as comm messages while the run goes), the report shown with its static
figure at the end, and no second session inside a `%%memwatch` cell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from leaky_loops import FRAMEWORK_SETUP, SETUP  # noqa: E402

from torchmem_magic.render.static import embedded_figure  # noqa: E402

pytestmark = pytest.mark.kernel

LIGHTNING_MODULE = (
    "from torchmem_magic.integrations.lightning import MemwatchCallback\n"
    "class LitRegressor(L.LightningModule):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.net = mlp()\n"
    "        self.train_outputs = []\n"
    "    def training_step(self, batch, batch_idx):\n"
    "        (x,) = batch\n"
    "        self.train_outputs.append(self.net[:2](x).detach())  # 64 KiB a step, never cleared\n"
    "        return self.net(x).square().mean()\n"
    "    def configure_optimizers(self):\n"
    "        return torch.optim.SGD(self.parameters(), lr=1e-3)\n"
    "train = DataLoader(TensorDataset(torch.randn(3200, 64)), batch_size=32)\n"
)


@pytest.fixture()
def lightning_kernel(fresh_kernel: Kernel, tmp_path: Path) -> Kernel:
    fresh_kernel.ok(SETUP + f"lightning_root = {str(tmp_path)!r}\n" + FRAMEWORK_SETUP["lightning"] + LIGHTNING_MODULE)
    return fresh_kernel


def test_the_live_figure_shows_under_the_cell_that_calls_fit_and_the_report_at_its_end(
    lightning_kernel: Kernel,
) -> None:
    execution = lightning_kernel.ok(
        "model = LitRegressor(); callback = MemwatchCallback()\n"
        "make_trainer(max_epochs=3, callbacks=[callback]).fit(model, train)\n", timeout_s=180,
    )
    displays = [m["content"]["data"] for m in execution.of_type("display_data")]
    assert any("application/vnd.jupyter.widget-view+json" in data for data in displays)
    figures = [embedded_figure(data.get("text/html", "")) for data in displays]
    assert any("verdict: leak" in figure and "<polyline" in figure for figure in figures if figure)
    updates = [m for m in execution.of_type("comm_msg") if m["content"]["data"].get("method") == "update"]
    assert len(updates) >= 3, len(updates)  # the figure was redrawn while fit ran
    report = lightning_kernel.value(
        "(lambda r: [r.verdict, r.steps, r.suspects[0].name, r.suspects[0].path])(callback.report)")
    assert report[:3] == ["leak", 300, "model"] and report[3].startswith("model.train_outputs"), report
    assert lightning_kernel.value("callback.report is torchmem_magic.last_report()")


def test_inside_a_memwatch_cell_the_cell_session_is_the_only_one(lightning_kernel: Kernel) -> None:
    lightning_kernel.ok(
        "%%memwatch -q\n"
        "callback = MemwatchCallback()\n"
        "make_trainer(max_epochs=2, callbacks=[callback]).fit(LitRegressor(), train)\n", timeout_s=180,
    )
    assert lightning_kernel.value("[callback.report is None, torchmem_magic.last_report().steps]") == [True, 200]


TRANSFORMERS_TRAINER = (
    "from torchmem_magic.integrations.transformers import MemwatchCallback\n"
    "class Failing(transformers.Trainer):\n"
    "    def compute_loss(self, model, inputs, **kwargs):\n"
    "        if self.state.global_step == 30:\n"
    "            raise RuntimeError('a bad batch')\n"
    "        return super().compute_loss(model, inputs, **kwargs)\n"
    "data = [{'input_ids': torch.randint(0, 100, (32,)), 'labels': torch.randint(0, 100, (32,))} for _ in range(400)]\n"
)


def _failing_run(out: Path) -> str:
    """A cell that trains a `Failing` Trainer with the callback, writing under `out`."""
    return (
        f"args = transformers.TrainingArguments({str(out)!r}, per_device_train_batch_size=8, report_to=[],\n"
        "                                      save_strategy='no', use_cpu=True, disable_tqdm=True)\n"
        "callback = MemwatchCallback()\n"
        "trainer = Failing(model=tiny_gpt2(), args=args, train_dataset=data, callbacks=[callback])\n"
        "trainer.train()\n"
    )


def test_a_transformers_run_that_raises_ends_its_session_with_the_cell(fresh_kernel: Kernel, tmp_path: Path) -> None:
    """The Trainer calls no hook when its run fails: the cell's end stops the session, shows the report and puts
    the Trainer's `log` back; the cell's own error is the one shown."""
    fresh_kernel.ok(SETUP + FRAMEWORK_SETUP["transformers"] + TRANSFORMERS_TRAINER)
    execution = fresh_kernel.execute(_failing_run(tmp_path), timeout_s=180)
    assert execution.error is not None and execution.error["evalue"] == "a bad batch"
    shown = [m["content"]["data"] for m in execution.of_type("display_data")]
    assert any(embedded_figure(data.get("text/html", "")) and "stopped by RuntimeError: a bad batch" in
               data.get("text/plain", "") for data in shown), shown  # the report, with its static figure
    state = fresh_kernel.value(
        "[torchmem_magic.session.run.active_session() is None, callback.report.steps, callback.report.status,"
        " 'log' in vars(trainer)]"
    )
    assert state == [True, 30, "error", False], state


def test_a_transformers_run_that_raises_inside_a_memwatch_cell_leaves_the_trainer_as_it_was(
    fresh_kernel: Kernel, tmp_path: Path,
) -> None:
    """Inside a `%%memwatch` cell the cell's session reports; the callback's wrap of the Trainer's `log` still
    goes when the failed run's cell ends."""
    fresh_kernel.ok(SETUP + FRAMEWORK_SETUP["transformers"] + TRANSFORMERS_TRAINER)
    execution = fresh_kernel.execute("%%memwatch -q\n" + _failing_run(tmp_path), timeout_s=180)
    assert execution.error is not None and execution.error["evalue"] == "a bad batch"
    state = fresh_kernel.value(
        "[torchmem_magic.session.run.active_session() is None, callback.report is None,"
        " torchmem_magic.last_report().steps, 'log' in vars(trainer)]"
    )
    assert state == [True, True, 30, False], state


def test_a_notebook_launched_ddp_run_reports_every_rank_under_the_cell(lightning_kernel: Kernel) -> None:
    """`strategy="ddp_notebook"` forks the ranks from the kernel; rank 0's report, with rank 1's leak in it,
    shows under the cell, and `callback.report` has it in the notebook once `fit` returned."""
    execution = lightning_kernel.ok(
        "class RankOneLeaks(LitRegressor):\n"
        "    def on_train_batch_end(self, outputs, batch, batch_idx):\n"
        "        if self.global_rank == 0:\n"
        "            self.train_outputs.clear()\n"
        "model = RankOneLeaks(); callback = MemwatchCallback()\n"
        "make_trainer(max_epochs=3, devices=2, strategy='ddp_notebook', callbacks=[callback]).fit(model, train)\n",
        timeout_s=240,
    )
    said = "".join(m["content"].get("text", "") for m in execution.of_type("stream"))
    said += "".join(m["content"]["data"].get("text/plain", "") for m in execution.of_type("display_data"))
    assert "verdict: leak (worst rank: 1)" in said and said.count("memwatch:") == 1, said[-3000:]
    report = lightning_kernel.value(
        "(lambda r: [r.worst_rank, [k.rank for k in r.ranks], r.suspects[0].rank, r.suspects[0].path])(callback.report)")
    assert report[:3] == [1, [0, 1], 1] and report[3].startswith("model.train_outputs"), report

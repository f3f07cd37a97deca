"""The live figure's widget state (what the comm messages carry), driven by a real session."""

import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchmem_magic import MemwatchSession
from torchmem_magic.widgets.live import MAX_POINTS, LiveFigure
from torchmem_magic.timeline import COLUMNS, Timeline
from torchmem_magic.options import SessionOptions
from torchmem_magic.leak_finder import LeakSearch

from idle_views import idle_view


def _run(figure: LiveFigure, epochs: int = 2) -> MemwatchSession:
    loader = DataLoader(TensorDataset(torch.randn(16, 8)), batch_size=4)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = MemwatchSession(SessionOptions(10), listener=figure)
    with session:
        for _ in range(epochs):
            for (x,) in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
                time.sleep(0.15)
    return session


def test_figure_updates_live_and_shows_measured_curves_only() -> None:
    figure = LiveFigure()
    session = _run(figure)
    assert figure.updates >= 3  # 1.2 s of training at <= 4 updates/s, plus the final draw
    labels = list(figure.lines.labels)
    assert labels[0] == "RAM (process tree)" and "heap in use" in labels
    assert "RSS (kernel)" not in labels  # no child processes: it would only duplicate the RAM curve
    assert not any(label.startswith("VRAM") for label in labels)  # no CUDA: no fake zero curve
    y = np.asarray(figure.lines.y)
    assert y.shape == (len(labels), len(figure.lines.x)) and np.all(y[0] > 10)  # MiB
    assert figure.y_axis.label == "MiB" and figure.y_scale.max > np.nanmax(y)  # headroom for the legend
    assert figure.status.value.replace("&nbsp;", " ").startswith("<code>ok · step 8 · ")
    assert list(figure.epoch_lines.x[:, 0]) == [m.t_s for m in session.timeline.epochs]
    assert figure.epoch_lines.visible


def test_toggle_to_steps_redraws_against_optimizer_steps() -> None:
    figure = LiveFigure()
    _run(figure)
    figure.x_toggle.value = "steps"
    assert figure.x_axis.label == "optimizer step"
    assert list(figure.lines.x) == [float(s) for s in range(1, 9)]
    assert list(figure.epoch_lines.x[:, 0]) == [0.0, 4.0]


def test_payload_stays_bounded_for_a_long_run() -> None:
    figure = LiveFigure()
    timeline = Timeline()
    row = dict.fromkeys(COLUMNS, 1e9)
    for i in range(200_000):  # ~5.5 h at 100 ms
        row["t_s"] = i * 0.1
        timeline.by_time.append(row)
    figure.x_toggle.value = "time"
    figure._draw(idle_view(timeline), final=False)
    assert len(figure.lines.x) <= MAX_POINTS and np.asarray(figure.lines.y).shape[1] == len(figure.lines.x)


def test_status_line_shows_the_verdict_as_it_forms() -> None:
    figure = LiveFigure()
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    seen = []
    with MemwatchSession(SessionOptions(10), listener=figure):
        for step in range(90):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            kept.append(torch.ones(1 << 18))  # 1 MiB a step
            time.sleep(0.01)
            if step in (20, 89):
                seen.append(figure.status.value.replace("&nbsp;", " "))
    assert "verdict so far" not in seen[0]  # before step 30: no verdict yet
    assert "verdict so far: leak: per-iteration in heap" in seen[1]  # while the loop still runs
    assert "verdict so far: leak: per-iteration in heap" in figure.status.value.replace("&nbsp;", " ")


def test_status_line_names_the_growing_holder_while_the_loop_runs() -> None:
    import torchmem_magic.api

    figure = LiveFigure()
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    namespace = {"outputs": []}  # the holder, where the leak finder looks
    session = MemwatchSession(SessionOptions(10), search=LeakSearch(lambda: torchmem_magic.api._module_roots(namespace)), listener=figure)
    seen = []
    with session:
        for step in range(120):
            optimizer.zero_grad()
            model(torch.randn(4, 64)).sum().backward()
            optimizer.step()
            namespace["outputs"].append(model(torch.randn(1024, 64)))  # ~0.5 MiB of graph a step
            time.sleep(0.01)
            if step == 100:
                seen.append(figure.status.value.replace("&nbsp;", " "))
    assert "growing: outputs +" in seen[0] and "/step, autograd graphs" in seen[0]  # named while it ran
    report = session.report
    assert report is not None and report.live_suspects_at_step is not None and report.live_suspects_at_step <= 50
    assert report.suspects[0].name == "outputs" and len(report.suspects[0].series) >= 4

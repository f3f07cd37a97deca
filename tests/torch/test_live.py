"""The live figure's widget state (what the comm messages carry), driven by a real session."""

import math
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchmem_magic import MemwatchSession
from torchmem_magic.widgets.live import MAX_POINTS, LiveFigure
from torchmem_magic.core.timeline import COLUMNS, Timeline
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.finder.leak_finder import LeakSearch
from torchmem_magic.core.model import LiveStatus
from torchmem_magic.session.live_view import LiveSnapshot

from idle_views import idle_view

MIB = float(1 << 20)


def _run(figure: LiveFigure, epochs: int = 2, live_updates: int = 0) -> MemwatchSession:
    """`epochs` of 4 steps of 0.15 s each; with `live_updates`, more epochs until the figure has been
    redrawn that many times while the loop ran (a redraw's cost sets how often it comes)."""
    loader = DataLoader(TensorDataset(torch.randn(16, 8)), batch_size=4)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = MemwatchSession(SessionOptions(10), listener=figure)
    with session:
        deadline_s = time.monotonic() + 60
        done = 0
        while done < epochs or (figure.updates < live_updates and time.monotonic() < deadline_s):
            done += 1
            for (x,) in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
                time.sleep(0.15)
    return session


def test_figure_updates_live_and_shows_measured_curves_only() -> None:
    figure = LiveFigure()
    session = _run(figure, live_updates=2)
    assert figure.updates >= 3  # two while the loop ran, plus the final draw
    labels = figure.labels
    assert labels[0] == "RAM (process tree)" and "heap in use" in labels
    assert "RSS (kernel)" not in labels  # no child processes: it would only duplicate the RAM curve
    assert not any(label.startswith("VRAM") for label in labels)  # no CUDA: no fake zero curve
    ram = figure.shown[0]  # a strip per resource, each on its own y axis
    y = np.atleast_2d(ram.lines.y)  # one curve: bqplot keeps it as one row
    assert y.shape == (1, len(ram.lines.x)) and np.all(y[0] > 10)  # MiB
    assert ram.y_axis.label == "MiB" and 0 < ram.y_scale.min < np.nanmin(y) and ram.y_scale.max > np.nanmax(y)
    steps = session.step_counter.steps
    assert steps % 4 == 0 and figure.status.value.replace("&nbsp;", " ").startswith(f"<code>ok · step {steps} · ")
    for strip in figure.shown:
        assert list(strip.epoch_lines.x[:, 0]) == [m.t_s for m in session.timeline.epochs]
        assert strip.epoch_lines.visible and strip.epoch_lines in strip.figure.marks
    assert [s.x_axis.label for s in figure.shown] == [""] * (len(figure.shown) - 1) + ["time (s)"]


def test_toggle_to_steps_redraws_against_optimizer_steps() -> None:
    figure = LiveFigure()
    _run(figure)
    figure.x_toggle.value = "steps"
    assert figure.shown[-1].x_axis.label == "optimizer step"
    assert list(figure.shown[0].lines.x) == [*(float(s) for s in range(1, 9)), 8.0]  # and the reading after the block
    assert list(figure.shown[0].epoch_lines.x[:, 0]) == [0.0, 4.0]


def test_a_strip_makes_its_epoch_lines_at_the_first_epoch_and_a_new_strip_comes_placed() -> None:
    """What a cell without epochs never needs is never made; the first epoch makes it, on the figure."""
    figure = LiveFigure()
    timeline = _leaking_heap(2)
    figure.draw(idle_view(timeline).snapshot())
    ram, heap = figure.shown
    for strip in (ram, heap):
        assert strip.epoch_lines is None and strip.guard_lines is None and strip.figure.marks == [strip.lines]
    assert heap.figure.layout is ram.figure.layout and ram.figure.layout.height == "190px"  # one layout, two strips
    assert (ram.x_axis.label, heap.x_axis.label) == ("", "time (s)")  # the new bottom strip came with the label
    assert heap.figure.fig_margin["bottom"] > ram.figure.fig_margin["bottom"]
    timeline.add_pass(1.0, 7, (0, 0, 0, 0))
    figure.draw(idle_view(timeline).snapshot())
    for strip in (ram, heap):
        assert strip.epoch_lines is not None and strip.epoch_lines.visible
        assert strip.figure.marks == [strip.lines, strip.epoch_lines]  # under nothing but the curves' own
        # one line: bqplot keeps it as one row
        assert np.atleast_2d(strip.epoch_lines.x).tolist() == [[1.0, 1.0]]
        assert np.atleast_2d(strip.epoch_lines.y).tolist() == [[0.0, 1.0]]


def test_figures_share_what_never_changes_and_nothing_they_change() -> None:
    first, second = LiveFigure(), LiveFigure()
    assert first.marker_scale is second.marker_scale and first.widget.layout is second.widget.layout
    assert first.controls.gc_button.layout is second.controls.gc_button.layout
    assert first.status.style is second.status.style
    assert first.x_scale is not second.x_scale and first.strip_layout is not second.strip_layout  # both change
    first.marker_scale.close()
    assert LiveFigure().marker_scale is not first.marker_scale  # a closed one is made again


def test_payload_stays_bounded_for_a_long_run() -> None:
    figure = LiveFigure()
    timeline = Timeline()
    row = dict.fromkeys(COLUMNS, 1e9)
    for i in range(200_000):  # ~5.5 h at 100 ms
        row["t_s"] = i * 0.1
        timeline.by_time.append(row)
    figure.x_toggle.value = "time"
    figure.draw(idle_view(timeline).snapshot())
    for strip in figure.shown:
        assert len(strip.lines.x) <= MAX_POINTS and np.atleast_2d(strip.lines.y).shape[1] == len(strip.lines.x)


def test_a_run_cut_short_after_its_first_reading_draws_no_curve_and_does_not_fail() -> None:
    """Seen in the fault campaign: a Ctrl-C in the session's start left one reading, and the final draw
    raised bqplot's TraitError over the report."""
    figure = LiveFigure()
    timeline = Timeline()
    timeline.by_time.append({**dict.fromkeys(COLUMNS, 1e9), "t_s": 0.0})
    figure.draw(idle_view(timeline).snapshot())
    assert all(len(strip.lines.x) == 0 for strip in figure.shown)
    timeline.by_time.append({**dict.fromkeys(COLUMNS, 1.1e9), "t_s": 0.1})
    figure.draw(idle_view(timeline).snapshot())
    assert figure.shown and all(len(strip.lines.x) == 2 for strip in figure.shown)


def _leaking_heap(seconds: int, heap_mib_per_s: float = 10.0) -> Timeline:
    """A synthetic run: the tree's RAM flat at 400 MiB, the heap climbing from 150 MiB."""
    timeline = Timeline()
    row = dict.fromkeys(COLUMNS, math.nan)
    for i in range(seconds * 10):
        row.update(t_s=i * 0.1, ram_bytes=400 * MIB + (i % 3) * 4096, heap_bytes=(150 + i * 0.1 * heap_mib_per_s) * MIB)
        timeline.by_time.append(row)
    return timeline


def _fill(strip: Any) -> float:
    """The share of the strip's height its curve's readings span."""
    y = np.asarray(strip.lines.y)
    return float((np.nanmax(y) - np.nanmin(y)) / (strip.y_scale.max - strip.y_scale.min))


def test_each_strip_is_scaled_to_its_own_curve_so_a_leak_is_a_slope_and_flat_stays_flat() -> None:
    figure = LiveFigure()
    figure.draw(idle_view(_leaking_heap(4)).snapshot())  # heap 150 -> 190 MiB, RAM flat
    ram, heap = figure.strips["ram_bytes"], figure.strips["heap_bytes"]
    assert figure.shown == [ram, heap] and figure.labels == ["RAM (process tree)", "heap in use"]
    assert _fill(heap) > 0.6 and heap.y_scale.min > 100  # not from zero
    assert _fill(ram) < 0.05  # 8 KiB of wobble on 400 MiB: drawn flat
    assert ram.figure.title == "RAM (process tree)" and heap.figure.title == "heap in use"


def test_the_figure_draws_the_snapshot_it_is_given_and_judges_nothing() -> None:
    """A flat run drawn with a status that says it leaks: the figure shows what it was given (the
    verdict, the guard's line, the epochs), computed nowhere but in the snapshot."""
    timeline = Timeline()
    for i in range(30):
        timeline.by_time.append({**dict.fromkeys(COLUMNS, math.nan), "t_s": i * 0.1, "ram_bytes": 400 * MIB})
    nan = math.nan
    status = LiveStatus(3.0, 30, 2, 400 * MIB, nan, nan, nan, nan, 0, 0.0, None, None, verdict="leak: given, not judged")
    snapshot = LiveSnapshot(status=status, timeline=timeline, clock="optimizer", epoch_markers=((0.0, 0.0), (1.5, 15.0)),
                            guard_thresholds=(("ram_bytes", 420 * MIB, "guard 90%"),))
    figure = LiveFigure()
    figure.draw(snapshot)
    assert "leak:&nbsp;given,&nbsp;not&nbsp;judged" in figure.status.value
    ram = figure.shown[0]
    assert list(ram.epoch_lines.x[:, 0]) == [0.0, 1.5]
    assert ram.guard_lines is not None and 420.0 in np.asarray(ram.guard_lines.y).ravel()


def test_a_growing_curve_rescales_its_axis_in_steps_not_at_every_redraw() -> None:
    figure = LiveFigure()
    ranges = []
    for seconds in range(2, 42):  # one redraw a second while the heap climbs 10 MiB/s
        figure.draw(idle_view(_leaking_heap(seconds)).snapshot())
        heap = figure.strips["heap_bytes"]
        ranges.append((heap.y_scale.min, heap.y_scale.max))
        assert _fill(heap) > 0.6, (seconds, ranges[-1])
    assert len(set(ranges)) < len(ranges) / 3
    assert len({low for low, _ in ranges}) == 1  # the bottom stays where the curve started


def test_status_line_shows_the_verdict_as_it_forms() -> None:
    figure = LiveFigure()
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    seen = []  # (step, the status line) at each redraw seen while the loop runs
    deadline_s = time.monotonic() + 60
    with MemwatchSession(SessionOptions(10), listener=figure):
        step = 0
        # until the status line gives a verdict, which redraws (as often as their cost allows) bring
        while not (seen and "verdict so far" in seen[-1][1]) and time.monotonic() < deadline_s:
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            kept.append(torch.ones(1 << 18))  # 1 MiB a step
            time.sleep(0.01)
            step += 1
            status = figure.status.value.replace("&nbsp;", " ")
            if not seen or status != seen[-1][1]:
                seen.append((step, status))
    early = [status for at, status in seen if at <= 20]
    assert early and not any("verdict so far" in status for status in early)  # the first steps: no verdict yet
    assert "verdict so far: leak: per-iteration in heap" in seen[-1][1], seen[-1]  # while the loop still runs
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

"""The live figure redrawn from the thread its route names, driven by a real session."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from torchmem_magic import MemwatchSession
from torchmem_magic.widgets.live_route import LiveRoute
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.widgets import update_route
from torchmem_magic.widgets.live import LiveFigure
from torchmem_magic.widgets.update_route import RoutedUpdates

ON_STEPS = LiveRoute("training thread", "forced for the test")
SAMPLER = LiveRoute("sampler", "forced for the test")


def _recording(figure: LiveFigure) -> list[str]:
    """The names of the threads that redraw `figure` while its run goes on, in order."""
    threads: list[str] = []
    on_tick = figure.on_tick

    def recorded(view: Any) -> None:
        threads.append(threading.current_thread().name)
        on_tick(view)

    figure.on_tick = recorded  # type: ignore[method-assign]
    return threads


def _train_until(session: MemwatchSession, done: Any, max_s: float = 60.0) -> None:
    """Optimizer steps on this thread until `done()` (or the deadline: then the test's asserts fail)."""
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    deadline_s = time.monotonic() + max_s
    with session:
        while not done() and time.monotonic() < deadline_s:
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            time.sleep(0.005)


def test_on_the_training_thread_route_the_redraws_run_at_steps_on_that_thread() -> None:
    figure = LiveFigure()
    session = MemwatchSession(SessionOptions(10))
    routed = session.listener = RoutedUpdates(figure, session.requests, ON_STEPS)
    threads = _recording(figure)
    _train_until(session, lambda: routed.counts.training_thread >= 3)
    assert routed.counts.training_thread >= 3
    # after the first step every redraw ran on this (the training) thread; before it the sampler's, best effort
    first_here = threads.index(threading.current_thread().name)
    assert set(threads[first_here:]) == {threading.current_thread().name}, threads
    assert routed.counts.sampler == first_here
    # a redraw's cost on the training thread went back to the sampler, whose tick period it spaces
    assert session._sampler is not None and session._sampler._on_tick_cpu_s is not None
    assert update_route.last_counts is routed.counts and routed.counts.route == "training thread"
    assert "ok" in figure.status.value and "step" in figure.status.value  # the final draw


def test_sampler_redraws_before_the_first_step_are_sent_again_in_full_from_the_training_thread() -> None:
    figure = LiveFigure()
    session = MemwatchSession(SessionOptions(10))
    routed = session.listener = RoutedUpdates(figure, session.requests, ON_STEPS)
    sent: list[str] = []
    original = type(figure.status).send_state

    def send_state(widget: Any, key: Any = None) -> None:
        if widget is figure.status and key is None:  # a full re-send (a trait change names its key)
            sent.append(threading.current_thread().name)
        original(widget, key)

    type(figure.status).send_state = send_state  # type: ignore[method-assign]
    try:
        with session:
            deadline_s = time.monotonic() + 60
            while routed.counts.sampler < 1 and time.monotonic() < deadline_s:
                time.sleep(0.01)  # no step yet: the sampler redraws itself
            model = torch.nn.Linear(8, 8)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            while routed.counts.training_thread < 1 and time.monotonic() < deadline_s:
                optimizer.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()
                time.sleep(0.005)
            resent_mid_run = routed.counts.resent  # before the final draw's
    finally:
        type(figure.status).send_state = original  # type: ignore[method-assign]
    assert routed.counts.sampler >= 1 and routed.counts.training_thread >= 1
    assert resent_mid_run == 1 and sent and sent[0] == threading.current_thread().name


def test_a_run_without_steps_is_redrawn_by_the_sampler_on_either_route() -> None:
    for route in (ON_STEPS, SAMPLER):
        figure = LiveFigure()
        session = MemwatchSession(SessionOptions(10))
        routed = session.listener = RoutedUpdates(figure, session.requests, route)
        with session:
            deadline_s = time.monotonic() + 60
            while routed.counts.sampler < 2 and time.monotonic() < deadline_s:
                time.sleep(0.01)
        assert routed.counts.sampler >= 2 and routed.counts.training_thread == 0, route


def test_on_the_sampler_route_no_redraw_waits_for_a_step() -> None:
    figure = LiveFigure()
    session = MemwatchSession(SessionOptions(10))
    routed = session.listener = RoutedUpdates(figure, session.requests, SAMPLER)
    threads = _recording(figure)
    _train_until(session, lambda: routed.counts.sampler >= 3)
    assert routed.counts.sampler >= 3 and routed.counts.training_thread == 0
    assert threading.current_thread().name not in threads

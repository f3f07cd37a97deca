"""The parts that follow a user's object or frame without keeping it: a root a search back found
(`LooseRoot`), a frame whose return ends a run (`RunningFrame`), and what ended a run (`Ended`)."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import torch

from torchmem_magic.core.ended import ended_by
from torchmem_magic.finder.scan.results import LooseRoot, Root
from torchmem_magic.tracing.frames import RunningFrame, outermost_frame_of


def test_a_found_tensor_is_followed_weakly_and_a_found_list_until_the_user_drops_it() -> None:
    tensor = torch.zeros(1024)
    seen = weakref.ref(tensor)
    loose = LooseRoot(Root("cache", "user", "cache", tensor))
    found = loose.root()
    assert found is not None and found.obj is tensor
    del tensor, found
    gc.collect()
    assert seen() is None and loose.root() is None
    items = [torch.zeros(1024)]
    held = LooseRoot(Root("items", "user", "items", items))
    assert held.root() is not None  # the user still holds it
    first = weakref.ref(items[0])
    del items
    assert held.root() is None  # only we held it: let go
    gc.collect()
    assert first() is None


def test_a_running_frame_is_told_from_one_that_returned_without_being_kept() -> None:
    big = torch.zeros(1 << 20)
    seen = weakref.ref(big)
    watched: list[RunningFrame] = []
    running_inside: list[bool] = []

    def train(local: torch.Tensor) -> None:  # the frame's local is what must not be kept
        watched.append(RunningFrame(sys._getframe()))
        running_inside.append(watched[0].running())

    train(big)
    del big
    gc.collect()
    assert running_inside == [True] and not watched[0].running() and seen() is None


def test_a_frame_on_another_thread_is_looked_for_on_that_threads_stack() -> None:
    started, release = threading.Event(), threading.Event()
    watched: list[RunningFrame] = []

    def work() -> None:
        watched.append(RunningFrame(sys._getframe()))
        started.set()
        release.wait(10)

    thread = threading.Thread(target=work)
    thread.start()
    started.wait(10)
    assert watched[0].running()
    release.set()
    thread.join()
    assert not watched[0].running()


def test_the_entry_into_a_library_is_its_outermost_frame_before_the_callers() -> None:
    import json.decoder

    frames: list[str] = []

    def hook(obj: dict[str, object]) -> dict[str, object]:
        entry = outermost_frame_of("json", sys._getframe(1))
        frames.append("" if entry is None else entry.f_code.co_name)
        return obj

    json.loads("{}", object_hook=hook)
    assert frames == ["loads"] and json.decoder is not None


def test_what_ended_a_run_is_data_that_keeps_no_frame() -> None:
    big = torch.zeros(1 << 20)
    seen = weakref.ref(big)

    def train(kept: torch.Tensor) -> None:
        raise ValueError(f"bad batch {kept.numel()}")

    try:
        train(big)
    except ValueError as exc:
        ended = ended_by(exc)
    del big
    gc.collect()
    assert seen() is None
    assert ended is not None and ended.line() == "ValueError: bad batch 1048576" and not ended.interrupted
    assert "train" in ended.frames[-1] and "raise ValueError" in ended.frames[-1]
    assert ended_by(KeyboardInterrupt()) is not None and ended_by(KeyboardInterrupt()).interrupted  # type: ignore[union-attr]

    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert ended_by(Hostile()) == ended_by(Hostile())
    assert ended_by(Hostile()).message == ""  # type: ignore[union-attr]

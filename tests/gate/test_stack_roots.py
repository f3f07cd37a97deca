"""Where the script API and the gate look for holders: the locals of the user's functions on the stack."""

from __future__ import annotations

import sys
import weakref

import torch

from torchmem_magic.finder.stack_roots import StackSources, frame_roots


def _helper(known: StackSources) -> list[str]:
    history = [torch.ones(2)]
    names = [root.name for root in frame_roots(sys._getframe(), known)]
    del history
    return names


def test_locals_innermost_first_and_an_outer_name_shadowed() -> None:
    history = "the outer one"
    sources = StackSources([])
    names = _helper(sources)
    assert names == ["known", "history", "sources"]  # the helper's own, then this test's not shadowed
    assert history == "the outer one"
    assert sources.sources[0].startswith("def _helper(known")  # the innermost function's code comes first
    assert sources.sources[1].startswith("def test_locals_innermost_first")


def test_reading_a_functions_locals_keeps_no_copy_of_them() -> None:
    value = torch.ones(4)
    ref = weakref.ref(value)
    roots = frame_roots(sys._getframe())
    assert [r.name for r in roots].count("value") == 1
    del roots, value
    assert ref() is None  # before Python 3.13 the frame's locals snapshot would still hold it

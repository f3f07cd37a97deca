"""`assert_no_leak` in-process: a leaking loop fails with its holder and fix, a clean one passes,
the block's own exception wins, and nothing is left running either way."""

from __future__ import annotations

import dataclasses
import gc
import pickle
import threading

import pytest
from gate_loops import STEPS, make_model, metric, train_keeping_graphs, train_returning_metrics, train_step

import torchmem_magic
from torchmem_magic import LeakError, assert_no_leak, memwatch
from torchmem_magic.frontends.gate import LeakGate, leak_message
from torchmem_magic.tracing.hooks import installed_hook_count
from torchmem_magic.tracing.sampler import THREAD_NAME
from torchmem_magic.session.run import active_session


def _nothing_left_behind() -> None:
    assert installed_hook_count() == 0
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]
    assert active_session() is None


def test_the_package_under_test_is_this_checkout() -> None:
    import pathlib

    assert pathlib.Path(torchmem_magic.__file__).parent == pathlib.Path(__file__).parents[2] / "torchmem_magic"


@pytest.fixture(scope="module")
def leak_error() -> LeakError:
    """One gated run of a loop that keeps each step's metric with its graph in the test's local list."""
    model, optimizer = make_model()
    history = []
    with pytest.raises(LeakError) as caught:
        with assert_no_leak(20, quiet=True):
            for _ in range(STEPS):
                train_step(model, optimizer)
                history.append(metric(model))
    _nothing_left_behind()
    return caught.value


def test_a_leak_in_a_local_of_the_test_fails_with_the_holder_and_its_fix(leak_error: LeakError) -> None:
    assert isinstance(leak_error, AssertionError)
    assert leak_error.report.verdict == "leak"
    lines = str(leak_error).splitlines()
    assert lines[0].startswith("memwatch verdict: leak over 200 steps — ")
    assert lines[0].endswith(leak_error.report.advice[0])
    assert lines[1].startswith("top holder: history ") and "autograd-graph" in lines[1]  # (+growth when scans saw it grow)
    assert lines[2] == f"fix: {leak_error.report.suspects[0].fix}" and "torch.no_grad()" in lines[2]
    assert "history.append(metric(model))" in lines[2]  # found in the function that fills it


def test_the_leak_errors_report_lists_its_holders_largest_first() -> None:
    """`few` and `every_other` are locals before `history`, so the scan meets them first; the report still
    puts the bigger holders first, and the message names the fastest-growing one. (`few`, filled once
    before the loop, is dropped as flat when enough scans measured it, which a busy machine may not allow.)"""
    model, optimizer = make_model()
    few = [metric(model) for _ in range(3)]
    every_other = []
    history = []
    with pytest.raises(LeakError) as caught:
        with assert_no_leak(20, quiet=True):
            for step in range(STEPS):
                train_step(model, optimizer)
                history.append(metric(model))
                if step % 2:
                    every_other.append(metric(model))
    _nothing_left_behind()
    suspects = [(s.name, s.retained_bytes) for s in caught.value.report.suspects]
    assert [name for name, _ in suspects][:2] == ["history", "every_other"], suspects
    assert [size for _, size in suspects] == sorted((size for _, size in suspects), reverse=True), suspects
    assert "\ntop holder: history " in str(caught.value) and len(few) == 3


def test_a_leak_in_a_helpers_local_is_named_though_the_helper_returned() -> None:
    with pytest.raises(LeakError) as caught:
        with assert_no_leak(20, quiet=True):
            train_keeping_graphs()
    _nothing_left_behind()
    assert "\ntop holder: kept_metrics " in str(caught.value)
    assert "kept_metrics.append(metric(model))" in str(caught.value)  # the helper's file was read too


def test_the_script_api_names_a_helpers_local_too() -> None:
    with memwatch(20, quiet=True) as w:
        train_keeping_graphs()
    report = w.report
    assert report is not None and [s.name for s in report.suspects][:1] == ["kept_metrics"]
    # judged on the heap over the steps, although the reading after the block, with the helper returned,
    # finds the list freed: that fall is said, not taken for the end of the growth
    assert (report.verdict, report.leak_kind, report.resource) == ("leak", "per-iteration", "heap"), report.advice
    assert report.heap is not None and report.heap.end_bytes < report.heap.peak_bytes
    assert any("of it came back when the block ended" in line for line in report.advice), report.advice


def test_a_helpers_local_returned_to_the_caller_keeps_its_growth_under_the_callers_name() -> None:
    with memwatch(20, quiet=True) as w:
        history = train_returning_metrics()
    assert w.report is not None and w.report.suspects, w.report
    top = w.report.suspects[0]
    assert top.name == "history" and len(history) == STEPS, w.report.suspects
    # the series the scans during the run measured under `kept_metrics` goes on under `history`
    assert top.growth_per_step is not None and top.growth_per_step > 0 and top.series, top
    assert all(s.name != "kept_metrics" for s in w.report.suspects), w.report.suspects


def test_a_clean_loop_passes() -> None:
    model, optimizer = make_model()
    history = []
    with assert_no_leak(20, quiet=True) as w:
        for _ in range(STEPS):
            train_step(model, optimizer)
            history.append(metric(model).item())
    _nothing_left_behind()
    assert w.report is not None and w.report.verdict != "leak"
    assert w.report.steps == STEPS


def test_the_blocks_exception_propagates_unchanged() -> None:
    model, optimizer = make_model()
    history = []
    failure = ValueError("the loop's own failure")
    with pytest.raises(ValueError) as caught:
        with assert_no_leak(20, quiet=True) as w:
            for _ in range(STEPS):
                train_step(model, optimizer)
                history.append(metric(model))  # leaks, but the block's error is what the test sees
            raise failure
    assert caught.value is failure
    _nothing_left_behind()
    assert w.report is not None and w.report.status == "error"


def test_a_failed_start_leaves_nothing_behind() -> None:
    with memwatch(quiet=True, scan=False):
        with pytest.raises(RuntimeError, match="only one memwatch session"):
            with assert_no_leak(quiet=True):
                pass
    _nothing_left_behind()


@pytest.mark.parametrize("fail_on", [(), ("clean",), ("leak", "oops")])
def test_fail_on_takes_only_verdicts_that_mean_trouble(fail_on: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="fail_on"):
        assert_no_leak(fail_on=fail_on)


def test_an_unknown_option_is_refused_where_the_gate_is_written() -> None:
    with pytest.raises(TypeError, match="unknown option intervall_ms; the options are device, guard, interval_ms"):
        LeakGate({}, intervall_ms=20)


def test_fail_on_suspect_fails_a_suspect_run_that_passes_by_default() -> None:
    # a handful of steps: too few for the curves, and the graphs new in the block make it "suspect"
    model, optimizer = make_model()
    history = []
    with assert_no_leak(quiet=True) as w:
        for _ in range(3):
            train_step(model, optimizer)
            history.append(metric(model))
    assert w.report is not None and w.report.verdict == "suspect"
    history.clear()
    with pytest.raises(LeakError, match="^memwatch verdict: suspect"):
        with assert_no_leak(quiet=True, fail_on="suspect"):
            for _ in range(3):
                train_step(model, optimizer)
                history.append(metric(model))
    _nothing_left_behind()


def test_the_message_without_a_named_holder_says_where_it_looked(leak_error: LeakError) -> None:
    report = dataclasses.replace(leak_error.report, suspects=())
    message = leak_message(report)
    assert message.splitlines()[1].startswith("top holder: none named (the leak finder looks at the locals")
    assert "fix:" not in message


def test_a_leak_error_survives_pickling_with_its_report(leak_error: LeakError) -> None:
    copy = pickle.loads(pickle.dumps(leak_error))
    assert isinstance(copy, LeakError) and f"{LeakError.__module__}.{LeakError.__name__}" == "torchmem_magic.LeakError"
    assert str(copy) == str(leak_error) and copy.report.verdict == "leak"


def test_what_the_end_of_the_block_released_is_seen_when_every_step_was_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    """30 steps all sampled: the reading after the block, with the helper returned, is a row of its own after
    the last step's, and the run's only fall. (The first 64 steps are all sampled while they cost under 20 ms together; on a heap that
    earlier tests churned, a heap read can cost ~1 ms, so the test lifts that limit to be sure of its premise.)"""
    import functools

    from torchmem_magic.core.step_sampling import StepSamplingPolicy

    monkeypatch.setattr(StepSamplingPolicy, "__init__", functools.partialmethod(StepSamplingPolicy.__init__, dense_cost_s=60.0))
    # earlier tests' cyclic garbage (caught exceptions' frames, with their loops' tensors) freed by a full
    # collection mid-run is a fall of megabytes before the end's: the release is then the loop's own pattern
    gc.collect()
    with memwatch(20, quiet=True) as w:
        train_keeping_graphs(30)
    report = w.report
    assert report is not None and report.steps == 30
    heap = list(report.timeline.by_step.column("heap_bytes"))
    steps = list(report.timeline.by_step.column("step"))
    assert steps[-2:] == [30.0, 30.0] and heap[-1] < heap[-2], (steps[-3:], heap[-3:])
    # a failure says what each resource was judged and which change hid the release (a string: not cut short)
    changes_kib = [round((b - a) / 1024) for a, b in zip(heap, heap[1:])]
    if not any("of it came back when the block ended" in line for line in report.advice):
        from torchmem_magic.report.assemble import diagnose

        again = diagnose(report.timeline, report.steps, report.wall_s, report.ram.limit_bytes, ends_after_block=True)
        judged = [(f.resource, f.verdict, f.leak_kind, f.warmup_steps, round(f.released_bytes)) for f in again.findings]
        pytest.fail(f"advice {report.advice}; judged again {judged}; steps {steps}; heap changes KiB {changes_kib}")

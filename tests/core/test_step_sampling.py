"""The step-sampling policy, driven with numbers: which steps get a step-aligned sample."""

from __future__ import annotations

import pytest

from torchmem_magic.core.step_sampling import StepSamplingPolicy


def run(policy: StepSamplingPolicy, steps: int, step_s: float, cost_s: float) -> list[int]:
    """Steps the policy samples when each step takes `step_s` and each sample costs `cost_s` of CPU."""
    sampled = []
    for step in range(1, steps + 1):
        if step >= policy.next_sampled_step:
            sampled.append(step)
            policy.sampled(step, started_s=step * step_s, cost_s=cost_s)
    return sampled


def test_slow_steps_are_all_sampled() -> None:
    assert run(StepSamplingPolicy(), 500, step_s=0.05, cost_s=5e-6) == list(range(1, 501))


def test_fast_steps_are_thinned_to_the_budget_after_a_dense_start() -> None:
    policy = StepSamplingPolicy()
    sampled = run(policy, 5000, step_s=200e-6, cost_s=10e-6)  # a sample is 5% of a step
    assert sampled[:63] == list(range(1, 64))  # the dense start: 63 x 10 µs is under its 20 ms
    assert policy.stride == 17  # ceil(10 µs / (0.3% x 200 µs))
    later = [b - a for a, b in zip(sampled, sampled[1:]) if a > 64]
    assert set(later) == {17}
    assert policy.dense_spent_s == pytest.approx(len(sampled) * 10e-6)


def test_an_expensive_dense_start_is_cut_short() -> None:
    policy = StepSamplingPolicy()
    sampled = run(policy, 64, step_s=1e-3, cost_s=5e-3)  # a churned heap: 5 ms a sample
    assert sampled[:4] == [1, 2, 3, 4] and 5 not in sampled  # the 4th reaches 20 ms: the dense start ends
    # then at most 5% of a 1 ms step (a stride of 100), but still twice each time the steps double
    assert sampled[4:] == [6, 9, 13, 19, 28, 42, 63] and policy.stride == 31


def test_a_short_loop_with_dear_samples_keeps_samples_to_its_end() -> None:
    """A churned heap: 2 ms a sample, 0.3 ms a step. The budget's stride would be over a thousand, and a
    400-step loop would keep no sample after its first few dozen steps (a cache it filled in its first
    hundred would read as growth to its end); at most half the steps so far between two, it keeps some."""
    sampled = run(StepSamplingPolicy(), 400, step_s=0.3e-3, cost_s=2e-3)
    assert [s for s in sampled if s > 104] == [109, 163, 244, 366]
    assert len(sampled) == 19  # the dense start's 10, and about two a doubling after it


def test_filing_cost_counts_against_the_budget_and_the_stride_is_capped() -> None:
    policy = StepSamplingPolicy(dense_steps=0)
    policy.filed(rows=10, cost_s=100e-6)  # 10 µs a row on the sampler thread
    run(policy, 200, step_s=100e-6, cost_s=1e-6)  # past step 74: half the steps so far is no limit
    assert policy.stride == 37  # ceil(11 µs / (0.3% x 100 µs))
    capped = StepSamplingPolicy(dense_steps=0)
    run(capped, 5000, step_s=1e-6, cost_s=1e-3)
    assert capped.stride == capped.max_stride


def test_the_next_step_can_be_forced_and_a_final_sample_is_remembered() -> None:
    policy = StepSamplingPolicy(stride=50)
    policy.sampled(1, 0.0, 0.0)
    policy.stride = 50
    policy.sample_next()
    assert 2 >= policy.next_sampled_step
    policy.mark_sampled(99)
    assert policy.last_sampled_step == 99


def test_the_guard_can_bring_the_next_sample_closer_but_never_push_it_away() -> None:
    policy = StepSamplingPolicy()
    run(policy, 1000, step_s=200e-6, cost_s=10e-6)
    assert policy.stride == 17
    policy.sampled(1001, started_s=1001 * 200e-6, cost_s=10e-6)
    policy.sample_within(3)  # the guard's next check at a step: 3 steps from now
    assert [step >= policy.next_sampled_step for step in range(1002, 1005)] == [False, False, True]
    policy.sampled(1004, started_s=1004 * 200e-6, cost_s=10e-6)
    policy.sample_within(100)  # further than the stride: the stride stands
    assert [step >= policy.next_sampled_step for step in range(1005, 1022)] == [False] * 16 + [True]

"""The verdict's own notes: the leak, when it runs out, and the growth the rules explain away."""

from __future__ import annotations

from collections.abc import Callable

from ...core.units import format_bytes, format_duration, plural_noun, singular_noun
from .phrases import rate, runs_out, steps_named

def _too_few_steps(needs: int, clock: str) -> str:
    steps_word = plural_noun(clock)
    return (f"too few {steps_word} for a verdict: needs at least {needs} sampled {steps_word}"
            if clock != "time" else f"too short for a verdict: needs at least {needs} samples")


def _leak_headline(leak_kind: str, resource: str, per_step_bytes: float, error_bytes: float | None,
                   per_epoch_bytes: float | None, sporadic_steps: tuple[tuple[int, int], ...], clock: str,
                   started_at_step: float | None = None) -> str:
    """'per-iteration leak in heap: 1.0 MiB/step ± 2 KiB', with a sporadic leak's steps, or where growth
    that began part-way began."""
    if per_epoch_bytes is not None:
        headline = f"{leak_kind} leak in {resource}: {format_bytes(per_epoch_bytes)} per epoch"
    else:
        headline = f"{leak_kind} leak in {resource}: {rate(per_step_bytes, clock)}" + (
            f" ± {format_bytes(error_bytes)}" if leak_kind == "per-iteration" and error_bytes is not None else ""
        )
    if sporadic_steps:
        headline += f", at {'seconds' if clock == 'time' else plural_noun(clock)} {steps_named(sporadic_steps)}"
    if started_at_step is not None:
        headline += f", since {singular_noun(clock)} {started_at_step:,.0f}"
    return headline


def _full_since(resource: str, full_at_step: float, per_step_bytes: float, clock: str) -> str:
    at = f"{singular_noun(clock)} {full_at_step:,.0f}"
    return f"it was at its limit from {at} on (it filled at {rate(per_step_bytes, clock)}), where {runs_out(resource)}"


def _runs_out_in(resource: str, per_step_bytes: float, steps: float, seconds: float | None, clock: str,
                 signed: bool = False) -> str:
    """'at 1.0 MiB/step this kernel is OOM-killed in ~2,000 steps (~5 min)'."""
    if clock == "time":
        when = f"~{format_duration(steps, rough=True)}"
    else:
        when = f"~{steps:,.0f} {plural_noun(clock)}" + (f" (~{format_duration(seconds, rough=True)})" if seconds else "")
    return f"at {rate(per_step_bytes, clock, signed)} {runs_out(resource)} in {when}"


def _released_at_end(released_bytes: float) -> str:
    return (
        f"{format_bytes(released_bytes)} of it came back when the block ended: what held it was freed "
        "after the loop or went out of scope (a list local to a function that returned); the loop itself "
        "grows it at this rate"
    )


def _caching_allocator() -> str:
    return (
        "CUDA reserved memory grows while allocated memory is flat: that is the caching allocator "
        "(or fragmentation), not a leak. torch.cuda.empty_cache() returns it; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation."
    )


def _copy_on_access(added_bytes: float, settled_bytes: float | None = None,
                    projected_bytes: float | None = None, first_pass_end: int | None = None) -> str:
    """Workers copying a dataset as they read it; where their memory stays, or will be by the first pass's end."""
    projection = ""
    if settled_bytes is not None:
        projection = f" The first pass is complete: the workers should stay near {format_bytes(settled_bytes)}."
    elif projected_bytes is not None:
        projection = (f" Projected: ~{format_bytes(projected_bytes)} for the workers by the end of the first pass "
                      f"(step {first_pass_end}).")
    return (
        f"DataLoader workers' memory grew by {format_bytes(added_bytes)} (by PSS) while "
        "the kernel's heap stayed nearly flat: workers copying a dataset of Python objects page by page as they read "
        "it (copy-on-access) grows until every worker has touched everything; numpy/torch arrays (or "
        "np.frombuffer / pyarrow for strings) avoid it. Where the dataset holds arrays already, the workers' "
        "garbage collector copied the pages of the notebook's other objects once: gc.freeze() just before "
        "the loop avoids that." + projection
    )


def _allocator_keeps_rss(heap_flat: bool) -> str:
    return (
        f"RSS grows while the heap in use {'is flat' if heap_flat else 'grew far less'}: "
        "not memory your objects hold, but freed memory the "
        "allocator keeps (fragmentation) or libraries and buffers loaded on first use. The first kind "
        "comes back with ctypes.CDLL('libc.so.6').malloc_trim(0) (the 'return heap to OS' button)."
    )


#: the wording of each note, by its key
#: what a pass of each phase does, in "it grows while ..."
_PHASE_VERBS = {"validation": "validating", "test": "testing", "evaluation": "evaluating", "predict": "predicting"}


def _grows_in_phase(phase: str, passes: int, grown_bytes: float, run_growth_bytes: float, resource: str) -> str:
    """'it grows while validating: 4.0 MiB a pass over 3 passes, 98% of what heap grew in the run ...'."""
    share = f", {min(grown_bytes / run_growth_bytes, 1.0):.0%} of what {resource} grew in the run" if run_growth_bytes > 0 else ""
    return (
        f"it grows while {_PHASE_VERBS.get(phase, f'in {phase}')}: {format_bytes(grown_bytes / passes)} a pass over "
        f"{passes} {'pass' if passes == 1 else 'passes'}{share}; look at what the {phase} step and its epoch's end "
        "keep (outputs appended and never cleared, a metric that holds every batch)"
    )


WORDS: dict[str, Callable[..., str]] = {
    "grows in phase": _grows_in_phase,
    "too few steps": _too_few_steps,
    "leak": _leak_headline,
    "full since": _full_since,
    "runs out in": _runs_out_in,
    "released at the end": _released_at_end,
    "caching allocator": _caching_allocator,
    "copy on access": _copy_on_access,
    "allocator keeps RSS": _allocator_keeps_rss,
}

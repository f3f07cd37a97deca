"""The scalars a logger gets: one per curve under its column's name, NaN left out, the leak rate once judged."""

import math

from torchmem_magic.report.scalars import GROWTH_TAG, memory_scalars


def test_each_curve_is_a_scalar_under_its_column_and_an_absent_source_is_left_out() -> None:
    reading = {"t_s": 3.0, "step": 40.0, "ram_bytes": 300.0, "heap_bytes": 100.0, "workers": 2.0,
               "vram_allocated_bytes": math.nan, "shm_used_bytes": 0.0}
    assert memory_scalars(reading, None, None) == {
        "memwatch/ram_bytes": 300.0, "memwatch/heap_bytes": 100.0, "memwatch/shm_used_bytes": 0.0,
    }


def test_the_growth_is_the_leak_rate_where_the_verdict_grows_and_zero_where_it_does_not() -> None:
    assert memory_scalars({}, "leak", 4096.0) == {GROWTH_TAG: 4096.0}
    assert memory_scalars({}, "suspect", 512.0) == {GROWTH_TAG: 512.0}
    assert memory_scalars({}, "clean", 512.0) == {GROWTH_TAG: 0.0}
    assert memory_scalars({}, "leak", None) == {}  # no rate known: no 0 that would read as none
    assert memory_scalars({}, "unknown", 512.0) == {}

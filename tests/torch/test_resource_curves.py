"""A row added to the table of resources reaches the live figure's curves and the guard's watched
resources without a change to either module."""

from __future__ import annotations

from test_resources import _run


def test_a_new_row_reaches_the_live_figure() -> None:
    result = _run("""
        from torchmem_magic.widgets import live
        print(json.dumps({"curves": [c for c, _, _ in live.CURVES], "launcher_hides": sorted(live.LAUNCHER_ONLY)}))
    """)
    assert result["curves"] == [
        "ram_bytes", "rss_bytes", "heap_bytes", "workers_bytes", "vram_allocated_bytes", "vram_reserved_bytes",
        "shm_used_bytes", "xpu_allocated_bytes",
    ]
    assert result["launcher_hides"] == ["heap_bytes", "rss_bytes"]


def test_a_guarded_row_reaches_the_guard() -> None:
    result = _run("""
        resources.RESOURCES = (*resources.RESOURCES[:-1], dataclasses.replace(resources.RESOURCES[-1], guard_name="XPU",
                               stopped_before="the XPU running out"))
        from torchmem_magic.tracing import guard
        from torchmem_magic.render.advice import guard as words
        print(json.dumps({"watched": [r.guard_name for r in guard._WATCHED], "at": words._STOPPED_BEFORE["XPU"]}))
    """)
    assert result == {"watched": ["RAM", "/dev/shm", "VRAM", "XPU"], "at": "the XPU running out"}

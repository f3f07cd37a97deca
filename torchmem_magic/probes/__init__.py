"""Readers of memory counters, one family a module, all behind the `Probe` protocol (`base.py`).

`process` (the kernel and its children: RSS, PSS, worker exits), `heap` (glibc heap in use), `shm`
(the shared-memory filesystem), `accelerator` (allocator stats of CUDA, MPS or another torch.accelerator device, through `backends`), `limits` (what the OOM
killer enforces, torch's sharing strategy), `oom_kills` (the OOM killer's counts), `exits` (when processes
that are not our children end), `nvml` (which processes hold memory on which GPU). None of them changes state, and nothing is imported
before a probe is first used.
"""

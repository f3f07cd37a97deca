from torchmem_magic.analysis import forensics
from torchmem_magic.analysis.forensics import WorkerDeath, parse_worker_death
from torchmem_magic.render.advice import advice_lines, worded


def explain_worker_death(*args: object) -> tuple[str, ...]:
    """The rule's notes, worded."""
    return advice_lines(forensics.explain_worker_death(*args))  # type: ignore[arg-type]

GIB = 1 << 30


def test_parses_pytorch_messages() -> None:
    assert parse_worker_death("DataLoader worker (pid 4242) is killed by signal: Killed. ") == WorkerDeath((4242,), "Killed")
    assert parse_worker_death("DataLoader worker (pid 7) is killed by signal: Bus error. It is possible") == WorkerDeath((7,), "Bus error")
    assert parse_worker_death("DataLoader worker (pid(s) 11, 12) exited unexpectedly") == WorkerDeath((11, 12), None)
    assert parse_worker_death("CUDA out of memory") is None


def test_full_shm_is_a_bus_error_with_its_fix() -> None:
    lines = explain_worker_death(WorkerDeath((1,), "Bus error"), 2 * GIB, 16 * GIB, 63 << 20, 64 << 20)
    assert "/dev/shm was 98% full" in lines[0] and "--shm-size" in lines[1]


def test_ram_at_the_limit_is_the_oom_killer() -> None:
    lines = explain_worker_death(WorkerDeath((1,), "Killed"), 15.5 * GIB, 16 * GIB, 0, 64 << 20, "cgroup v2")
    assert "97% of the cgroup v2 memory limit" in lines[0] and "OOM killer" in lines[0]


def test_neither_says_so() -> None:
    lines = explain_worker_death(WorkerDeath((1,), "Killed"), 2 * GIB, 16 * GIB, 0, 64 << 20)
    assert len(lines) == 1 and "neither memory nor /dev/shm" in lines[0] and "dmesg" in lines[0]


def test_shm_warning_before_it_fills() -> None:
    assert forensics.shm_warning(10 << 20, 64 << 20) is None
    warning = forensics.shm_warning(58 << 20, 64 << 20)
    text = None if warning is None else worded(warning)
    assert text is not None and "/dev/shm reached 91%" in text and "--shm-size" in text

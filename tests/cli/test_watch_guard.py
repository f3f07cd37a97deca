"""`watch --guard PCT`: every rank's loop is stopped at a step before RAM reaches that share of its
limit, and the report says which rank the guard stopped, where, and why.

The RAM limit is set for the run (TORCHMEM_MAGIC_RAM_LIMIT, 1 GiB) so that rank 1, keeping a 4 MiB
tensor a step, meets the guard's 60% within about a hundred steps while rank 0 stays far below it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from watching import SCRIPTS, environment, load, torchrun

from torchmem_magic.ranks.launch_env import watched_environment
from torchmem_magic.core.options import ENV_GUARD, MemwatchOptions
from torchmem_magic.probes.limits import RAM_LIMIT_VARIABLE

DDP = str(SCRIPTS / "ddp_leak.py")
MIB = 1 << 20


def test_the_guard_stops_the_leaking_rank_before_its_share_and_the_report_names_it(tmp: Path, tmp_path: Path) -> None:
    save = tmp_path / "run.json"
    env = {**environment(tmp), RAM_LIMIT_VARIABLE: "1GiB"}
    cmd = [sys.executable, "-m", "torchmem_magic", "watch", "--guard", "60%", "--status-every", "0", "--save", str(save),
           "--", *torchrun(), "--nproc-per-node", "2", DDP, "--leak-mib", "4", "--facts", str(tmp_path / "facts.json")]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]  # the guard's exception ended rank 1, and so the job
    ranks = {entry["rank"]: entry for entry in load(save)["ranks"]}
    stopped = ranks[1]
    assert stopped["status"] == "error" and stopped["ended"].startswith("MemoryGuardError: memwatch guard: RAM at ")
    assert stopped["ram"]["peak"] < 0.6 * 1024 * MIB  # stopped before the share, not after
    assert stopped["steps"] < 200 and stopped["ram"]["peak"] > 0.45 * 1024 * MIB  # and not long before it
    assert ranks[0]["verdict"] == "clean" and ranks[0]["ram"]["peak"] < 0.5 * 1024 * MIB
    line = re.search(r"rank 1 stopped at ([\d,]+) steps by MemoryGuardError: memwatch guard: RAM at .* would pass 60%",
                     result.stdout)
    assert line and int(line.group(1).replace(",", "")) == stopped["steps"], result.stdout
    assert "verdict: leak (worst rank: 1)" in result.stdout


def test_the_guard_reaches_the_commands_processes_only_when_asked() -> None:
    inherited = {ENV_GUARD: "0.5", "PATH": "/usr/bin"}
    assert watched_environment(inherited, "sink", MemwatchOptions(guard=0.9))[ENV_GUARD] == "0.9"
    assert ENV_GUARD not in watched_environment(inherited, "sink", MemwatchOptions())  # not a stale value from outside


def test_a_bad_guard_is_one_line(tmp: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "torchmem_magic", "watch", "--guard", "150%", "--", "true"],
                            env=environment(tmp), capture_output=True, text=True)
    assert result.returncode == 2 and "argument --guard: guard takes a share of the limit" in result.stderr
    assert "Traceback" not in result.stderr

"""The holder catalogue (examples/holder_catalogue.py) in a real kernel, each loop in a fresh one: a leak is
called a leak and its holder named with its path, and deleting or clearing what it names gives back most of
the leak the report states (the heap in use and /dev/shm, measured), and `%memcheck` of the holder says about
what that frees; a lookalike is clean. `make catalogue` (tools/catalogue_table.py) runs it three times into
the table of docs/leak-finder.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from holder_catalogue import CATALOGUE, Loop  # noqa: E402
from leaky_loops import SETUP  # noqa: E402

pytestmark = pytest.mark.kernel

#: what the process holds in memory its objects can keep, after a collection: the heap in use (glibc's
#: mallinfo2: bytes handed out, small and mapped blocks) and /dev/shm in use (DataLoader workers' batches)
HELD = (
    "import ctypes, gc, os\n"
    "class _Mallinfo2(ctypes.Structure):\n"
    "    _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks',"
    " 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]\n"
    "_libc = ctypes.CDLL(None); _libc.mallinfo2.restype = _Mallinfo2\n"
    "def _held_bytes():\n"
    "    gc.collect(); m = _libc.mallinfo2(); shm = os.statvfs('/dev/shm')\n"
    "    return m.uordblks + m.hblkhd + (shm.f_blocks - shm.f_bfree) * shm.f_frsize\n"
)
REPORT = (
    "(lambda r: {k: r[k] for k in ('verdict', 'resource', 'advice', 'steps')}"
    " | {'summary': r.get(r['resource'] or '')} | {'suspects': [{k: s[k] for k in"
    " ('name', 'path', 'retained_bytes', 'growth_share')} for s in r['suspects']]})"
    "(torchmem_magic.last_report().to_dict())"
)


def watched(k: Kernel, loop: Loop) -> dict:
    """The loop's report."""
    k.ok(SETUP + HELD + loop.setup)
    k.ok("%%memwatch -q\n" + loop.body, timeout_s=240)
    return k.value(REPORT)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_the_catalogue_loop_gets_its_verdict_and_holder(fresh_kernel: Kernel, name: str) -> None:
    loop = CATALOGUE[name]
    report = watched(fresh_kernel, loop)
    said = json.dumps(report, indent=1)
    assert report["verdict"] == loop.verdict, said
    if loop.verdict == "clean":
        return
    top = report["suspects"][0] if report["suspects"] else {}
    assert top.get("name") == loop.holder and str(top.get("path")).startswith(str(loop.path)), said
    assert loop.said is None or any(loop.said in line for line in report["advice"]), said
    checked = None if loop.holder is None else fresh_kernel.value(
        f"get_ipython().run_line_magic('memcheck', '-o {loop.holder}').retained_bytes")
    before = fresh_kernel.value("_held_bytes()")
    fresh_kernel.ok(str(loop.release))
    freed = before - fresh_kernel.value("_held_bytes()")
    leaked = report["summary"]["per_step"] * report["steps"]
    assert freed >= 0.7 * leaked, (freed, leaked, said)  # the ground truth: the named holder keeps the leak
    assert checked is None or 0.5 * freed <= checked <= 2 * freed, (checked, freed, said)

"""Holders no forward scan reaches, in a real kernel: a leak whose memory sits in an object implemented in C, a
registry of the standard library, a thread's running function, or a list the scan's rules do not expand is
found by searching back from the live tensors, and named with its path and its fix (a fresh kernel each, so
that no earlier case's holder is alive)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from leaky_loops import SETUP  # noqa: E402

pytestmark = pytest.mark.kernel

LOOP = (
    "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
    "for step in range(150):\n"
    "    train_step(model, opt, torch.randn(32, 64))\n"
    "    features = model[:2](torch.randn(128, 64)).detach()  # 256 KiB a step\n"
)
#: name -> (setup, the line of the loop that keeps `features`, the holder's name, the start of its path, of its fix)
CASES = {
    "logging_handler_buffering_records": (
        "import logging\n"
        "class Keep(logging.Handler):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.buffer = []\n"
        "    def emit(self, record):\n"
        "        self.buffer.append(record)\n"
        "handler = Keep(); handler.set_name('mem')\n"
        "log = logging.getLogger('train.features'); log.addHandler(handler); log.setLevel(logging.INFO)\n"
        "log.propagate = False; del handler, log  # no notebook name keeps the logger: only its registry does\n",
        "    logging.getLogger('train.features').info('step %d: %s', step, features)\n",
        "logging handler 'mem'", "logging handler 'mem'.buffer[", "logging handler 'mem' keeps every record",
    ),
    "c_object_holding_a_list": (
        "import functools\n"
        "seen = []\n"
        "on_step = functools.partial(print, seen)  # a C object: its args are no attribute a scan expands\n"
        "del seen\n",
        "    on_step.args[0].append(features)\n",
        "on_step", "on_step.args[0][", "on_step.args[0] keeps them",
    ),
    "library_registry_weakref_finalize": (
        "import weakref\n"
        "class Batch: pass\n"
        "keep_alive = Batch()\n",
        "    weakref.finalize(keep_alive, print, features)\n",
        "weakref.finalize registry", "weakref.finalize._registry[", "a weakref.finalize keeps",
    ),
    "module_global_of_a_library": (
        "import sys, types\n"
        "store = types.ModuleType('featurestore'); store.CACHE = []; sys.modules['featurestore'] = store\n"
        "del store\n",
        "    sys.modules['featurestore'].CACHE.append(features)\n",
        "module global featurestore.CACHE", "featurestore.CACHE[", "featurestore.CACHE keeps them",
    ),
    "thread_local_list": (
        "import queue, threading\n"
        "inbox = queue.Queue()\n"
        "def writer():\n"
        "    pending = []\n"
        "    while True:\n"
        "        item = inbox.get()\n"
        "        if item is None:\n"
        "            return\n"
        "        pending.append(item)  # never written out\n"
        "thread = threading.Thread(target=writer, name='writer', daemon=True); thread.start()\n",
        "    inbox.put(features)\n",
        "thread 'writer'", "writer() local pending", "thread 'writer''s writer() local pending",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_holder_no_scan_reaches_is_found_with_its_path_and_fix(fresh_kernel: Kernel, case: str) -> None:
    setup, keep, name, path, fix = CASES[case]
    fresh_kernel.ok(SETUP + setup)
    fresh_kernel.ok("%%memwatch -q\n" + LOOP + keep + "del features\n", timeout_s=180)
    report = fresh_kernel.value(
        "(lambda r: {k: r[k] for k in ('verdict', 'resource', 'advice')} | {'suspects': [{k: s[k] for k in"
        " ('name', 'path', 'retained_bytes', 'fix')} for s in r['suspects']]})(torchmem_magic.last_report().to_dict())"
    )
    said = json.dumps(report, indent=1)
    assert (report["verdict"], report["resource"]) == ("leak", "heap"), said
    found = [s for s in report["suspects"] if s["name"] == name]
    assert found and found[0]["path"].startswith(path) and found[0]["fix"].startswith(fix), said
    assert found[0]["retained_bytes"] >= 0.8 * 150 * (256 << 10), said  # what it keeps, as a scan of it measures
    line = report["advice"][1]
    assert line.startswith(f"{name} holds ") and "found where the scans had not looked" in line, said


def test_a_list_deep_in_a_big_object_the_memo_knows_is_named(fresh_kernel: Kernel) -> None:
    """A config object of thousands of entries, scanned (and remembered) by an earlier cell: its fingerprint
    stays the same while a list a few levels down fills, so the end scan reuses its old figure; the run must
    still name it, at the list."""
    fresh_kernel.ok(
        SETUP
        + "class Node:\n"
        "    def __init__(self): self.children = {}\n"
        "cfg = Node()\n"
        "for i in range(200_000):\n"
        "    cfg.children[f'option{i}'] = Node()\n"
        "cfg.children['option150000'].children['log'] = Node()\n"
        "cfg.children['option150000'].children['log'].items = []\n"
    )
    fresh_kernel.ok("%%memwatch -q\npass")  # the memo now knows cfg
    fresh_kernel.ok("%%memwatch -q\n" + LOOP + "    cfg.children['option150000'].children['log'].items.append(features)\n",
                    timeout_s=180)
    report = fresh_kernel.value(
        "(lambda r: {'verdict': r['verdict'], 'advice': r['advice'], 'suspects': [{k: s[k] for k in"
        " ('name', 'path', 'retained_bytes')} for s in r['suspects']]})(torchmem_magic.last_report().to_dict())"
    )
    said = json.dumps(report, indent=1)
    assert report["verdict"] == "leak" and report["suspects"], said
    top = report["suspects"][0]
    assert top["name"] == "cfg" and top["path"].startswith("cfg.children['option150000'].children['log'].items"), said
    assert not any("held elsewhere" in line for line in report["advice"]), said


#: a loop that keeps 16 KiB a step in a library's module global (it has no name in the notebook: only a search
#: back finds it) until the live figure's leak finder has measured that global at 4 scans (`seen`), or its
#: searches back mid-run have all run without finding it (`missed`), or two minutes passed; a millisecond's
#: sleep a step bounds what it keeps meanwhile
MID_RUN_LOOP = (
    "import time\n"
    "def _scans_of(name):\n"
    "    finder = torchmem_magic.session.run.active_session().finder\n"
    "    scans = len(finder.series().get(name, []))\n"
    "    return scans, finder.searches_spent and not scans\n"
    "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
    "deadline, step, seen, missed = time.monotonic() + 120, 0, False, False\n"
    "while not seen and not missed and time.monotonic() < deadline:\n"
    "    train_step(model, opt, torch.randn(32, 64))\n"
    "    sys.modules['featurestore'].CACHE.append(model[:2](torch.randn(8, 64)).detach())\n"
    "    time.sleep(0.001)\n"
    "    step += 1\n"
    "    if step % 25 == 0:\n"
    "        scans, missed = _scans_of('module global featurestore.CACHE')\n"
    "        seen = scans >= 4\n"
)


def test_a_holder_no_name_reaches_is_found_mid_run_and_a_stale_one_is_not_named(fresh_kernel: Kernel) -> None:
    """While the live figure shows a leak that no name's scans explain, the leak finder searches back once and
    measures what it found at each scan from then on: the live status names it as it grows, and the report
    gives its growth over the run. A library's dataset that was alive before the run and does not grow is found
    by the same search, but it is no suspect."""
    fresh_kernel.ok(
        SETUP + "import sys, types\n"
        "store = types.ModuleType('featurestore'); store.CACHE = []; sys.modules['featurestore'] = store\n"
        "data = types.ModuleType('datastore'); data.DATA = torch.randn(4_000_000); sys.modules['datastore'] = data\n"
        "del store, data\n"
    )
    fresh_kernel.ok("%%memwatch\n" + MID_RUN_LOOP, timeout_s=180)
    report = fresh_kernel.value(
        "(lambda r: {k: r[k] for k in ('verdict', 'steps', 'live_suspects_at_step', 'advice')} | {'suspects':"
        " [{k: s[k] for k in ('name', 'path', 'fix', 'growth_per_step', 'series', 'new_in_cell')} for s in r['suspects']]})"
        "(torchmem_magic.last_report().to_dict())"
    )
    said = json.dumps(report, indent=1)
    assert report["verdict"] == "leak" and fresh_kernel.value("seen"), (said, fresh_kernel.value("[step, missed]"))  # the 4th scan came
    top = report["suspects"][0]
    assert top["name"] == "module global featurestore.CACHE" and top["path"].startswith("featurestore.CACHE["), said
    assert top["fix"].startswith("featurestore.CACHE keeps them") and top["new_in_cell"] is True, said
    assert top["growth_per_step"] == pytest.approx(8 * 512 * 4, rel=0.3), said
    assert report["live_suspects_at_step"] is not None and report["live_suspects_at_step"] <= report["steps"], said
    assert not any("datastore" in s["name"] for s in report["suspects"]), said


def test_a_stale_holder_found_mid_run_is_not_named_beside_one_no_scan_can_measure(fresh_kernel: Kernel) -> None:
    """A leak in a `functools.partial`'s arguments (a C object: no scan reads into them) beside a library's
    dataset alive before the run: the search back mid-run finds both, the scans after it see the dataset stay
    the same size, and the search at the end then names the partial alone."""
    fresh_kernel.ok(
        SETUP + CASES["c_object_holding_a_list"][0] + "import sys, types\n"
        "data = types.ModuleType('datastore'); data.DATA = torch.randn(4_000_000); sys.modules['datastore'] = data\n"
        "del data\n"
    )
    loop = MID_RUN_LOOP.replace("sys.modules['featurestore'].CACHE.append(", "on_step.args[0].append(").replace(
        "module global featurestore.CACHE", "module global datastore.DATA")
    fresh_kernel.ok("%%memwatch\n" + loop, timeout_s=180)
    report = fresh_kernel.value(
        "(lambda r: {k: r[k] for k in ('verdict', 'steps', 'advice')} | {'suspects': [s['name'] for s in"
        " r['suspects']]})(torchmem_magic.last_report().to_dict())"
    )
    said = json.dumps(report, indent=1)
    assert report["verdict"] == "leak" and fresh_kernel.value("seen"), (said, fresh_kernel.value("[step, missed]"))  # 4 scans of the dataset
    assert report["suspects"] == ["on_step"], said

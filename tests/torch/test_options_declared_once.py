"""The options are declared once, in MemwatchOptions: an option added there (here a fake one, in a fresh
process, before any front end is imported) reaches every front end with its default, its check and its
help: the keywords of `memwatch()`, `assert_no_leak()` (and so the pytest mark) and both trainer callbacks,
the cell magic's flags, `watch`'s flags, and the environment that hands it to a rank."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import dataclasses, inspect, json
    from torchmem_magic.core import options as declared

    fake = declared.option(7.0, "a fake option, in ms", flag="--fake-ms", metavar="MS", from_text=float,
                           check=lambda v: float(v), env="TORCHMEM_MAGIC_FAKE_MS")
    declared.MemwatchOptions = dataclasses.make_dataclass(
        "MemwatchOptions", [("fake_ms", float, fake)], bases=(declared.MemwatchOptions,), frozen=True)

    from IPython.core.magic_arguments import parse_argstring
    import torchmem_magic
    from torchmem_magic import assert_no_leak, memwatch
    from torchmem_magic.__main__ import parsers
    from torchmem_magic.core.option_args import from_parsed
    from torchmem_magic.frontends.gate import LeakGate
    from torchmem_magic.frontends.magics import MemwatchMagics
    from torchmem_magic.integrations import lightning, transformers
    from torchmem_magic.ranks.launch_env import watched_environment

    seen = {}
    for name, front in [("memwatch", memwatch), ("assert_no_leak", assert_no_leak),
                        ("lightning", lightning.MemwatchCallback), ("transformers", transformers.MemwatchCallback)]:
        seen[name + " default"] = inspect.signature(front).parameters["fake_ms"].default
    seen["memwatch"] = memwatch(fake_ms=3).options.watched.fake_ms
    seen["assert_no_leak"] = assert_no_leak(fake_ms=3)._options.fake_ms
    seen["mark"] = LeakGate({}, fake_ms=3)._options.fake_ms
    seen["lightning"] = lightning.MemwatchCallback(fake_ms=3)._watch._options.fake_ms
    seen["transformers"] = transformers.MemwatchCallback(fake_ms=3)._watch._options.fake_ms
    seen["magic"] = from_parsed(parse_argstring(MemwatchMagics.memwatch, "--fake-ms 3")).fake_ms
    seen["magic help"] = "a fake option, in ms" in MemwatchMagics.memwatch.__doc__
    watch = parsers()[1]
    seen["watch"] = from_parsed(watch.parse_args(["--fake-ms", "3", "--", "true"]), "watch").fake_ms
    env = watched_environment({}, "sink", declared.MemwatchOptions(fake_ms=3))
    seen["rank environment"] = env.get("TORCHMEM_MAGIC_FAKE_MS")
    seen["rank"] = declared.MemwatchOptions.from_environment(env).fake_ms
    settings = declared.SessionOptions.of(declared.MemwatchOptions(fake_ms=3))
    seen["a session's ranks"] = settings.forwarded(scan=True).fake_ms
    try:
        memwatch(fake_ms="slow")
    except ValueError as exc:
        seen["checked"] = str(exc)
    print(json.dumps(seen))
''')


def test_an_option_declared_once_reaches_every_front_end() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for front in ("memwatch", "assert_no_leak", "lightning", "transformers"):
        assert seen[f"{front} default"] == 7.0, (front, seen)
    for front in ("memwatch", "assert_no_leak", "mark", "lightning", "transformers", "magic", "watch", "rank",
                  "a session's ranks"):
        assert seen[front] == 3.0, (front, seen)
    assert seen["rank environment"] == "3" and seen["magic help"] is True, seen
    assert "could not convert string to float: 'slow'" in seen["checked"], seen


def test_each_option_has_one_default_wherever_it_is_given() -> None:
    """The declared defaults are the ones each front end shows (no front end keeps a default of its own)."""
    import dataclasses
    import inspect

    from torchmem_magic import assert_no_leak, memwatch
    from torchmem_magic.__main__ import parsers
    from torchmem_magic.core.options import MemwatchOptions
    from torchmem_magic.integrations import lightning, transformers

    defaults = {f.name: f.default for f in dataclasses.fields(MemwatchOptions)}
    for front in (memwatch, assert_no_leak, lightning.MemwatchCallback, transformers.MemwatchCallback):
        shown = {n: p.default for n, p in inspect.signature(front).parameters.items() if n in defaults}
        assert shown == defaults, front
    parsed = parsers()[1].parse_args(["--", "true"])
    assert {n: getattr(parsed, n) for n in ("interval_ms", "scan", "guard")} == {
        n: defaults[n] for n in ("interval_ms", "scan", "guard")}

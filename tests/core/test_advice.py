"""The advice catalogue: every note a rule gives has its words there, every wording is used, the rules
word nothing, and a note's facts make the sentence users read."""

from __future__ import annotations

import ast
from pathlib import Path

import torchmem_magic
from torchmem_magic.analysis.findings import note
from torchmem_magic.render.advice import CATALOGUE, advice_lines, worded

PACKAGE = Path(torchmem_magic.__file__).parent
MIB = 1 << 20


def _keys(node: ast.expr) -> set[str]:
    """The keys a note's first argument can be: a string, or either side of a conditional."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _keys(node.body) | _keys(node.orelse)
    raise AssertionError(f"a note's key that is not written out: {ast.unparse(node)}")


def _note_keys_in_sources() -> set[str]:
    keys: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "note":
                keys |= _keys(node.args[0])
    return keys


def test_every_note_given_has_its_words_and_every_wording_is_given() -> None:
    given = _note_keys_in_sources()
    assert given <= set(CATALOGUE), given - set(CATALOGUE)
    assert set(CATALOGUE) <= given, set(CATALOGUE) - given


def test_the_rules_word_nothing() -> None:
    """The verdict's rules, the holders' fusion and the forensics format no figure: they give facts."""
    for name in ("verdict", "holders", "holder_trends", "forensics", "worker_growth", "epochs", "findings"):
        tree = ast.parse((PACKAGE / "analysis" / f"{name}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert not imported & {"format_bytes", "format_duration", "rate_unit", "plural_noun"}, name


def test_a_notes_facts_make_its_sentence() -> None:
    searched = {"rescanned": 3, "storages_searched": 256, "storages_live": 3846, "cut_short": False}
    found = note("search found", name="featurestore.CACHE", retained_bytes=64 * MIB, growth_per_step=32768.0,
                 path="featurestore.CACHE['a']", curve_rate=32768.0, clock="optimizer", searched=searched)
    assert worded(found) == (
        "featurestore.CACHE holds 64.0 MiB, +32.0 KiB/step over the run at featurestore.CACHE['a']: that is where "
        "the memory goes of the +32.0 KiB/step (found where the scans had not looked: rescanned 3 names afresh, then "
        "searched back from the 256 largest of 3846 live tensor storages no scan reached)"
    )
    runs_out = {"resource": "vram", "per_step_bytes": MIB, "steps": 2048.0, "seconds": 600.0, "clock": "optimizer"}
    assert advice_lines([note("runs out in", **runs_out), note("runs out in", **runs_out, signed=True)]) == (
        "at 1.0 MiB/step CUDA runs out of memory in ~2,048 steps (~10 min)",
        "at +1.0 MiB/step CUDA runs out of memory in ~2,048 steps (~10 min)",
    )
    cause = {"terminated_by": None, "kills": {}, "ram_limit_source": "cgroup v2"}
    assert worded(note("likeliest cause", **cause, at_limit=(("ram", 0.97), ("shm", 0.95)))) == (
        "RAM was at 97% of its limit (cgroup v2): most likely the OOM killer")
    assert worded(note("likeliest cause", **cause, at_limit=(("shm", 0.95),))) == (
        "/dev/shm was 95% full: what killed it cannot be known from the record, that limit is the likeliest")

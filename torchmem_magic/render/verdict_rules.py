"""The verdict's table as the docs show it: each rule with what it finds, each threshold with its value and
why (`python -m torchmem_magic.render.verdict_rules` prints it; a test keeps the docs page equal to it)."""

from __future__ import annotations

import dataclasses

from ..analysis.verdict_table import MIB, RULES, Thresholds, why


def _value(value: float) -> str:
    if value >= MIB:
        return f"{value / MIB:g} MiB"
    return f"{value:g}"


def markdown_table() -> str:
    """The rules (in the order they are tried) and the thresholds, as two Markdown tables."""
    lines = ["| rule | what it finds |", "|---|---|"]
    lines += [f"| `{name}` | {finds} |" for name, finds in RULES.items()]
    lines += ["", "| threshold | value | why |", "|---|---|---|"]
    defaults = Thresholds()
    for field in dataclasses.fields(Thresholds):
        lines.append(f"| `{field.name}` | {_value(getattr(defaults, field.name))} | {why(field.name)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")

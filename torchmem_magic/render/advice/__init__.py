"""The advice's words: one catalogue for what the rules find (stdlib only).

A rule finds something and says so as a `Note` (a key and its facts); it words nothing. Each key has its
wording here, by subject (`verdict`, `holders`, `deaths`), so what users read can be reviewed, and
changed, in one place, and a rule's test reads its facts, not its sentences. The fix each holder gets,
what a memcheck says, the guard's words, the lines of a report of many ranks and the word on sources that
failed are here too (`fixes`, `memcheck`, `guard`, `ranks`, `sources`), called with their facts by the
parts that find them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...analysis.findings import Note
from . import deaths, holders, verdict

#: each note's wording, by its key
CATALOGUE: dict[str, Callable[..., str]] = {**verdict.WORDS, **holders.WORDS, **deaths.WORDS}


def worded(note: Note) -> str:
    """The sentence users read for `note`."""
    return CATALOGUE[note.key](**note.facts)


def advice_lines(notes: Iterable[Note]) -> tuple[str, ...]:
    """Each note worded, in order."""
    return tuple(worded(n) for n in notes)

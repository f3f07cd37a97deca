"""Bounded, decimating series of memory samples (stdlib only).

A 24 h run at 100 ms makes ~864k samples; keeping them all would make the sampler a leak of its own.
`DecimatingSeries` keeps at most `capacity` rows: when full it merges neighbouring rows pairwise and
from then on merges `stride` incoming rows into one. Merging keeps the *first* value of the x columns
(time, step) and the *maximum* of every memory column, so peaks survive any amount of decimation.
Running first/last/max per column are kept exactly, independent of decimation.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import resources
from .model import STEP_CLOCKS, Clock

NAN = float("nan")

#: Columns of every row: the two x columns (seconds since the session started; steps of the step clock so
#: far), then one per resource of the table, in its order. Sizes in bytes; NaN where the source is absent
#: (a column a row leaves out is NaN).
COLUMNS: tuple[str, ...] = ("t_s", "step", *(r.column for r in resources.RESOURCES))
X_COLUMNS = frozenset({"t_s", "step"})
_COLUMN_INDEX = {name: i for i, name in enumerate(COLUMNS)}
_COLUMN_SET = frozenset(COLUMNS)
Row = Mapping[str, float]


def column_index(name: str) -> int:
    """Position of `name` in a row; raises KeyError naming the known columns."""
    try:
        return _COLUMN_INDEX[name]
    except KeyError:
        raise KeyError(f"unknown column {name!r}; known: {', '.join(COLUMNS)}") from None


def _nanmax(a: float, b: float) -> float:
    if a != a:  # NaN
        return b
    if b != b:
        return a
    return a if a >= b else b


_IS_X = tuple(name in X_COLUMNS for name in COLUMNS)


def _merge(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x if is_x else _nanmax(x, y) for x, y, is_x in zip(a, b, _IS_X)]


def thinned(values: array[float], at_most: int) -> array[float]:
    """Every k-th value, k the smallest stride that keeps at most `at_most` of them, the last one
    always kept (a jump at the last reading must still show); unchanged when short enough."""
    if at_most < 2:
        raise ValueError(f"at_most must be at least 2, got {at_most}")
    n = len(values)
    if n <= at_most:
        return values
    stride = -(-(n - 1) // (at_most - 1))  # ceil: (at_most - 1) strides span the n - 1 gaps
    out = values[::stride]
    if (n - 1) % stride:
        out.append(values[-1])
    return out


class DecimatingSeries:
    """Thread-safe bounded columnar store of rows (one writer, any readers)."""

    def __init__(self, capacity: int = 2000) -> None:
        if capacity < 4 or capacity % 2:
            raise ValueError(f"capacity must be an even number >= 4, got {capacity}")
        self.capacity = capacity
        self._columns = [array("d") for _ in COLUMNS]
        self._lock = threading.Lock()
        self._stride = 1
        self._pending: list[float] | None = None
        self._pending_count = 0
        self.count = 0  # rows appended in total
        self.first: tuple[float, ...] | None = None
        self.last: tuple[float, ...] | None = None
        self._max = [NAN] * len(COLUMNS)

    def append(self, row: Row) -> None:
        """Add one row: column name -> value; columns it leaves out are NaN."""
        if not _COLUMN_SET.issuperset(row):
            raise KeyError(f"unknown column(s) {sorted(set(row) - _COLUMN_SET)}; known: {', '.join(COLUMNS)}")
        values = tuple([row.get(name, NAN) for name in COLUMNS])
        with self._lock:
            self.count += 1
            if self.first is None:
                self.first = values
            self.last = values
            self._max = [_nanmax(m, v) for m, v in zip(self._max, values)]
            pending = list(values) if self._pending is None else _merge(self._pending, values)
            self._pending_count += 1
            if self._pending_count < self._stride:
                self._pending = pending
                return
            self._pending, self._pending_count = None, 0
            for column, value in zip(self._columns, pending):
                column.append(value)
            if len(self._columns[0]) >= self.capacity:
                self._compact()

    def _compact(self) -> None:
        n = len(self._columns[0])
        merged = [
            _merge([c[i] for c in self._columns], [c[i + 1] for c in self._columns])
            for i in range(0, n - 1, 2)
        ]
        self._columns = [array("d", (row[j] for row in merged)) for j in range(len(COLUMNS))]
        self._stride *= 2

    def __len__(self) -> int:
        return len(self._columns[0])

    def column(self, name: str) -> array[float]:
        """A copy of one column (stored rows only, plus a partially merged pending row)."""
        j = column_index(name)
        with self._lock:
            out = array("d", self._columns[j])
            if self._pending is not None:
                out.append(self._pending[j])
        return out

    def columns(self, *names: str, at_most: int | None = None) -> dict[str, array[float]]:
        """Consistent copies of several columns taken under one lock.

        `at_most`: thin the rows evenly by index to at most this many, the first and the last kept
        (see `thinned`), so that what reads them costs the same however long the run."""
        idx = [column_index(n) for n in names]
        with self._lock:
            out = {n: array("d", self._columns[j]) for n, j in zip(names, idx)}
            if self._pending is not None:
                for n, j in zip(names, idx):
                    out[n].append(self._pending[j])
        if at_most is not None:
            out = {n: thinned(column, at_most) for n, column in out.items()}
        return out

    def max(self, name: str) -> float:
        return self._max[column_index(name)]

    def first_value(self, name: str) -> float:
        return NAN if self.first is None else self.first[column_index(name)]

    def last_value(self, name: str) -> float:
        return NAN if self.last is None else self.last[column_index(name)]

    @property
    def stride(self) -> int:
        """How many appended rows one stored row stands for now."""
        return self._stride

    def nbytes(self) -> int:
        """Bytes held by the stored columns (what must stay bounded)."""
        return sum(c.buffer_info()[1] * c.itemsize for c in self._columns)


@dataclass(frozen=True)
class EpochMarker:
    """A pass of a DataLoader started: at `t_s` seconds, when each step clock stood at `steps`."""

    t_s: float
    loader: int  # which loader (train and validation loaders differ)
    steps: tuple[int, ...]  # count of each clock of STEP_CLOCKS at that moment

    def step_of(self, clock: Clock) -> int:
        """Steps of `clock` before the pass started (0 for "time")."""
        return self.steps[STEP_CLOCKS.index(clock)] if clock in STEP_CLOCKS else 0


class Timeline:
    """Everything sampled in one session: a time series, a step-aligned series, loader passes.

    `by_step` holds samples taken at the steps of one clock; when a better clock shows up (the
    first backward pass after forward calls, say) it starts again, so its x axis is one clock's.
    """

    MAX_EPOCH_MARKERS = 4096

    def __init__(self, capacity: int = 2000) -> None:
        self.capacity = capacity
        self.by_time = DecimatingSeries(capacity)
        self.by_step = DecimatingSeries(capacity)
        self.epochs: list[EpochMarker] = []
        self.passes: dict[int, int] = {}  # loader -> passes started (all of them, beyond the markers kept)

    def add_pass(self, t_s: float, loader: int, steps: tuple[int, ...]) -> None:
        self.passes[loader] = self.passes.get(loader, 0) + 1
        if len(self.epochs) < self.MAX_EPOCH_MARKERS:
            self.epochs.append(EpochMarker(t_s, loader, steps))

    def restart_steps(self) -> None:
        """Drop the step-aligned samples of a clock that a better one replaced."""
        self.by_step = DecimatingSeries(self.capacity)

    def epochs_of(self, loader: int | None) -> list[EpochMarker]:
        """The passes of `loader` (every pass when the training loader is not known)."""
        return [m for m in self.epochs if loader is None or m.loader == loader]

    def epoch_count(self, loader: int | None) -> int:
        return sum(self.passes.values()) if loader is None else self.passes.get(loader, 0)

    def nbytes(self) -> int:
        return self.by_time.nbytes() + self.by_step.nbytes() + 64 * len(self.epochs)

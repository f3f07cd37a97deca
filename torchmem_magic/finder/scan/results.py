"""What a scan takes and what it returns: plain data, no walker code (suspects.py needs only this)."""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

from ...core.model import TensorFinding

# A retained autograd node costs ~600-800 B of heap: deleting retained graphs gives back about this
# much per node on top of their tensors (the kernel tests check retained bytes against it, ±15%).
NODE_BYTES = 700
MAX_PLACES = 64  # places kept per root (the first met; a holder's few containers in practice)


@dataclass(frozen=True)
class Root:
    """A starting point: `name` groups results (a user variable, "Out", "sys.last_traceback")."""

    name: str
    kind: str  # "user", "output-cache" or "traceback"
    path: str  # how to write the object in code: "history", "Out[5]", "sys.last_value"
    obj: Any = field(repr=False, compare=False)


class LooseRoot:
    """A root followed from one scan to the next without keeping its object alive: through a weak
    reference where its type takes one; else (a list, a dict) strongly, but let go at the first look
    that finds nothing else holding it. What a search back found is such a root: the user may drop it."""

    __slots__ = ("name", "kind", "path", "_weak", "_strong")

    def __init__(self, root: Root) -> None:
        self.name, self.kind, self.path = root.name, root.kind, root.path
        self._strong: Any = None
        try:
            self._weak: weakref.ref[Any] | None = weakref.ref(root.obj)
        except TypeError:
            self._weak, self._strong = None, root.obj

    def root(self) -> Root | None:
        """The root while its object lives elsewhere too; None once it does not."""
        if self._weak is not None:
            obj = self._weak()
        else:
            obj = self._strong
            # held here, by `obj` and by getrefcount's argument: by no one else
            if obj is not None and sys.getrefcount(obj) <= 3:
                obj = self._strong = None
        return None if obj is None else Root(self.name, self.kind, self.path, obj)


@dataclass(frozen=True)
class Budget:
    """Limits of one scan. A stop on any of them is reported, never silent.

    Frozen: budgets are module-level constants shared by every scan that uses them.
    """

    time_s: float = 1.0  # CPU time of the scanning thread (at most 4x as long in wall time: see Deadline)
    max_objects: int = 500_000
    max_objects_per_root: int = 200_000
    max_depth: int = 24
    graph_node_cap: int = 20_000  # per root; why there is a cap at all: see autograd.py
    max_findings: int = 1_000
    max_children: int = 10_000  # non-tensor children taken from one container
    sequence_floor: int = 0  # a long chain's unwalked nodes are counted down to this autograd sequence number


@dataclass(frozen=True)
class FunctionSlot:
    """Where a function keeps an object from one call to the next, named as its code names it, so a
    fix can say `store` rather than `__defaults__[0]`."""

    kind: str  # "default" (argument), "closure" (captured variable) or "attribute" (of a bound method's self)
    function: str  # the function's name: `log`
    variable: str  # `store`, `cache`, or the attribute `cache` of `self`
    holds: str  # the type name of what it held when scanned: "list"
    outer: str | None = None  # a closure's enclosing function (`make_logger`); a bound method's class


@dataclass
class SlotStats:
    """The tensors a root reaches through one function slot (the innermost on their path)."""

    slot: FunctionSlot
    tensors: int = 0
    tensor_bytes: int = 0  # storages first counted here, as in RootStats
    scalar_tensors: int = 0
    first_tensor_path: str | None = None


def mostly(part_bytes: int, stats: "RootStats") -> bool:
    """Whether more than half of what a root's tensors hold is `part_bytes` (on a device, in shared memory)."""
    return bool(stats.tensor_bytes) and 2 * part_bytes > stats.tensor_bytes


@dataclass
class RootStats:
    """What one named root keeps alive (a suspect candidate)."""

    name: str
    kind: str
    path: str
    holder_type: str  # the root object's type name
    resettable: bool = False  # its class defines `reset()` (a metric: its state grows until reset)
    tensors: int = 0
    tensor_bytes: int = 0  # storages first counted here (deduplicated across all roots)
    accelerator_bytes: int = 0  # of those, the bytes on an accelerator (a CUDA, MPS, XPU device)
    shared_bytes: int = 0  # of those, the bytes in shared-memory segments (batches from DataLoader workers)
    scalar_tensors: int = 0
    graph_tensors: int = 0  # tensors with a grad_fn
    graph_nodes: int = 0
    saved_bytes: int = 0  # activations kept only through those graphs
    saved_live: int = 0  # saved tensors still held (no backward ran)
    saved_freed: int = 0  # saved tensors already freed by backward
    graph_estimated: bool = False  # node cap or time hit: figures extrapolated
    truncated: bool = False  # object traversal stopped early (depth/objects/time)
    objects: int = 0  # visited one by one
    plain_objects: int = 0  # plain-data records counted in bulk (what a scan of it also costs)
    first_tensor_path: str | None = None
    graph_paths: list[str] = field(default_factory=list)  # a few paths of graph-holding tensors
    slots: dict[str, SlotStats] = field(default_factory=dict)  # by the slot's path: `log.__defaults__[0]`
    #: tensor bytes (first counted here) by where they are kept: the container holding them
    #: (`logger.hist`), or the attribute that is one (`net.seen`); at most MAX_PLACES places, so a
    #: holder's growth is placed by comparing two scans' figures
    places: dict[str, int] = field(default_factory=dict)
    container_places: set[str] = field(default_factory=set)  # the places that are containers (not a tensor)

    @property
    def retained_bytes(self) -> int:
        """What deleting this root would free: its tensors, what only its graphs save, the nodes."""
        return self.tensor_bytes + self.saved_bytes + self.graph_nodes * NODE_BYTES

    def retained_by_resource(self) -> dict[str, int]:
        """`retained_bytes` by the memory it lives in ("heap", "shm", "vram"; none that holds nothing): what
        its graphs save goes with the tensors' device, their nodes are the heap's."""
        on_device = mostly(self.accelerator_bytes, self)
        vram = self.accelerator_bytes + (self.saved_bytes if on_device else 0)
        split = {"heap": self.retained_bytes - vram - self.shared_bytes, "shm": self.shared_bytes, "vram": vram}
        return {resource: nbytes for resource, nbytes in split.items() if nbytes > 0}


@dataclass
class ScanResult:
    """A finished scan: numbers and paths only, no reference to anything scanned."""

    roots: list[RootStats]
    findings: list[TensorFinding]
    findings_truncated: bool
    devices: list[str]
    objects: int
    skipped: int  # objects whose introspection raised
    truncated: bool
    elapsed_s: float
    notes: list[str]
    storages: frozenset[tuple[object, ...]] = frozenset()  # the storages it counted (keys, as `tensor_storage` gives)
    reused: frozenset[str] = frozenset()  # the names whose figures a memo gave, not this scan


@dataclass(frozen=True)
class StartScan:
    """What the scan before a run found: each name's retained bytes, the names cheap to re-measure,
    and what the scan cost. A process forked from the watcher inherits exactly those objects, so it
    takes this over instead of walking (and copying, page by page) the inherited heap again."""

    baseline: dict[str, int]
    cheap: frozenset[str]
    cost_s: float

"""The autograd graphs behind the tensors a scan found: how many nodes, and what activations they save.

A graph is walked from each tensor's `grad_fn` through `next_functions`. A node's saved tensors are
its `_raw_saved_*` attributes (whose `.data` is None once backward freed them) and, for a custom
`autograd.Function`, the tensors on its ctx.

Why a node cap: touching more than about 45,000 nodes of one linear chain from Python (the chain a
`total_loss += loss` loop builds) makes the later deletion of that chain overflow the C stack, which
kills the process. So at most `graph_node_cap` nodes are touched per root. A chain longer than that
is walked in part and its length read off autograd's sequence numbers; many small graphs past the
cap are extrapolated from the share of tensors walked. Either way the figures are marked estimated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .deadline import Deadline
from .introspect import StorageKey, tensor_storage, type_name
from .results import RootStats


@dataclass
class ReachedTensor:
    """A tensor the traversal found, with the reference the graph walk needs until the scan ends."""

    path: str
    root: RootStats
    tensor: Any
    nbytes: int
    counted: bool  # its storage was first counted here
    graph_nodes: int = 0
    graph_saved_bytes: int = 0


class GraphWalker:
    """Walks the graphs behind one scan's tensors, root by root, within the node cap and the deadline.

    A saved tensor is charged to a graph only when nothing else keeps it: not when its storage was
    already counted (the user holds it directly, or an earlier graph saved it), nor for parameters.
    """

    def __init__(
        self, torch: Any, node_cap: int, deadline: Deadline, counted_storages: set[StorageKey], sequence_floor: int = 0
    ) -> None:
        self._sequence_floor = sequence_floor
        self._torch = torch
        self._node_cap = node_cap
        self._deadline = deadline
        self._counted = counted_storages  # shared with the traversal, which counted its tensors first
        self._leaf_storages: set[StorageKey] = set()  # parameters' (AccumulateGrad variables)
        self._saved_attrs: dict[type, tuple[str, ...]] = {}
        self._seen_nodes: dict[int, Any] = {}  # held until release(), so ids stay unique
        self.skipped = 0  # nodes whose introspection raised

    def walk(self, groups: list[tuple[RootStats, list[ReachedTensor]]]) -> None:
        """Walk each root's graphs, oldest graphs first: where two names share a graph (`h` carried
        across steps and this step's `loss = head(h)`), the older one holds the shared part."""
        if len(groups) > 1:
            groups = sorted(groups, key=lambda group: _oldest_node(group[1]))
        for stats, tensors in groups:
            self._walk_root(stats, tensors)

    def release(self) -> None:
        """Drop the references to every node touched."""
        self._seen_nodes.clear()

    def _walk_root(self, stats: RootStats, tensors: list[ReachedTensor]) -> None:
        """Past the cap: a single long chain is extrapolated from autograd sequence numbers; many small
        graphs are extrapolated from the share of tensors walked. Either way `graph_estimated` is set."""
        cap = self._node_cap
        with_graph = [t for t in tensors if t.tensor.grad_fn is not None]
        stats.graph_tensors = len(with_graph)
        stats.graph_paths = [t.path for t in with_graph[:3]]
        walked_tensors = walked_nodes = 0
        for entry in with_graph:
            remaining = cap - walked_nodes
            if remaining <= 0 or self._deadline.passed():
                break
            nodes, saved_bytes, stopped_at = self._walk_graph(entry.tensor.grad_fn, remaining, stats)
            entry.graph_nodes, entry.graph_saved_bytes = nodes, saved_bytes
            walked_nodes += nodes
            walked_tensors += 1
            if stopped_at is not None:
                stats.graph_estimated = True
                if nodes >= cap // 2:  # one graph bigger than the cap: a long chain
                    extra = _chain_estimate(entry.tensor.grad_fn, stopped_at, nodes, self._sequence_floor)
                    stats.graph_nodes += extra
                    entry.graph_nodes += extra
                break
        if with_graph and not walked_tensors:
            stats.truncated = True  # out of time before any graph: its figures would miss them all
        elif walked_tensors < len(with_graph):
            stats.graph_estimated = True
            scale = len(with_graph) / max(walked_tensors, 1)
            stats.graph_nodes = int(stats.graph_nodes * scale)
            stats.saved_bytes = int(stats.saved_bytes * scale)

    def _walk_graph(self, grad_fn: Any, limit: int, stats: RootStats) -> tuple[int, int, Any]:
        """Touch at most `limit` new nodes of one graph; returns (nodes, saved bytes, node stopped at or None)."""
        seen_nodes = self._seen_nodes
        nodes = saved_bytes = 0
        stack = [grad_fn]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen_nodes:
                continue
            if nodes >= limit:
                return nodes, saved_bytes, node
            seen_nodes[id(node)] = node
            nodes += 1
            stats.graph_nodes += 1
            try:
                if type_name(type(node)) == "AccumulateGrad":
                    variable = getattr(node, "variable", None)
                    if variable is not None:
                        self._leaf_storages.add(tensor_storage(variable)[0])
                for saved in self._saved_tensors(node):
                    if saved is None:
                        stats.saved_freed += 1
                        continue
                    stats.saved_live += 1
                    key, nbytes = tensor_storage(saved)
                    if key in self._counted or key in self._leaf_storages or (
                        saved.requires_grad and saved.grad_fn is None
                    ):
                        continue  # a parameter, or alive anyway through a direct reference
                    self._counted.add(key)
                    stats.saved_bytes += nbytes
                    saved_bytes += nbytes
                stack.extend(next_node for next_node, _ in node.next_functions)
            except Exception:
                self.skipped += 1
        return nodes, saved_bytes, None

    def _saved_tensors(self, node: Any) -> Iterator[Any]:
        """Saved tensors of a node: a tensor, or None for one that backward already freed."""
        for name in self._saved_attributes(node):
            value = getattr(node, name, None)
            for saved in value if isinstance(value, (list, tuple)) else (value,):
                if saved is not None:
                    yield saved.data
        instance_dict = getattr(node, "__dict__", None)  # custom autograd.Function ctx attributes
        if type(instance_dict) is dict:
            for value in dict.values(instance_dict):
                if self._torch is not None and issubclass(type(value), self._torch.Tensor):
                    yield value
        if hasattr(type(node), "saved_tensors"):
            try:
                yield from node.saved_tensors
            except RuntimeError:
                yield None  # freed by backward

    def _saved_attributes(self, node: Any) -> tuple[str, ...]:
        """The `_raw_saved_*` names of a node type (one per generated node class, looked up once)."""
        cls = type(node)
        names = self._saved_attrs.get(cls)
        if names is None:
            names = tuple(n for n in dir(node) if n.startswith("_raw_saved_"))
            self._saved_attrs[cls] = names
        return names


def _oldest_node(entries: list[ReachedTensor], sample: int = 256) -> float:
    """The lowest autograd sequence number among a root's first tensors (containers are walked in
    order, so the first ones are the oldest; each `grad_fn` costs a Python wrapper)."""
    numbers = []
    for entry in entries[:sample]:
        grad_fn = entry.tensor.grad_fn
        if grad_fn is not None:
            try:
                numbers.append(int(grad_fn._sequence_nr()))
            except Exception:
                pass
    return min(numbers, default=float("inf"))


def _sequence_nr(node: Any) -> int | None:
    try:
        number = int(node._sequence_nr())
    except Exception:
        return None
    return number if 0 <= number < 1 << 62 else None  # AccumulateGrad nodes carry UINT64_MAX


def _chain_estimate(head: Any, stopped_at: Any, walked: int, floor: int = 0) -> int:
    """Nodes left behind the cap, from autograd sequence numbers (nodes are numbered as created, by
    every graph of the thread): the walked part says what share of the numbers belongs to this chain,
    and the same share of the numbers between `floor` and where the walk stopped is counted."""
    first, last = _sequence_nr(head), _sequence_nr(stopped_at)
    if first is None or last is None or last <= floor:
        return 0
    density = min(1.0, walked / (first - last)) if first > last else 1.0
    return int((last - floor) * density)

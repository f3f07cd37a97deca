"""What `%memcheck` says beside its figures: each holder's fix, estimates, and the scan's own limits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ...core.model import Suspect


class Measured(Protocol):
    """What a scan measured of one root, as far as the memcheck's words depend on it."""

    @property
    def name(self) -> str: ...
    @property
    def tensors(self) -> int: ...
    @property
    def graph_tensors(self) -> int: ...
    @property
    def graph_nodes(self) -> int: ...
    @property
    def graph_estimated(self) -> bool: ...
    @property
    def saved_live(self) -> int: ...
    @property
    def saved_freed(self) -> int: ...


def memcheck_advice(expr: str, stats: Sequence[Measured], suspects: Sequence[Suspect], node_bytes: int) -> list[str]:
    """What a memcheck says: each suspect's fix, how far its graph figures are estimates, and what
    backward already freed (`node_bytes`: what a graph node itself keeps)."""
    advice = [f"{s.name}: {s.fix}" for s in suspects]
    if not any(s.tensors for s in stats):
        advice.insert(0, f"{expr or 'the namespace'} holds no tensors")
    if any(s.graph_estimated for s in stats):
        chains = [s for s in stats if s.graph_estimated and s.graph_tensors == 1]
        for s in chains:
            advice.append(
                f"{s.name} is an autograd chain of ~{s.graph_nodes:,} nodes (an estimate: only part of it "
                "was walked, since touching very long chains from Python can crash their deletion)"
            )
        if len(chains) < sum(1 for s in stats if s.graph_estimated):
            advice.append("graph figures are estimates: some graphs were sampled, not walked in full")
    freed = sum(s.saved_freed for s in stats)
    if freed and not sum(s.saved_live for s in stats):
        advice.append(
            f"the graphs' saved activations were already freed by backward ({freed} saved tensors): "
            f"what stays is the graph nodes themselves, ~{node_bytes} B each"
        )
    return advice


def truncated_scan(objects: int) -> str:
    return f"the scan stopped early (budget: {objects:,} objects); figures cover what was reached"


def skipped_objects(count: int) -> str:
    return f"{count} object(s) could not be inspected and were skipped"

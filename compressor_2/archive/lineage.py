"""Lineage queries over the archive's parent links, as a networkx DiGraph (parent -> child)."""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx


class Lineage:
    def __init__(self, candidate_ids: Iterable[int], edges: Iterable[tuple[int, int]]) -> None:
        self.graph = nx.DiGraph()
        self.graph.add_nodes_from(candidate_ids)
        self.graph.add_edges_from(edges)

    def parents(self, cid: int) -> list[int]:
        return sorted(self.graph.predecessors(cid))

    def children(self, cid: int) -> list[int]:
        return sorted(self.graph.successors(cid))

    def children_count(self, cid: int) -> int:
        return int(self.graph.out_degree(cid))

    def ancestors(self, cid: int) -> list[int]:
        """Every candidate `cid` descends from, oldest (lowest id) first."""
        return sorted(nx.ancestors(self.graph, cid))

    def descendants(self, cid: int) -> list[int]:
        return sorted(nx.descendants(self.graph, cid))

    def common_ancestors(self, a: int, b: int) -> list[int]:
        """Candidates both `a` and `b` descend from (a candidate counts as its own)."""
        return sorted((nx.ancestors(self.graph, a) | {a}) & (nx.ancestors(self.graph, b) | {b}))

    def distance(self, a: int, b: int) -> int | None:
        """Parent links between `a` and `b`, in either direction through common relatives;
        None when they are unrelated."""
        try:
            return int(nx.shortest_path_length(self.graph.to_undirected(as_view=True), a, b))
        except nx.NetworkXNoPath:
            return None

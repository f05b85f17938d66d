"""The evolution tree: who came from whom, with stable node ids.

Nodes: `g{g}_pop{i}` (population member i at the start of generation g),
`g{g}_child{j}_pre` (offspring j after crossover or cloning, evaluated) and
`g{g}_child{j}_mut` (the same offspring after a mutation that changed it). An archive
strategy places each kept candidate once, `c{id}` (stage "cand", in the column of the
iteration that made it), with edges from its parents wherever they stand; a GEPA merge
also gets a dashed "ancestor" edge from the common ancestor it was merged over.
With LLM selection (CONFIG_SELECTION="llm") a population node the selector chose carries `selected`
(its category) and `reasoning`, and is drawn with a ring in its category's colour.
Edges: "parent" (pop -> pre; two for a crossover, one for a clone), "mutation"
(pre -> mut), and "carry" (an elite or final offspring -> its place in the next
generation's population; the seed's tree would otherwise stop at each generation).
The graph is drawn from the run archive (candidates, lineage, placements), so it
always shows what the archive holds; tree.json is a copy for other tools.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import networkx as nx
from matplotlib.lines import Line2D

from compressor_2.archive import RunArchive
from compressor_2.common import atomic_write_json
from compressor_2.outputs.plots import plt, save_figure

TREE_FILE = "tree.json"
TREE_PLOT = "evolution_tree.png"
STAGE_X = {"pop": 0, "pre": 1, "mut": 2, "cand": 1}
EDGE_STYLE = {"parent": ("#555555", "solid"), "mutation": ("#1f77b4", "solid"), "carry": ("#aaaaaa", "dotted"),
              "ancestor": ("#2ca02c", "dashed")}
MAX_LABELLED_NODES = 600
MAX_TICKS = 60  # generations labelled on the x axis
SELECTED_STYLE = {"performance": "#d62728", "diversity": "#9467bd", "potential": "#ff7f0e"}  # ring colours


def pop_id(generation: int, i: int) -> str:
    return f"g{generation}_pop{i}"


def pre_id(generation: int, j: int) -> str:
    return f"g{generation}_child{j}_pre"


def mut_id(generation: int, j: int) -> str:
    return f"g{generation}_child{j}_mut"


def cand_id(candidate: int) -> str:
    """An archive strategy's node: one per kept candidate."""
    return f"c{candidate}"


class EvolutionTree:
    def __init__(self, graph: nx.DiGraph | None = None) -> None:
        self.graph = graph if graph is not None else nx.DiGraph()

    @classmethod
    def from_archive(cls, archive: RunArchive) -> EvolutionTree:
        """The tree as the archive's placements and lineage describe it: a node per
        placement, labelled with its seed node id; "parent" and "mutation" edges from the
        candidate's parents, placed in the same generation; "carry" edges from a
        candidate's last placement in generation g to its place in generation g + 1."""
        graph = nx.DiGraph()
        candidates = {c.id: c for c in archive.candidates()}
        placed: dict[tuple[int, int], list[tuple[str, str]]] = {}  # (generation, candidate) -> [(stage, label)]
        rows = archive.placements()
        for label, cid, generation, stage, index in rows:
            c = candidates[cid]
            graph.add_node(label, generation=generation, stage=stage, index=index, candidate=cid,
                           operator=c.operator, fitness=c.fitness, mean_tokens=c.mean_tokens,
                           correctness=c.correctness, deltas=list(c.deltas.values()))
            placed.setdefault((generation, cid), []).append((stage, label))
        for generation, cid, category, reasoning in archive.selections():
            for stage, label in placed.get((generation, cid), []):
                if stage == "pop":
                    graph.nodes[label].update(selected=category, reasoning=reasoning)
        by_candidate = {cid: label for label, cid, _, stage, _ in rows if stage == "cand"}
        for label, cid, generation, stage, _ in rows:
            if stage == "cand":  # an archive strategy's candidate: one node, its parents anywhere
                kind = "mutation" if "mutation" in candidates[cid].operator else "parent"
                for parent in candidates[cid].parents:
                    if parent in by_candidate:
                        graph.add_edge(by_candidate[parent], label, kind=kind)
                continue
            if stage == "pop":
                source = _latest(placed.get((generation - 1, cid), []))
                if source is not None:
                    graph.add_edge(source, label, kind="carry")
                continue
            kind = "mutation" if stage == "mut" else "parent"
            wanted = "pre" if stage == "mut" else "pop"
            for parent in candidates[cid].parents:
                for parent_stage, parent_label in placed.get((generation, parent), []):
                    if parent_stage == wanted:
                        graph.add_edge(parent_label, label, kind=kind)
        for cid, _, _, ancestor, _, _ in archive.merges():  # GEPA: a merge's common ancestor
            if cid in by_candidate and ancestor in by_candidate:
                graph.nodes[by_candidate[cid]]["merge_ancestor"] = ancestor
                graph.add_edge(by_candidate[ancestor], by_candidate[cid], kind="ancestor")
        return cls(graph)

    def save(self, path: Path) -> None:
        atomic_write_json(path, nx.node_link_data(self.graph, edges="edges"))

    def render(self, path: Path) -> None:
        """Generations left to right (population, offspring, mutated columns); node colour
        and label are the fitness ("?" for a candidate never assessed)."""
        graph = self.graph
        if not graph:
            return
        pos = {n: (3 * d["generation"] + STAGE_X[d["stage"]], -d["index"]) for n, d in graph.nodes(data=True)}
        columns = 1 + max(x for x, _ in pos.values())
        rows = 1 - min(y for _, y in pos.values())
        fig, ax = plt.subplots(figsize=(min(max(8.0, 1.1 * columns), 200.0), min(max(4.0, 0.7 * rows), 100.0)))
        # Past the labelled size one arrowhead per edge costs minutes, and is too small to see.
        arrows = {"arrows": True, "arrowsize": 8} if len(graph) <= MAX_LABELLED_NODES else {"arrows": False}
        for kind, (colour, style) in EDGE_STYLE.items():
            edges = [(u, v) for u, v, d in graph.edges(data=True) if d["kind"] == kind]
            nx.draw_networkx_edges(graph, pos, edgelist=edges, edge_color=colour, style=style, ax=ax, node_size=420,
                                   **arrows)
        nodes = list(graph.nodes)
        # A run stopped inside its first step has placed candidates it never assessed.
        fitness = [math.nan if graph.nodes[n]["fitness"] is None else graph.nodes[n]["fitness"] for n in nodes]
        drawn = nx.draw_networkx_nodes(graph, pos, nodelist=nodes, node_color=fitness, cmap="RdYlGn",
                                       node_size=420, ax=ax)
        for category, colour in SELECTED_STYLE.items():
            chosen = [n for n in nodes if graph.nodes[n].get("selected") == category]
            if chosen:
                nx.draw_networkx_nodes(graph, pos, nodelist=chosen, node_color="none", edgecolors=colour,
                                       linewidths=2.5, node_size=620, ax=ax)
        if len(nodes) <= MAX_LABELLED_NODES:
            labels = {n: "?" if math.isnan(f) else f"{f:.3f}" for n, f in zip(nodes, fitness)}
            nx.draw_networkx_labels(graph, pos, labels,
                                    font_size=6, font_color="black", ax=ax)
        fig.colorbar(drawn, ax=ax, label="fitness", fraction=0.03)
        generations = sorted({d["generation"] for _, d in graph.nodes(data=True)})
        # At most MAX_TICKS labels: a long run's thousands of them took most of the drawing.
        generations = generations[::math.ceil(len(generations) / MAX_TICKS)]
        ax.set_xticks([3 * g for g in generations], [f"gen {g}" for g in generations])
        ax.tick_params(left=False, labelleft=False, bottom=True, labelbottom=True)
        handles = [Line2D([], [], color=c, linestyle=st, label=kind) for kind, (c, st) in EDGE_STYLE.items()]
        if any("selected" in d for _, d in graph.nodes(data=True)):
            handles += [Line2D([], [], marker="o", color=c, markerfacecolor="none", linestyle="none",
                               label=f"selected: {category}") for category, c in SELECTED_STYLE.items()]
        ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, fontsize=7, frameon=False)
        ax.set_title("Evolution tree: per generation, population | offspring | mutated offspring",
                     loc="left", fontsize=9)
        fig.tight_layout()
        save_figure(fig, path)


def _latest(placed: Sequence[tuple[str, str]]) -> str | None:
    """A candidate's final node in a generation: mutated over offspring over population."""
    return max(placed, key=lambda p: STAGE_X[p[0]])[1] if placed else None

"""The house stays readable: the package's imports, read with `ast` (lazy and
TYPE_CHECKING imports included), form no circle between files, and between its rooms (a
top-level module, or a top-level folder taken whole) at most one import runs back up. The
shared run services never import a strategy, and configuration stands below the engines."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import REPO

PACKAGE = REPO / "compressor_2"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(tree: ast.AST, known: dict[str, Path], importer: str) -> set[str]:
    """The package's modules `tree` imports; `from P import name` counts the submodule
    P.name where one exists, else P."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = importer.rsplit(".", node.level)[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    return found


def import_graph() -> nx.DiGraph:
    known = modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for name, path in known.items():
        for target in imported(ast.parse(path.read_text(encoding="utf-8")), known, name):
            if target != name:
                graph.add_edge(name, target)
    return graph


def room(module: str) -> str:
    """compressor_2.run.best -> compressor_2.run (a folder is one room); compressor_2.cli -> itself."""
    parts = module.split(".")
    return ".".join(parts[:2])


def room_graph(files: nx.DiGraph) -> nx.DiGraph:
    rooms = nx.DiGraph()
    rooms.add_nodes_from({room(m) for m in files})
    rooms.add_edges_from((room(a), room(b)) for a, b in files.edges if room(a) != room(b))
    return rooms


def back_up_imports(rooms: nx.DiGraph, most: int) -> int | None:
    """The fewest room-to-room imports whose removal leaves the rooms in floors (no circle),
    when that is at most `most`; None when more are needed."""
    inside = [edge for component in nx.strongly_connected_components(rooms) if len(component) > 1
              for edge in rooms.subgraph(component).edges]
    for k in range(most + 1):
        for removed in itertools.combinations(inside, k):
            trial = rooms.copy()
            trial.remove_edges_from(removed)
            if nx.is_directed_acyclic_graph(trial):
                return k
    return None


def test_the_import_reader_sees_the_package():
    graph = import_graph()
    # A few imports every reader of the code knows are there.
    for edge in [("compressor_2.cli", "compressor_2.config"),
                 ("compressor_2.commands.evolve", "compressor_2.strategies"),
                 ("compressor_2.strategies.ga.strategy", "compressor_2.run"),
                 ("compressor_2.strategies.gepa.strategy", "compressor_2.strategies.gepa.pareto")]:
        assert graph.has_edge(*edge), edge
    assert len(graph) > 60


def test_no_file_imports_itself_back():
    circles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert circles == []


def test_at_most_one_import_between_rooms_runs_back_up():
    assert back_up_imports(room_graph(import_graph()), most=1) is not None


def test_the_shared_services_never_import_a_strategy_and_config_stands_below_the_engines():
    rooms = room_graph(import_graph())
    below_than = {"compressor_2.run": "compressor_2.strategies", "compressor_2.config": "compressor_2.engines"}
    for lower, upper in below_than.items():
        assert upper not in nx.descendants(rooms, lower), f"{lower} reaches {upper}"


@pytest.mark.parametrize("edges, expected", [
    ([("a", "b"), ("b", "c")], 0),
    ([("a", "b"), ("b", "a")], 1),
    ([("a", "b"), ("b", "a"), ("b", "c"), ("c", "b")], None),  # two circles need two cuts
])
def test_the_back_up_count_is_the_fewest_cuts(edges, expected):
    assert back_up_imports(nx.DiGraph(edges), most=1) == expected


def test_lazy_and_type_checking_imports_count():
    known = modules()
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from compressor_2.run.services import Run\n"
                     "def f():\n    from compressor_2.strategies import load_strategy\n"
                     "    from compressor_2.resume import fields\n")
    assert imported(tree, known, "compressor_2.config.loader") == {
        "compressor_2.run.services", "compressor_2.strategies", "compressor_2.resume.fields"}

"""Issue V's rules for the strategies, read with `ast`: a strategy module holds its
decisions and nothing of the run's life (the run's driver owns it): no loop over steps, no
plot or tree call, no interrupt message, no SQL text. Every function in strategies/ and
run/ is at most 60 lines, and `evolve()` reads as its steps: at most 40 lines, nothing
nested deeper than 2."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "compressor_2"
STEP_COUNTS = {"ngen", "iterations", "batches", "generations", "steps"}
LIFE_CALLS = {"step", "stop_reason", "exhausted"}  # what a loop over steps would call
DRAWING_MODULES = ("compressor_2.outputs.plots", "compressor_2.outputs.tree", "compressor_2.outputs.refresh")
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WHERE|ORDER BY|IS (NOT )?NULL)\b|\w+ IN \(|\w+ = '")
INTERRUPT_TEXT = re.compile(r"interrupted|rerun the same command")
COMPOUND = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith)


def names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def called(node: ast.AST) -> set[str]:
    return {c.func.id if isinstance(c.func, ast.Name) else c.func.attr for c in ast.walk(node)
            if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants in `tree`: prose about the run may name it."""
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def offences(source: str) -> list[str]:
    """What in `source` a strategy module must not hold, one line each."""
    found, tree = [], ast.parse(source)
    prose = docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and "range" in called(node.iter) \
                and names(node.iter) & STEP_COUNTS:
            found.append(f"line {line}: a loop over steps")
        if isinstance(node, (ast.For, ast.While)) and called(node) & LIFE_CALLS:
            found.append(f"line {line}: a loop over steps")
        if isinstance(node, ast.While) and isinstance(node.test, ast.Constant) and node.test.value is True:
            found.append(f"line {line}: a loop over steps")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m.startswith(DRAWING_MODULES) for m in modules):
                found.append(f"line {line}: a plot or tree import")
        if isinstance(node, ast.Call) and called(node) & {"render", "EvolutionTree"} | {
                c for c in called(node) if c.startswith("plot_")}:
            found.append(f"line {line}: a plot or tree call")
        if isinstance(node, ast.ExceptHandler) and node.type is not None and "KeyboardInterrupt" in names(node.type):
            found.append(f"line {line}: an interrupt handler")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if INTERRUPT_TEXT.search(node.value):
                found.append(f"line {line}: an interrupt message")
            if SQL.search(node.value):
                found.append(f"line {line}: SQL text")
    return found


def strategy_modules() -> list[Path]:
    return sorted((PACKAGE / "strategies").rglob("*.py"))


@pytest.mark.parametrize("path", strategy_modules(), ids=lambda p: str(p.relative_to(PACKAGE / "strategies")))
def test_a_strategy_module_holds_only_its_decisions(path: Path):
    assert offences(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("source", [
    "for g in range(start, config.ngen):\n    pass\n",
    "while True:\n    reason = run.stop_reason()\n",
    "for t in count():\n    s.step(t)\n",
    "from compressor_2.outputs.plots import plot_fitness\n",
    "tree.render(out / TREE_PLOT)\n",
    "try:\n    f()\nexcept KeyboardInterrupt:\n    raise\n",
    "print(f'interrupted: rerun the same command: {cmd}')\n",
    "archive.candidates(\"status = 'evaluated' AND fitness IS NOT NULL\")\n",
    "archive.candidates(f\"id IN ({ids})\")\n",
])
def test_each_rule_sees_what_it_forbids(source: str):
    assert offences(source), source


def functions(path: Path) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def depth(node: ast.AST) -> int:
    """How deep compound statements nest inside `node`."""
    inner = [depth(child) for child in ast.iter_child_nodes(node)]
    return max(inner, default=0) + isinstance(node, COMPOUND)


def test_no_function_in_strategies_or_run_exceeds_60_lines():
    long = [f"{path.relative_to(REPO)}: {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for folder in ("strategies", "run") for path in sorted((PACKAGE / folder).glob("*.py"))
            for f in functions(path) if f.end_lineno - f.lineno + 1 > 60]
    assert long == []


def test_evolve_reads_as_its_steps():
    [evolve] = [f for f in functions(PACKAGE / "commands" / "evolve.py") if f.name == "evolve"]
    assert evolve.end_lineno - evolve.lineno + 1 <= 40
    assert depth(evolve) <= 2
    assert depth(ast.parse("def f():\n    with a:\n        for x in y:\n            if x:\n                pass\n")) == 3

"""Issue AA's measures of the house, read from the source: no module over 500 lines, no
folder of more than 12 modules, no function over 60 lines, one `Strategy` protocol, and no
SQL text outside the archive's folder; and issue AE's: no citation of a design document a
clone does not have, and no public name defined in two wings."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO
from tests.test_strategy_rules import SQL, docstrings

PACKAGE = REPO / "compressor_2"
MAX_MODULE_LINES = 500
MAX_MODULES = 12
MAX_FUNCTION_LINES = 60


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(REPO)): n for p in sources() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_folder_holds_more_than_12_modules():
    folders: dict[str, int] = {}
    for path in sources():
        folders[str(path.parent.relative_to(REPO))] = folders.get(str(path.parent.relative_to(REPO)), 0) + 1
    assert {folder: n for folder, n in folders.items() if n > MAX_MODULES} == {}


def test_no_function_is_over_60_lines():
    long = [f"{path.relative_to(REPO)}: {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sources() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_one_strategy_protocol():
    found = [f"{path.relative_to(REPO)}:{node.lineno}" for path in sources()
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
             and node.name.startswith("Strategy")]
    assert found == ["compressor_2/run/driver.py:" + str(_line_of("class Strategy(Protocol):"))]


def _line_of(text: str) -> int:
    return (PACKAGE / "run" / "driver.py").read_text().splitlines().index(text) + 1


def test_no_sql_text_outside_the_archive():
    found = []
    for path in sources():
        if path.parent == PACKAGE / "archive":
            continue
        tree = ast.parse(path.read_text())
        prose = docstrings(tree)
        found += [f"{path.relative_to(REPO)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
                  and SQL.search(node.value)]
    assert found == []


# "seed 000" and section signs: the design documents of the workspace the package was
# written in, which a clone does not have.
DESIGN_CITATION = re.compile(r"seed 00\d|\u00a7", re.IGNORECASE)


def test_no_design_document_is_cited():
    found = [f"{path.relative_to(REPO)}:{n}" for path in [*sources(), *PACKAGE.rglob("*.j2")]
             for n, line in enumerate(path.read_text().splitlines(), 1) if DESIGN_CITATION.search(line)]
    assert found == []


def _public_names(tree: ast.Module) -> set[str]:
    """Top-level functions, classes and constants without a leading underscore; a type
    variable and a runnable module's `main` are each module's own by convention."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            if isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "TypeVar":
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {name for name in names if not name.startswith("_") and name != "main"}


def test_no_public_name_is_defined_in_two_wings():
    wings: dict[str, set[str]] = defaultdict(set)
    for path in sources():
        wing = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for name in _public_names(ast.parse(path.read_text())):
            wings[name].add(wing)
    assert {name: sorted(found) for name, found in wings.items() if len(found) > 1} == {}

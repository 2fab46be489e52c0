"""The layers point down only: `journal` imports neither `projections` nor the app layer,
`projections` does not import the app layer, and the journal's public API carries no
projection concept: no projection table, field or identifier in its code (the
projections name their own tables and register their schema part by entry point)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import journal

ROOT = Path(__file__).resolve().parent.parent.parent
FORBIDDEN = {"journal": ("projections", "slicejournal"), "projections": ("slicejournal",)}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.timeout(30)
@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_upward(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & set(FORBIDDEN[package]))
        for path in (ROOT / package).rglob("*.py")
    }
    assert {p: found for p, found in offenders.items() if found} == {}


@pytest.mark.timeout(30)
def test_the_journal_api_has_no_projection_concept() -> None:
    assert [name for name in journal.__all__ if "projection" in name.lower()] == []
    assert not hasattr(journal, "UnknownProjection")
    assert not hasattr(journal, "EmbeddedServerError")  # the app layer's


# What the journal must not name: the projections' concepts and their tables. (Prose may
# say who reads the journal; code and SQL may not know it. "release" is not a lease.)
PROJECTION_WORDS = re.compile(
    r"projection|fleet|management|dead_?letter|offset_?(store|table)|(?<!re)lease"
)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def projection_names_in(path: Path) -> list[str]:
    """Identifiers and (non-docstring) string literals of `path` naming a projection concept."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = _docstrings(tree)
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            names.append(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.alias):
            names.append(node.asname or node.name)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            names.append(node.value)
    return sorted({n for n in names if PROJECTION_WORDS.search(n.lower())})


@pytest.mark.timeout(30)
def test_the_journal_code_names_no_projection_table_or_concept() -> None:
    offenders = {
        str(path.relative_to(ROOT)): projection_names_in(path)
        for path in (ROOT / "journal").rglob("*.py")
    }
    assert {p: found for p, found in offenders.items() if found} == {}


@pytest.mark.timeout(30)
def test_the_projection_check_catches_what_it_should(tmp_path: Path) -> None:
    """The scan above is not vacuous: a field, a table name and an attribute are caught."""
    source = tmp_path / "x.py"
    source.write_text(
        '"""Docstrings may say projections read the journal."""\n'
        'offset_table = "projection_timestamp_offset_store"\n'
        "t.lease_fence\n"
        'release = "a release"\n',
        encoding="utf-8",
    )
    assert projection_names_in(source) == [
        "lease_fence",
        "offset_table",
        "projection_timestamp_offset_store",
    ]

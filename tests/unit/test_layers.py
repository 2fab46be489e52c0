"""The layers point down only: `journal` imports neither `projections` nor the app layer,
`projections` does not import the app layer, and the journal's public API carries no
projection concept (the projections register their schema part by entry point)."""

from __future__ import annotations

import ast
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

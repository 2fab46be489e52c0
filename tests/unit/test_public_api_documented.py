"""Every public name has a docstring, and so does every public method and property of
every public class: the API reference (`./dev docs`) is generated from them."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

PACKAGES = ("journal", "projections", "projections.spark", "projections.fleet")


def undocumented(package: str) -> list[str]:
    module = importlib.import_module(package)
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            function = value.fget if isinstance(value, property) else value
            function = getattr(function, "__func__", function)
            if (inspect.isfunction(function) or isinstance(value, property)) and not (
                inspect.getdoc(function) or ""
            ).strip():
                missing.append(f"{name}.{attr}")
    return missing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_and_method_has_a_docstring(package: str) -> None:
    assert undocumented(package) == []


BASELINE = Path(__file__).parent / "data" / "public_api_0.2.0.txt"


def exported() -> set[str]:
    return {f"{p}.{n}" for p in PACKAGES for n in importlib.import_module(p).__all__}


@pytest.mark.timeout(60)
def test_every_name_exported_since_0_2_0_is_in_the_changelog() -> None:
    """A public name is a promise: one that `__all__` gains must be announced."""
    lines = BASELINE.read_text(encoding="utf-8").splitlines()
    before = {line for line in lines if line and not line.startswith("#")}
    changelog = (Path(__file__).parents[2] / "CHANGELOG.md").read_text(encoding="utf-8")
    unannounced = sorted(
        name for name in exported() - before if f"`{name.rsplit('.', 1)[1]}" not in changelog
    )
    assert unannounced == [], "exported but not in CHANGELOG.md (as `Name`): " + ", ".join(
        unannounced
    )

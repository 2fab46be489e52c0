"""Every public name has a docstring, and so does every public method and property of
every public class: the API reference (`./dev docs`) is generated from them."""

from __future__ import annotations

import importlib
import inspect

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

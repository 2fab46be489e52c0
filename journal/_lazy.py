"""Lazy re-exports, so that importing the pure core never loads the I/O stack.

`import journal.query.by_slice` runs `journal/__init__.py` first. If that
imported the drivers eagerly, every Spark executor or model test would pull in
psycopg, its pools and asyncio just to use a state machine. The package
`__init__`s therefore import their pure modules eagerly and resolve the
driver classes on first attribute access (PEP 562).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, importing `exports[name]` on first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        own = importlib.import_module(package).__dict__
        return sorted({*own, *exports})

    return __getattr__, __dir__

"""`project`, `project_changes` and `rebuild` refuse an `async def` handler before anything
runs: the executors call it synchronously, so it would never run while its offsets were
stored (a projection that silently applies nothing)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from journal.errors import InvalidArgument
from projections.spark import project, project_changes, rebuild


async def apply(conn: Any, envelopes: list[Any]) -> None:
    pass


class AsyncCall:
    async def __call__(self, conn: Any, envelopes: list[Any]) -> None:
        pass


@pytest.mark.parametrize("handler", [apply, functools.partial(apply), AsyncCall()])
def test_an_async_handler_is_refused_by_every_spark_entry_point(handler: Any) -> None:
    common = {"dsn": "postgresql://u@h/db", "name": "p", "entity_type": "A", "handler": handler}
    not_a_session = object()  # never reached: the handler is checked first
    with pytest.raises(InvalidArgument, match="async function"):
        project(not_a_session, checkpoint_location="/tmp/c", **common)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="async function"):
        project_changes(not_a_session, checkpoint_location="/tmp/c", **common)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="async function"):
        rebuild(not_a_session, read_models=["t"], **common)  # type: ignore[arg-type]

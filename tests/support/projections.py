"""The projection tests' settings, their bank journal (a fixture) and what they assert."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from psycopg import Connection, sql

from journal import BacktrackingSettings, EventEnvelope, Journal, JournalSettings, SliceRange
from projections import Projection, ProjectionSettings
from tests.support import bank
from tests.support.pg import fast_query_settings

FAST = ProjectionSettings(
    management_poll_interval=0.2,
    cleanup_interval=1.0,
    group_after_duration=0.1,
    save_offset_after_duration=0.1,
    progress_interval=0.5,
)


def journal_settings(schema: str) -> JournalSettings:
    return JournalSettings(
        schema=schema,
        pool_max_size=30,
        query=fast_query_settings(
            buffer_size=100, backtracking=BacktrackingSettings(window=20, behind_current_time=6)
        ),
    )


@pytest.fixture
async def bank_journal(pg_dsn: str, schema: str) -> AsyncIterator[Journal]:
    async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        await bank.create_read_model(j)
        yield j


async def assert_exact(j: Journal) -> None:
    await bank.wait_until_projected(j)
    balances, applied, distinct = await bank.projected(j)
    assert applied == distinct == await bank.journal_count(j)
    assert balances == await bank.expected_balances(j)


def whole_range(
    factory: Any, j: Journal, handler: Any, *, name: str = "balances", **options: Any
) -> Projection:
    """One instance over all slices of the bank entity, with the fast test settings."""
    options.setdefault("settings", FAST)
    return factory(
        j, name=name, entity_type=bank.ENTITY, slice_range=SliceRange(0, 1023),
        handler=handler, **options,
    )  # fmt: skip


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    what: str,
    within: float = 30.0,
    interval: float = 0.05,
) -> None:
    """Poll `check` (every `interval` s) until it is true; fail (naming `what`) if it never
    becomes true within `within` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            pytest.fail(f"never happened: {what}")
        await asyncio.sleep(interval)


def sync_handler(settings: JournalSettings) -> Any:
    schema = settings.schema
    applied = sql.SQL("INSERT INTO {} (pid, seq_nr) VALUES (%s, %s)").format(
        sql.Identifier(schema, "applied")
    )
    balance = sql.SQL(
        "INSERT INTO {b} (pid, balance) VALUES (%s, %s) "
        "ON CONFLICT (pid) DO UPDATE SET balance = {b}.balance + excluded.balance"
    ).format(b=sql.Identifier(schema, "balances"))

    def handler(conn: Connection[Any], env: EventEnvelope) -> None:
        conn.execute(applied, (env.persistence_id, env.seq_nr))
        conn.execute(balance, (env.persistence_id, env.event["amount"]))

    return handler

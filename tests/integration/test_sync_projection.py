"""The synchronous exactly-once runner on a real PostgreSQL, sharing the offset store
with the async runner: a projection run synchronously is resumed by the async runner
and the other way round, with every event applied exactly once (primary key)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg import Connection

from journal import EventEnvelope, Journal, SliceRange, SyncJournal
from projections import Projection, ProjectionError, RecoveryStrategy, SyncProjection
from tests.support import bank
from tests.support.projections import (
    FAST,
    assert_exact,
    journal_settings,
    sync_handler,
)

WHOLE = SliceRange(0, 1023)


async def write(j: Journal, accounts: range, amount: int) -> None:
    for i in accounts:
        pid = bank.account(i)
        await j.append(pid, [{"amount": amount}], expected_seq_nr=await j.highest_seq_nr(pid))


def backfill(pg_dsn: str, schema: str) -> int:
    """Run the sync runner until it has caught up; returns how many it applied."""
    settings = journal_settings(schema)
    with SyncJournal.connect(pg_dsn, settings) as sj:
        projection = SyncProjection.exactly_once(
            sj, name="balances", entity_type=bank.ENTITY, slice_range=WHOLE,
            handler=sync_handler(settings), settings=FAST,
        )  # fmt: skip
        return projection.run(until_caught_up=True).accepted


@pytest.mark.timeout(120)
async def test_sync_and_async_runners_hand_over_through_the_offset_store(
    bank_journal: Journal, pg_dsn: str
) -> None:
    j = bank_journal
    schema = j.settings.schema
    await write(j, range(40), 5)
    assert await asyncio.to_thread(backfill, pg_dsn, schema) == 40
    await assert_exact(j)

    await write(j, range(20, 60), 3)  # 20 known accounts, 20 new ones
    async_runner = Projection.exactly_once(
        j, name="balances", entity_type=bank.ENTITY, slice_range=WHOLE,
        handler=bank.make_handler(j), settings=FAST,
    )  # fmt: skip
    task = asyncio.create_task(async_runner.run())
    await assert_exact(j)
    await async_runner.stop()
    await task
    assert async_runner.stats.accepted == 40  # only what the sync runner had not applied

    await write(j, range(50, 70), 2)
    assert await asyncio.to_thread(backfill, pg_dsn, schema) == 20
    await assert_exact(j)
    assert await asyncio.to_thread(backfill, pg_dsn, schema) == 0  # nothing twice


@pytest.mark.timeout(60)
async def test_a_failing_sync_handler_fails_the_run(bank_journal: Journal, pg_dsn: str) -> None:
    await write(bank_journal, range(3), 1)
    settings = journal_settings(bank_journal.settings.schema)

    def broken(conn: Connection[Any], env: EventEnvelope) -> None:
        raise ValueError("cannot handle")

    def run() -> None:
        with SyncJournal.connect(pg_dsn, settings) as sj:
            SyncProjection.exactly_once(
                sj, name="b", entity_type=bank.ENTITY, slice_range=WHOLE, handler=broken,
                settings=FAST, recovery=RecoveryStrategy.retry_and_fail(2, 0.01),
            ).run(until_caught_up=True)  # fmt: skip

    with pytest.raises(ProjectionError, match="cannot handle"):
        await asyncio.to_thread(run)
    _, applied, _ = await bank.projected(bank_journal)
    assert applied == 0

"""Errors after connecting are `JournalError`s too, with psycopg's error as `__cause__`:
the journal's connections terminated mid-session (as a server restart does), a pool with
no free connection, a statement the server cancels; both flavours."""

from __future__ import annotations

import asyncio
import uuid

import attrs
import psycopg
import pytest
from psycopg import conninfo

from journal import (
    ConnectionLost,
    Journal,
    JournalError,
    JournalSettings,
    PoolExhausted,
    QueryCancelled,
    SyncJournal,
)


def tagged(dsn: str) -> tuple[str, str]:
    """The DSN with an application name of this test's own, and that name: the test then
    terminates only its own journal's connections, never anyone else's."""
    name = f"driver-errors-{uuid.uuid4().hex[:8]}"
    return conninfo.make_conninfo(dsn, application_name=name), name


async def terminate_backends(dsn: str, application: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            (application,),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


@pytest.mark.timeout(60)
async def test_terminated_connections_surface_as_connection_lost(
    pg_dsn: str, settings: JournalSettings
) -> None:
    dsn, name = tagged(pg_dsn)
    async with Journal.connect(dsn, settings, create_schema=True) as j:
        await j.append("Note|1", [{"n": 1}], expected_seq_nr=0)
        assert await terminate_backends(pg_dsn, name) > 0
        with pytest.raises(ConnectionLost) as lost:
            await j.append("Note|1", [{"n": 2}], expected_seq_nr=1)
        assert isinstance(lost.value.__cause__, psycopg.OperationalError)
        assert isinstance(lost.value, JournalError)
        # The pool replaces broken connections: the journal works again.
        for _ in range(20):
            try:
                await j.append("Note|1", [{"n": 2}], expected_seq_nr=1)
                break
            except ConnectionLost:
                await asyncio.sleep(0.05)
        assert await j.highest_seq_nr("Note|1") == 2


@pytest.mark.timeout(60)
def test_the_sync_journal_translates_the_same(pg_dsn: str, settings: JournalSettings) -> None:
    dsn, name = tagged(pg_dsn)
    with SyncJournal.connect(dsn, settings, create_schema=True) as j:
        j.append("Note|1", [{"n": 1}], expected_seq_nr=0)
        assert asyncio.run(terminate_backends(pg_dsn, name)) > 0
        with pytest.raises(ConnectionLost):
            j.highest_seq_nr("Note|1")


@pytest.mark.timeout(60)
async def test_a_cancelled_statement_and_an_exhausted_pool(
    pg_dsn: str, settings: JournalSettings
) -> None:
    one = attrs.evolve(settings, pool_min_size=1, pool_max_size=1)
    async with Journal.connect(pg_dsn, one, create_schema=True) as j:
        j.pool.timeout = 0.2
        async with j.pool.connection():  # the pool's only connection, held
            with pytest.raises(PoolExhausted) as exhausted:
                await j.append("Note|1", [{"n": 1}], expected_seq_nr=0)
        assert exhausted.value.__cause__ is not None
        async with j.pool.connection() as conn:  # the same connection comes back next
            await conn.execute("SET statement_timeout = '200ms'")
        # Another writer's uncommitted event 1 holds the key the append needs: the
        # append waits for it until the server cancels the statement.
        async with await psycopg.AsyncConnection.connect(pg_dsn) as other:
            await j.append("Note|2", [{"n": 1}], expected_seq_nr=0, conn=other)
            with pytest.raises(QueryCancelled) as cancelled:
                await j.append("Note|2", [{"n": 1}], expected_seq_nr=0)
            await other.rollback()
        assert isinstance(cancelled.value.__cause__, psycopg.errors.QueryCanceled)

"""Errors after connecting are `JournalError`s too, with psycopg's error as `__cause__`:
the journal's connections terminated mid-session (as a server restart does), a pool with
no free connection, a statement the server cancels; both flavours. A projection's `run()`,
a group and a fleet worker whose backends are terminated fail typed (or carry on), and
start again on fresh connections."""

from __future__ import annotations

import asyncio
import uuid
from functools import partial
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import conninfo

from journal import (
    ConnectionLost,
    EventEnvelope,
    Journal,
    JournalError,
    JournalSettings,
    PoolExhausted,
    QueryCancelled,
    SliceRange,
    SyncJournal,
)
from projections import Projection, ProjectionError, ProjectionGroup, ProjectionSettings
from projections.aio.runner import check_pools
from projections.fleet.worker import FleetWorker, WorkerSettings


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


# -- projections: run(), a group, a fleet worker, with their backends terminated ------------------


async def terminate_and_wait(dsn: str, application: str) -> int:
    """`terminate_backends` all at once (as a server restart ends them), then wait until
    every one has exited; how many there were."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        cur = await admin.execute(
            "WITH victim AS MATERIALIZED (SELECT pid FROM pg_stat_activity "
            "  WHERE datname = current_database() AND application_name = %s) "
            "SELECT coalesce(array_agg(pid), '{}') FROM victim WHERE pg_terminate_backend(pid)",
            (application,),
        )
        row = await cur.fetchone()
        pids = list(row[0]) if row else []
        for _ in range(500):
            cur = await admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            )
            left = await cur.fetchone()
            if left is not None and left[0] == 0:
                return len(pids)
            await asyncio.sleep(0.01)
        pytest.fail(f"backends {pids} did not exit")


def noting_projection(
    j: Journal, seen: list[int], slice_range: SliceRange = SliceRange.FULL
) -> Projection:
    async def handler(conn: Any, env: EventEnvelope) -> None:
        seen.append(env.event["n"])

    # The pause check every 50 ms: a terminated connection is met there as often as
    # in the offsets' load and save (issue #27 saw raw psycopg errors from both).
    return Projection.exactly_once(
        j, name="notes", entity_type="Note", slice_range=slice_range, handler=handler,
        settings=ProjectionSettings(group_after_duration=0.05, management_poll_interval=0.05),
    )  # fmt: skip


async def write_notes(j: Journal, first: int, count: int) -> None:
    # The setup's own writes: after a termination the write pool may still hold an idle
    # connection whose backend is gone (returned after the failed run tested the pools),
    # which an append would meet as ConnectionLost. What is tested is the projection.
    await check_pools(j)
    for n in range(first, first + count):
        await j.append(f"Note|{n}", [{"n": n}], expected_seq_nr=0)


def caught_up(seen: list[int], written: int) -> bool:
    return len(set(seen)) >= written


async def wait_for(check: Any, what: str, within: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"never happened: {what}")
        await asyncio.sleep(0.02)


@pytest.mark.timeout(120)
async def test_a_projection_whose_backends_are_terminated_fails_typed_and_restarts(
    pg_dsn: str, settings: JournalSettings
) -> None:
    """Terminated mid-run, from another connection, at a few different moments: `run()`
    raises a `JournalError` (a lost connection, or the stream's failure), never psycopg's
    `AdminShutdown`; run again, the same instance starts on fresh connections at once."""
    dsn, name = tagged(pg_dsn)
    async with Journal.connect(dsn, settings, create_schema=True) as j:
        seen: list[int] = []
        projection = noting_projection(j, seen)
        written = 0
        for trial in range(4):
            await write_notes(j, written, 5)
            written += 5
            running = asyncio.create_task(projection.run())
            await wait_for(partial(caught_up, seen, written), f"trial {trial}: caught up")
            await asyncio.sleep(0.03 * trial)  # a different moment of the poll loop each time
            assert await terminate_and_wait(pg_dsn, name) > 0
            with pytest.raises(JournalError) as failed:
                await asyncio.wait_for(running, 20)
            assert not isinstance(failed.value, psycopg.Error)
            assert isinstance(failed.value, ConnectionLost | ProjectionError), failed.value
            if isinstance(failed.value, ConnectionLost):
                assert isinstance(failed.value.__cause__, psycopg.OperationalError)
        # Restarted: the first statements run on checked connections, none fails.
        await write_notes(j, written, 5)
        stats = await asyncio.wait_for(projection.run(until_caught_up=True), 30)
        assert stats.accepted > 0 and set(seen) == set(range(written + 5))


@pytest.mark.timeout(120)
async def test_a_group_restarted_after_its_connections_were_terminated_works(
    pg_dsn: str, settings: JournalSettings
) -> None:
    dsn, name = tagged(pg_dsn)
    async with Journal.connect(dsn, settings, create_schema=True) as j:
        seen: list[int] = []
        group = ProjectionGroup(lambda r: noting_projection(j, seen, r), instances=2)
        await write_notes(j, 0, 10)
        await group.start()
        await wait_for(lambda: len(set(seen)) >= 10, "the group caught up")
        # Terminated while the group runs: the group's failure is typed.
        assert await terminate_and_wait(pg_dsn, name) > 0
        await wait_for(lambda: group.failed() is not None, "an instance failed")
        failure = group.failed()
        assert isinstance(failure, JournalError) and not isinstance(failure, psycopg.Error)
        with pytest.raises(JournalError):
            await group.stop()
        # Terminated again while the group is stopped: its pools hold only dead idle
        # connections now; started again, the same group starts on fresh ones.
        async with j.pool.connection(), j.read_pool.connection():
            pass  # (idle connections back in both pools)
        assert await terminate_and_wait(pg_dsn, name) > 0
        await group.start()
        await write_notes(j, 10, 10)
        await wait_for(lambda: len(set(seen)) >= 20, "the restarted group caught up")
        assert group.failed() is None
        await group.stop()
        assert set(seen) == set(range(20))


@pytest.mark.timeout(120)
async def test_a_fleet_worker_started_on_terminated_idle_connections_runs(
    pg_dsn: str, settings: JournalSettings
) -> None:
    dsn, name = tagged(pg_dsn)
    async with Journal.connect(dsn, settings, create_schema=True) as j:
        seen: list[int] = []
        await write_notes(j, 0, 10)
        assert await terminate_and_wait(pg_dsn, name) > 0  # the pools' idle connections
        worker = FleetWorker(
            j,
            lambda journal, r: noting_projection(journal, seen, r),
            WorkerSettings(worker_id="w1", instances=1, lease_ttl=2.0),
        )
        running = asyncio.create_task(worker.run())
        await wait_for(lambda: len(set(seen)) >= 10 or running.done(), "the worker caught up")
        worker.stop()
        await asyncio.wait_for(running, 20)  # raises what ended it, if anything did
        assert set(seen) == set(range(10))

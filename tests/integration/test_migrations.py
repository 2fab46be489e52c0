"""Upgrading a journal through releases, on a real PostgreSQL.

A database created by release 0.1.0's DDL (the files of that release, kept
in tests/data/release_0_1_0) and filled with events, snapshots, offsets and a
lease is refused by this release until `slicejournal migrate` has run; then
every event, snapshot, offset and lease is still there and the journal reads,
projects and appends. Migrating is idempotent and safe when deploys race; a
schema migrated by a newer release is refused; and the rolling order —
migrate while the old release keeps writing, then start the new workers —
loses nothing. A step blocked by an open transaction gives up after its lock
timeout, and one whose client was killed stops waiting on the server.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql

from journal import (
    Journal,
    JournalError,
    JournalSettings,
    LockTimeout,
    SchemaNotInitialized,
    SchemaOutdated,
    SchemaTooNew,
    SliceRange,
    SyncJournal,
)
from journal.aio.migrate import migrate, read_versions
from journal.schema import components
from journal.tables import Tables
from projections import Projection, ProjectionSettings, ProjectionTableNames
from projections.fleet.lease_sql import FleetSql
from projections.tables import ProjectionTables
from tests.support import bank
from tests.support.pg import fast_query_settings, fetch

RELEASE_0_1_0 = Path(__file__).resolve().parent.parent / "data" / "release_0_1_0"
FAST = ProjectionSettings(group_after_duration=0.05, management_poll_interval=0.2)


def settings_of(schema: str) -> JournalSettings:
    return JournalSettings(schema=schema, query=fast_query_settings())


def create_as_release_0_1_0(dsn: str, settings: JournalSettings) -> None:
    """What `slicejournal init` of release 0.1.0 did: its two DDL files, in one transaction."""
    journal = Tables(settings)
    names = {**journal.ddl_names(), **ProjectionTables(journal).ddl_names()}
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        for name in ("journal.sql", "projections.sql"):
            text = (RELEASE_0_1_0 / name).read_text(encoding="utf-8")
            conn.execute(sql.SQL(text).format(**names))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slicejournal.cli", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def projection(j: Journal) -> Projection:
    return Projection.exactly_once(
        j, name="balances", entity_type=bank.ENTITY, slice_range=SliceRange.FULL,
        handler=bank.make_handler(j), settings=FAST,
    )  # fmt: skip


async def write(j: Journal, accounts: range, amount: int) -> None:
    for i in accounts:
        pid = bank.account(i)
        await j.append(pid, [{"amount": amount}], expected_seq_nr=await j.highest_seq_nr(pid))


async def project_until_caught_up(j: Journal) -> int:
    stats = await projection(j).run(until_caught_up=True)
    return stats.accepted


async def snapshot_index(dsn: str, schema: str) -> list[Any]:
    return await fetch(
        dsn,
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND indexname = %s",
        (schema, "snapshot_slice_idx"),
    )


@pytest.mark.timeout(240)
async def test_a_release_0_1_0_database_migrates_and_keeps_everything(
    pg_dsn: str, schema: str
) -> None:
    settings = settings_of(schema)
    create_as_release_0_1_0(pg_dsn, settings)
    # Filled as 0.1.0 would have: the same statements, without the version check.
    async with Journal.connect(pg_dsn, settings, check_schema=False) as old:
        await bank.create_read_model(old)
        await write(old, range(30), 10)
        await old.save_snapshot(bank.account(1), 1, {"balance": 10})
        async with old.pool.connection() as conn:  # saved as 0.1.0 did: at its save time
            await conn.execute(
                sql.SQL("UPDATE {} SET db_timestamp = clock_timestamp()").format(
                    old.tables.snapshot
                )
            )
        assert await project_until_caught_up(old) == 30
        fleet = FleetSql(ProjectionTables(old.tables))
        async with old.pool.connection() as conn:
            await conn.execute(fleet.claim, fleet.claim_params("balances", SliceRange.FULL,
                                                               "old-worker", 60_000))  # fmt: skip
    offsets_before = await fetch(pg_dsn, sql.SQL("SELECT * FROM {} ORDER BY 1, 2, 3, 4, 5").format(
        ProjectionTables(Tables(settings)).offset_store))  # fmt: skip
    assert offsets_before

    with pytest.raises(SchemaOutdated, match="slicejournal migrate"):
        async with Journal.connect(pg_dsn, settings):
            pass
    dry = cli("migrate", "--dry-run", "--dsn", pg_dsn, "--schema", schema)
    assert dry.returncode == 0, dry.stderr
    assert "would apply journal 0002_snapshot_slice_index" in dry.stdout
    assert await snapshot_index(pg_dsn, schema) == []  # a dry run applies nothing
    done = cli("migrate", "--dsn", pg_dsn, "--schema", schema)
    assert done.returncode == 0, done.stderr
    assert "applied journal 0002_snapshot_slice_index" in done.stdout
    assert await snapshot_index(pg_dsn, schema) == [("snapshot_slice_idx",)]

    async with Journal.connect(pg_dsn, settings) as j:
        assert await bank.journal_count(j) == 30
        snap = await j.load_snapshot(bank.account(1))
        assert snap is not None and snap.state == {"balance": 10}
        # 0004: the snapshot now stands where its event stands (start from snapshots).
        event = await j.load_envelope(bank.account(1), 1)
        assert event is not None and snap.db_timestamp == event.db_timestamp
        after = await fetch(pg_dsn, sql.SQL("SELECT * FROM {} ORDER BY 1, 2, 3, 4, 5").format(
            ProjectionTables(j.tables).offset_store))  # fmt: skip
        assert after == offsets_before
        leases = await fetch(
            pg_dsn, sql.SQL("SELECT owner FROM {}").format(ProjectionTables(j.tables).lease)
        )
        assert leases == [("old-worker",)]
        await write(j, range(20, 40), 5)  # 10 known accounts, 10 new ones
        assert await project_until_caught_up(j) == 20  # resumes from the 0.1.0 offsets
        await bank.assert_applied_exactly_once(j)
    again = cli("migrate", "--dsn", pg_dsn, "--schema", schema)
    assert again.returncode == 0 and "(0 step(s) applied)" in again.stdout


@pytest.mark.timeout(120)
async def test_racing_migrations_apply_every_step_once(pg_dsn: str, schema: str) -> None:
    settings = settings_of(schema)

    async def one() -> list[str]:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            return [str(m) for m in await migrate(conn, settings)]

    results = await asyncio.gather(*(one() for _ in range(4)))
    applied = [step for steps in results for step in steps]
    expected = [str(m) for c in components() for m in c.migrations()]
    assert sorted(applied) == sorted(expected), results  # each step by exactly one deploy
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        versions = await read_versions(conn, Tables(settings))
        assert await migrate(conn, settings) == []  # and again: nothing to do
    journal = Tables(settings)
    assert versions == {c.key(c.tables(journal)): c.head for c in components()}
    async with Journal.connect(pg_dsn, settings) as j:
        await j.append("Note|1", [{"n": 1}], expected_seq_nr=0)


@pytest.mark.timeout(60)
async def test_a_schema_migrated_by_a_newer_release_is_refused(pg_dsn: str, schema: str) -> None:
    settings = settings_of(schema)
    async with Journal.connect(pg_dsn, settings, create_schema=True):
        pass
    table = Tables(settings).schema_version
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {} SET version = version + 1 WHERE component LIKE 'journal(%%'").format(
                table
            )
        )
    with pytest.raises(SchemaTooNew, match="refuses"):
        async with Journal.connect(pg_dsn, settings):
            pass
    with pytest.raises(SchemaTooNew):
        await asyncio.to_thread(lambda: SyncJournal.connect(pg_dsn, settings).__enter__())
    with pytest.raises(SchemaTooNew):  # not even create_schema=True writes to it
        async with Journal.connect(pg_dsn, settings, create_schema=True):
            pass


@pytest.mark.timeout(60)
async def test_an_empty_database_is_not_initialised_and_init_is_migrate(
    pg_dsn: str, schema: str
) -> None:
    settings = settings_of(schema)
    with pytest.raises(SchemaNotInitialized, match="slicejournal migrate"):
        async with Journal.connect(pg_dsn, settings):
            pass
    result = cli("migrate", "--dsn", pg_dsn, "--schema", schema)
    assert result.returncode == 0, result.stderr
    async with Journal.connect(pg_dsn, settings) as j:
        assert await j.highest_seq_nr("Note|1") == 0


@pytest.mark.timeout(240)
async def test_rolling_upgrade_migrate_first_then_workers(pg_dsn: str, schema: str) -> None:
    """The documented order: the old release keeps writing and projecting while the
    migration runs (every step only adds), a new worker started before the migration
    is refused, and the new workers started after it apply every event once."""
    settings = settings_of(schema)
    create_as_release_0_1_0(pg_dsn, settings)
    async with Journal.connect(pg_dsn, settings, check_schema=False) as old:
        await bank.create_read_model(old)
        writers = bank.Writers(old, 60, late_fraction=0.1, seed=5)
        old_worker = projection(old)
        running = asyncio.create_task(old_worker.run())
        writers.start(writers=3)
        await asyncio.sleep(1.0)
        with pytest.raises(SchemaOutdated):  # a new worker too early
            async with Journal.connect(pg_dsn, settings):
                pass
        result = await asyncio.to_thread(cli, "migrate", "--dsn", pg_dsn, "--schema", schema)
        assert result.returncode == 0, result.stderr
        await asyncio.sleep(1.0)  # old writers and the old worker go on after it
        await writers.stop()
        await old_worker.stop()
        await running
    async with Journal.connect(pg_dsn, settings) as new:
        await write(new, range(50, 70), 1)
        group = asyncio.create_task(projection(new).run())
        try:
            await bank.assert_applied_exactly_once(new)
        finally:
            group.cancel()
            with pytest.raises(asyncio.CancelledError):
                await group


@pytest.mark.timeout(60)
async def test_projections_under_other_names_are_migrated_and_checked(
    pg_dsn: str, schema: str
) -> None:
    """The projections name their own tables: created under those names only, and the
    journal's check (which cannot know them) reads every projections installation."""
    settings = settings_of(schema)
    names = ProjectionTableNames(offset_table="offsets", lease_table="leases")
    async with Journal.connect(pg_dsn, settings, check_schema=False) as j:
        await j.create_schema(tables=[names])  # the names themselves: the documented way
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        versions = await read_versions(conn, Tables(settings))
    heads = {c.name: c.head for c in components()}
    assert versions == {
        "journal(event_journal,snapshot)": heads["journal"],
        "projections(offsets,projection_management,projection_dead_letter,"
        "projection_fleet,projection_fleet_worker,leases)": heads["projections"],
    }
    async with Journal.connect(pg_dsn, settings) as j:  # at this release: accepted
        projection = Projection.exactly_once(
            j, name="balances", entity_type=bank.ENTITY, slice_range=SliceRange.FULL,
            handler=bank.make_handler(j), settings=attrs.evolve(FAST, tables=names),
        )  # fmt: skip
        await bank.create_read_model(j)
        await write(j, range(3), 10)
        assert (await projection.run(until_caught_up=True)).accepted == 3
    stored = await fetch(pg_dsn, sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(schema, "offsets")))  # fmt: skip
    assert stored[0][0] > 0
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {} SET version = version + 1 WHERE component LIKE 'projections(%%'")
            .format(Tables(settings).schema_version)
        )  # fmt: skip
    with pytest.raises(SchemaTooNew):
        async with Journal.connect(pg_dsn, settings):
            pass


# -- a step blocked by an open transaction: bounded by the lock timeout, ended with its client --


async def migration_backend(dsn: str, application: str) -> int | None:
    """The pid of the backend named `application` while it waits for a lock, else None."""
    rows = await fetch(
        dsn,
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        (application,),
    )
    return int(rows[0][0]) if rows else None


async def until(check: Any, what: str, within: float = 30.0) -> Any:
    """Poll the coroutine function `check` until it returns something true; that."""
    deadline = asyncio.get_running_loop().time() + within
    while not (found := await check()):
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"never happened: {what}")
        await asyncio.sleep(0.02)
    return found


@pytest.mark.timeout(60)
async def test_a_step_behind_an_open_transaction_gives_up_after_its_lock_timeout(
    pg_dsn: str, schema: str
) -> None:
    """The snapshot index waits for a transaction that wrote a snapshot and has not ended;
    every later snapshot write queues behind the waiting step. The step gives up after
    `migration_lock_timeout` with a `LockTimeout` that says what to do, the writes queued
    behind it go through, and the step applies once the transaction has ended."""
    settings = settings_of(schema)
    create_as_release_0_1_0(pg_dsn, settings)
    application = f"migrate-{schema}"
    async with (
        Journal.connect(pg_dsn, settings, check_schema=False) as old,
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as holder,
    ):
        async with holder.transaction():  # a service's transaction that saved a snapshot
            await old.save_snapshot(bank.account(1), 1, {"balance": 1}, conn=holder)
            waiting = attrs.evolve(settings, migration_lock_timeout=1.5)
            async with await psycopg.AsyncConnection.connect(
                pg_dsn, autocommit=True, application_name=application
            ) as conn:
                migrating = asyncio.create_task(migrate(conn, waiting))
                await until(lambda: migration_backend(pg_dsn, application), "a waiting step")
                loop = asyncio.get_running_loop()
                began = loop.time()
                await asyncio.wait_for(old.save_snapshot(bank.account(2), 1, {"b": 2}), 10)
                queued = loop.time() - began
                with pytest.raises(LockTimeout) as gave_up:
                    await migrating
        assert 0.5 < queued < 6, queued  # queued behind the step, until it gave up
        message = str(gave_up.value)
        assert "journal 0002_snapshot_slice_index" in message and "1.5 s" in message
        assert "lock timeout" in message and "JournalSettings.migration_lock_timeout" in message
        assert "Retry `slicejournal migrate`" in message and "--lock-timeout" in message
        assert "\n" not in message
        assert isinstance(gave_up.value, JournalError)
        assert isinstance(gave_up.value.__cause__, psycopg.errors.LockNotAvailable)
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            versions = await read_versions(conn, Tables(settings))
            assert versions == {"journal(event_journal,snapshot)": 1}  # the step before stays
            assert await snapshot_index(pg_dsn, schema) == []
            # The transaction has ended: the same call now applies the rest.
            applied = [str(m) for m in await migrate(conn, waiting)]
            assert "journal 0002_snapshot_slice_index" in applied
        assert await snapshot_index(pg_dsn, schema) == [("snapshot_slice_idx",)]
        snap = await old.load_snapshot(bank.account(1))
        assert snap is not None and snap.state == {"balance": 1}


@pytest.mark.timeout(120)
async def test_a_killed_migrate_stops_waiting_on_the_server(pg_dsn: str, schema: str) -> None:
    """`slicejournal migrate --lock-timeout` gives up in one line with a retry hint; one
    with a long lock timeout killed (SIGKILL) while its step waits leaves no backend
    behind waiting (and queueing writes) on the server: it is gone within seconds."""
    settings = settings_of(schema)
    create_as_release_0_1_0(pg_dsn, settings)
    application = f"migrate-{schema}"
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, application_name=application)
    async with (
        Journal.connect(pg_dsn, settings, check_schema=False) as old,
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as holder,
    ):
        async with holder.transaction():
            await old.save_snapshot(bank.account(1), 1, {"balance": 1}, conn=holder)
            args = ["migrate", "--dsn", dsn, "--schema", schema]
            short = await asyncio.to_thread(cli, *args, "--lock-timeout", "0.5")
            assert short.returncode == 1, short.stdout + short.stderr
            lines = short.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in short.stderr, short.stderr
            assert lines[0].startswith("slicejournal: error: migration step journal 0002")
            assert "0.5 s" in lines[0] and "Retry `slicejournal migrate`" in lines[0]

            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "slicejournal.cli", *args, "--lock-timeout", "600",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                pid = await until(lambda: migration_backend(pg_dsn, application), "a wait")
                writer = asyncio.create_task(old.save_snapshot(bank.account(2), 1, {"b": 2}))
                await asyncio.sleep(0.3)
                assert not writer.done()  # queued behind the waiting step
            finally:
                process.kill()  # SIGKILL: no cleanup of any kind on the client's side
                await asyncio.wait_for(process.wait(), 10)
            loop = asyncio.get_running_loop()
            killed = loop.time()

            async def gone() -> bool:
                rows = await fetch(pg_dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                   (pid,))  # fmt: skip
                return not rows

            await until(gone, "the killed migrate's backend ends", within=10)
            assert loop.time() - killed < 5
            await asyncio.wait_for(writer, 5)  # and the write queued behind it went through
        result = await asyncio.to_thread(cli, *args)
        assert result.returncode == 0, result.stderr
        assert await snapshot_index(pg_dsn, schema) == [("snapshot_slice_idx",)]

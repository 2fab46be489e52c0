"""Projections over durable state on a real server (issue #31): exactly-once and grouped
over `changes_by_slices`, through a rescaled `ProjectionGroup` while writers race with
optimistic revisions and hold transactions open; deletes; a restart; the sync twin."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection, Connection, sql

from journal import (
    ConcurrencyError,
    DurableStateChange,
    DurableStateStore,
    Journal,
    SliceRange,
    SyncDurableStateStore,
    SyncJournal,
)
from journal.query.source import STATE_CHANGES
from projections import (
    Projection,
    ProjectionGroup,
    ProjectionManagement,
    ProjectionSettings,
    RecoveryStrategy,
    SyncProjection,
)
from projections.aio.offset_dao import read_backlog
from projections.management_sql import ManagementSql
from projections.tables import ProjectionTables
from projections.telemetry import RecordingTelemetry
from tests.support.long_transactions import horizon_settings
from tests.support.projections import FAST, eventually

ENTITY = "Cart"
ALL = SliceRange(0, 1023)


async def create_read_model(pg_dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {model} (pid TEXT PRIMARY KEY, revision BIGINT NOT NULL, "
                "deleted BOOLEAN NOT NULL);"
                "CREATE TABLE {applied} (pid TEXT, revision BIGINT, PRIMARY KEY (pid, revision))"
            ).format(
                model=sql.Identifier(schema, "state_model"),
                applied=sql.Identifier(schema, "state_applied"),
            )
        )


def apply_statements(schema: str) -> tuple[sql.Composed, sql.Composed]:
    # A revision applied twice fails on the side table's primary key (and so the batch).
    applied = sql.SQL("INSERT INTO {} (pid, revision) VALUES (%s, %s)").format(
        sql.Identifier(schema, "state_applied")
    )
    model = sql.SQL(
        "INSERT INTO {t} (pid, revision, deleted) VALUES (%s, %s, %s) "
        "ON CONFLICT (pid) DO UPDATE SET revision = EXCLUDED.revision, deleted = EXCLUDED.deleted"
    ).format(t=sql.Identifier(schema, "state_model"))
    return applied, model


def check_change(change: DurableStateChange) -> None:
    # Every state written below names its revision: a loaded value matches the change.
    assert change.value_loaded, change
    if change.deleted:
        assert change.value is None
    else:
        assert change.value["rev"] == change.revision, change


def exactly_once_handler(schema: str) -> Any:
    applied, model = apply_statements(schema)

    async def handler(conn: AsyncConnection[Any], change: DurableStateChange) -> None:
        check_change(change)
        await conn.execute(applied, (change.persistence_id, change.revision))
        await conn.execute(model, (change.persistence_id, change.revision, change.deleted))

    return handler


def grouped_handler(schema: str) -> Any:
    applied, model = apply_statements(schema)

    async def handler(conn: AsyncConnection[Any], changes: list[DurableStateChange]) -> None:
        for change in changes:
            check_change(change)
            await conn.execute(applied, (change.persistence_id, change.revision))
            await conn.execute(model, (change.persistence_id, change.revision, change.deleted))

    return handler


async def read_model(pg_dsn: str, schema: str) -> dict[str, tuple[int, bool]]:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT pid, revision, deleted FROM {}").format(
                sql.Identifier(schema, "state_model")
            )
        )
        return {p: (r, d) for p, r, d in await cur.fetchall()}


async def applied_rows(pg_dsn: str, schema: str) -> list[tuple[str, int]]:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT pid, revision FROM {}").format(sql.Identifier(schema, "state_applied"))
        )
        return [(p, int(r)) for p, r in await cur.fetchall()]


async def stored_states(j: Journal) -> dict[str, tuple[int, bool]]:
    deleted = sql.SQL("(state_ser_id = 0 AND octet_length(state_payload) = 0)")
    async with j.pool.connection() as conn:
        cur = await conn.execute(
            sql.SQL("SELECT persistence_id, revision, {} FROM {}").format(
                deleted, j.tables.durable_state
            )
        )
        return {p: (int(r), bool(d)) for p, r, d in await cur.fetchall()}


class Writers:
    """Writers racing on the same ids with optimistic revisions (retried on
    `ConcurrencyError`); some upserts are held open 1-3 s inside a transaction."""

    def __init__(self, store: DurableStateStore, pg_dsn: str, pids: list[str]) -> None:
        self.store = store
        self.pg_dsn = pg_dsn
        self.pids = pids
        self.stop = asyncio.Event()
        self.refused = 0
        self.held = 0
        self.deleted = 0

    async def write(self, rng: random.Random) -> None:
        pid = rng.choice(self.pids)
        for _ in range(50):  # retried with the revision read again
            current = await self.store.get(pid)
            revision = 1 if current is None else current.revision + 1
            try:
                if current is not None and not current.deleted and rng.random() < 0.05:
                    await self.store.delete(pid, revision=revision)
                    self.deleted += 1
                elif rng.random() < 0.04:
                    async with await psycopg.AsyncConnection.connect(self.pg_dsn) as conn:
                        await conn.execute("SELECT 1")  # the transaction starts now
                        await self.store.upsert(
                            pid, {"rev": revision}, revision=revision, conn=conn
                        )
                        await asyncio.sleep(rng.uniform(1, 3))
                        await conn.commit()
                    self.held += 1
                else:
                    await self.store.upsert(pid, {"rev": revision}, revision=revision)
                return
            except ConcurrencyError:
                self.refused += 1

    async def run(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            await self.write(rng)
            await asyncio.sleep(rng.uniform(0.002, 0.02))


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_exactly_once_over_changes_rescaled_under_racing_writers(
    pg_dsn: str, schema: str
) -> None:
    async with Journal.connect(
        pg_dsn, horizon_settings(schema, max_hold=4), create_schema=True
    ) as j:
        await create_read_model(pg_dsn, schema)
        store = DurableStateStore(j)
        writers = Writers(store, pg_dsn, [f"{ENTITY}|{i}" for i in range(40)])
        handler = exactly_once_handler(schema)
        group = ProjectionGroup(
            lambda r: Projection.exactly_once_changes(
                j, name="carts", entity_type=ENTITY, slice_range=r, handler=handler,
                settings=FAST,
            ),
            4,
        )  # fmt: skip
        tasks = [asyncio.create_task(writers.run(seed)) for seed in range(4)]
        await group.start()
        try:
            for n in (8, 2):
                await asyncio.sleep(4)
                assert group.failed() is None
                await group.rescale(n)
            await asyncio.sleep(4)
        finally:
            writers.stop.set()
            await asyncio.gather(*tasks)
        final = await stored_states(j)

        async def caught_up() -> bool:
            return await read_model(pg_dsn, schema) == final

        await eventually(caught_up, "the read model holds every id's latest revision", 60)
        assert group.failed() is None
        await group.stop()
        assert writers.refused > 0 and writers.held > 0 and writers.deleted > 0
        applied = await applied_rows(pg_dsn, schema)
        assert len(applied) == len(set(applied))  # the primary key says so too
        # Some revisions were overwritten before any query saw them: gaps are normal.
        assert len(applied) < sum(r for r, _ in final.values())
        stats = group.stats()
        assert sum(s.accepted for s in stats) == len(applied)
        assert sum(s.rejected + s.gaps_filled for s in stats) == 0


@pytest.mark.slow
async def test_grouped_changes_with_deletes(pg_dsn: str, schema: str) -> None:
    async with Journal.connect(pg_dsn, horizon_settings(schema), create_schema=True) as j:
        await create_read_model(pg_dsn, schema)
        store = DurableStateStore(j)
        handler = grouped_handler(schema)
        group = ProjectionGroup(
            lambda r: Projection.grouped_changes(
                j, name="carts", entity_type=ENTITY, slice_range=r, handler=handler,
                settings=FAST,
            ),
            2,
        )  # fmt: skip
        async with group:
            for i in range(30):
                for rev in (1, 2, 3):
                    await store.upsert(f"{ENTITY}|{i}", {"rev": rev}, revision=rev)
            for i in range(0, 30, 3):
                await store.delete(f"{ENTITY}|{i}", revision=4)
            await store.upsert(f"{ENTITY}|0", {"rev": 5}, revision=5)  # back after a delete
            await store.upsert("Other|1", {"rev": 1}, revision=1)  # another entity type
            final = await stored_states(j)
            del final["Other|1"]

            async def caught_up() -> bool:
                return await read_model(pg_dsn, schema) == final

            await eventually(caught_up, "deletes reach the read model")
        model = await read_model(pg_dsn, schema)
        assert model[f"{ENTITY}|3"] == (4, True) and model[f"{ENTITY}|0"] == (5, False)
        assert model[f"{ENTITY}|1"] == (3, False)
        stats = group.stats()
        assert sum(s.transactions for s in stats) < sum(s.accepted for s in stats)


async def test_a_restart_resumes_from_stored_offsets(pg_dsn: str, schema: str) -> None:
    async with Journal.connect(pg_dsn, horizon_settings(schema), create_schema=True) as j:
        await create_read_model(pg_dsn, schema)
        store = DurableStateStore(j)

        def projection() -> Projection:
            return Projection.exactly_once_changes(
                j, name="carts", entity_type=ENTITY, slice_range=ALL,
                handler=exactly_once_handler(schema), settings=FAST,
            )  # fmt: skip

        for i in range(20):
            await store.upsert(f"{ENTITY}|{i}", {"rev": 1}, revision=1)
        first = await projection().run(until_caught_up=True)
        assert first.accepted == 20
        for i in range(5):
            await store.upsert(f"{ENTITY}|{i}", {"rev": 2}, revision=2)
        await store.delete(f"{ENTITY}|19", revision=2)
        # A fresh instance (a restart) applies only what changed; the side table's primary
        # key would fail it on any revision applied again.
        second = await projection().run(until_caught_up=True)
        assert second.accepted == 6
        assert len(await applied_rows(pg_dsn, schema)) == 26
        assert await read_model(pg_dsn, schema) == await stored_states(j)
        # A live run from there: nothing to apply until a new revision.
        p = projection()
        task = asyncio.create_task(p.run())
        await store.upsert(f"{ENTITY}|7", {"rev": 2}, revision=2)

        async def applied() -> bool:
            return (await read_model(pg_dsn, schema))[f"{ENTITY}|7"] == (2, False)

        await eventually(applied, "the live run applies the new revision")
        await p.stop()
        stats = await task
        assert stats.accepted == 1
        assert len(await applied_rows(pg_dsn, schema)) == 27


def test_the_sync_twin(pg_dsn: str, schema: str) -> None:
    with SyncJournal.connect(pg_dsn, horizon_settings(schema), create_schema=True) as j:
        asyncio.run(create_read_model(pg_dsn, schema))
        store = SyncDurableStateStore(j)
        for rev in (1, 2, 3):
            store.upsert(f"{ENTITY}|s", {"rev": rev}, revision=rev)
        store.upsert(f"{ENTITY}|t", {"rev": 1}, revision=1)
        store.delete(f"{ENTITY}|t", revision=2)
        seen: list[tuple[str, int, bool]] = []

        def handler(conn: Connection[Any], changes: list[DurableStateChange]) -> None:
            for c in changes:
                check_change(c)
                seen.append((c.persistence_id, c.revision, c.deleted))

        p = SyncProjection.grouped_changes(
            j, name="carts", entity_type=ENTITY, slice_range=ALL, handler=handler, settings=FAST
        )
        stats = p.run(until_caught_up=True)
        assert sorted(seen) == [(f"{ENTITY}|s", 3, False), (f"{ENTITY}|t", 2, True)]
        assert stats.accepted == 2
        assert (
            SyncProjection.grouped_changes(
                j, name="carts", entity_type=ENTITY, slice_range=ALL, handler=handler, settings=FAST
            )
            .run(until_caught_up=True)
            .accepted
            == 0
        )


@pytest.mark.timeout(60)
async def test_a_change_projections_backlog_counts_the_durable_states_changes(
    pg_dsn: str, schema: str
) -> None:
    """The backlog (status, telemetry) of a projection over durable state is read from the
    durable state's table, not the journal's: each id's changes it has not handled."""
    async with Journal.connect(pg_dsn, horizon_settings(schema), create_schema=True) as j:
        store = DurableStateStore(j)
        for i in range(12):
            await store.upsert(f"{ENTITY}|b{i}", {"rev": 1}, revision=1)
        await store.delete(f"{ENTITY}|b0", revision=2)  # a deletion is a change too
        await j.append(f"{ENTITY}|an-event", [{"n": 1}], expected_seq_nr=0)
        tables = ProjectionTables(j.tables, ProjectionSettings().tables)
        statements = ManagementSql(tables)
        async with j.pool.connection() as conn:
            changes = await read_backlog(
                conn, statements, "cart-backlog", ENTITY, ALL, source=STATE_CHANGES
            )
            events = await read_backlog(conn, statements, "cart-backlog", ENTITY, ALL)
        assert (changes.size, events.size) == (12, 1)
        assert changes.age > timedelta(0)

        telemetry = RecordingTelemetry(samples_backlog=True)
        seen = 0

        async def handle(conn: Any, change: DurableStateChange) -> None:
            nonlocal seen
            seen += 1

        projection = Projection.exactly_once_changes(
            j, name="cart-backlog", entity_type=ENTITY, slice_range=ALL, handler=handle,
            settings=ProjectionSettings(backlog_sample_interval=0.1, cleanup_interval=1.0),
            telemetry=telemetry,
        )  # fmt: skip
        task = asyncio.create_task(projection.run())
        await eventually(lambda: seen == 12, "every change handled")

        def sampled_caught_up() -> bool:
            samples = telemetry.named("backlog_sampled", "cart-backlog")
            return bool(samples) and samples[-1].args[0].size == 0

        await eventually(sampled_caught_up, "a backlog sample of 0")
        await projection.stop()
        await asyncio.wait_for(task, 10)
        async with j.pool.connection() as conn:
            after = await read_backlog(
                conn, statements, "cart-backlog", ENTITY, ALL, source=STATE_CHANGES
            )
        assert after.size == 0
        # An operator's status and backlog: the instances recorded what they read.
        for i in range(3):
            await store.upsert(f"{ENTITY}|b{i + 1}", {"rev": 2}, revision=2)
        management = ProjectionManagement(j)
        [status] = await management.status("cart-backlog", ENTITY)
        async with j.pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL("SELECT max(db_timestamp) FROM {} WHERE entity_type = %s").format(
                    j.tables.durable_state
                ),
                (ENTITY,),
            )
            (newest,) = await cur.fetchone() or (None,)
        assert status.backlog is not None
        assert (status.backlog.size, status.journal_head) == (3, newest)
        assert (await management.backlog("cart-backlog", ENTITY, ALL)).size == 3


@pytest.mark.timeout(120)
async def test_dead_letters_of_changes_replay_the_ids_revision_or_are_superseded(
    pg_dsn: str, schema: str
) -> None:
    """An exactly-once change that failed under `retry_and_skip` is a dead letter (id,
    revision). After
    the fix, a replay hands the id's state to the handler again if the id still holds
    that revision (`source` "replay"); a letter whose id moved on is superseded by the
    newer revision: marked replayed, no handler call."""
    async with Journal.connect(pg_dsn, horizon_settings(schema), create_schema=True) as j:
        await create_read_model(pg_dsn, schema)
        store = DurableStateStore(j)
        applied, model = apply_statements(schema)
        broken = {f"{ENTITY}|a", f"{ENTITY}|b"}
        sources: list[tuple[str, int, str]] = []

        async def handler(conn: AsyncConnection[Any], change: DurableStateChange) -> None:
            if change.persistence_id in broken:
                raise RuntimeError(f"bug on {change.persistence_id}")
            check_change(change)
            sources.append((change.persistence_id, change.revision, change.source))
            await conn.execute(applied, (change.persistence_id, change.revision))
            await conn.execute(model, (change.persistence_id, change.revision, change.deleted))

        management = ProjectionManagement(j)
        group = ProjectionGroup(
            lambda r: Projection.exactly_once_changes(
                j, name="carts", entity_type=ENTITY, slice_range=r, handler=handler,
                settings=FAST, recovery=RecoveryStrategy.retry_and_skip(1, backoff=0.01),
            ),
            2,
        )  # fmt: skip
        async with group:
            for pid in (f"{ENTITY}|a", f"{ENTITY}|b", f"{ENTITY}|c"):
                await store.upsert(pid, {"rev": 1}, revision=1)

            async def letters(count: int) -> bool:
                return len(await management.dead_letters("carts")) == count

            await eventually(lambda: letters(2), "a@1 and b@1 dead-lettered")
            await store.upsert(f"{ENTITY}|b", {"rev": 2}, revision=2)
            await eventually(lambda: letters(3), "b@2 dead-lettered too")
            broken.clear()  # the fix
            asked = await management.replay_dead_letters("carts")
            assert asked == [(f"{ENTITY}|a", 1), (f"{ENTITY}|b", 1), (f"{ENTITY}|b", 2)]

            async def settled() -> bool:
                found = await management.dead_letters("carts")
                return all(d.status == "replayed" for d in found)

            await eventually(settled, "every letter replayed or superseded")
        assert await read_model(pg_dsn, schema) == {
            f"{ENTITY}|a": (1, False), f"{ENTITY}|b": (2, False), f"{ENTITY}|c": (1, False),
        }  # fmt: skip
        # b@1 was superseded by b@2: no handler call for it; a@1 and b@2 replayed.
        assert sorted(await applied_rows(pg_dsn, schema)) == [
            (f"{ENTITY}|a", 1), (f"{ENTITY}|b", 2), (f"{ENTITY}|c", 1),
        ]  # fmt: skip
        assert sorted(s for s in sources if s[2] == "replay") == [
            (f"{ENTITY}|a", 1, "replay"), (f"{ENTITY}|b", 2, "replay"),
        ]  # fmt: skip

"""Retention that waits for projections, on a real PostgreSQL.

Each test writes events, lets projections consume some of them, applies a
retention policy and checks, row by row in the journal table, what went and
what stayed: nothing a registered projection has not consumed disappears,
each id keeps its deletion marker (so its seq_nrs continue), a dry run
deletes nothing, and registering and retiring change what is held back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest
from psycopg import sql

from journal import (
    InvalidArgument,
    InvalidPersistenceId,
    InvalidSettings,
    Journal,
    SliceRange,
    SyncJournal,
    slice_for,
)
from projections import Projection, ProjectionManagement, UnknownProjection
from projections.aio.retention import Retention
from projections.retention import Registration, RetentionPolicy, RetentionSettings
from projections.sync.retention import SyncRetention
from projections.tables import ProjectionTables
from tests.support.pg import fetch
from tests.support.projections import FAST, eventually

ENTITY = "Ret"
KEEP = RetentionPolicy(ENTITY, keep="1s")


def pid(i: int) -> str:
    return f"{ENTITY}|id-{i * 7919 % 100003}"


async def write(j: Journal, ids: Iterable[int], events: int = 1) -> None:
    for i in ids:
        p = pid(i)
        await j.append(
            p, [{"n": k} for k in range(events)], expected_seq_nr=await j.highest_seq_nr(p)
        )


async def rows(j: Journal) -> dict[tuple[str, int], bool]:
    """(pid, seq_nr) -> deleted, of every row of the journal table."""
    found = await fetch(
        j.dsn,
        sql.SQL("SELECT persistence_id, seq_nr, deleted FROM {}").format(j.tables.journal),
    )
    return {(p, s): d for p, s, d in found}


async def events(j: Journal) -> set[tuple[str, int]]:
    return {k for k, deleted in (await rows(j)).items() if not deleted}


async def markers(j: Journal) -> set[tuple[str, int]]:
    return {k for k, deleted in (await rows(j)).items() if deleted}


async def create_target(j: Journal, name: str) -> Any:
    """A table `applied_NAME (pid, seq_nr)` with that primary key, and an exactly-once
    handler filling it: an event applied twice fails its transaction."""
    table = sql.Identifier(j.settings.schema, f"applied_{name}")
    async with j.pool.connection() as conn:
        await conn.execute(
            sql.SQL("CREATE TABLE {} (pid text, seq_nr bigint, PRIMARY KEY (pid, seq_nr))").format(
                table
            )
        )
    insert = sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table)

    async def handler(conn: Any, env: Any) -> None:
        await conn.execute(insert, (env.persistence_id, env.seq_nr))

    return handler


async def applied(j: Journal, name: str) -> set[tuple[str, int]]:
    table = sql.Identifier(j.settings.schema, f"applied_{name}")
    return {(p, s) for p, s in await fetch(j.dsn, sql.SQL("SELECT * FROM {}").format(table))}


def projection(j: Journal, name: str, handler: Any) -> Projection:
    return Projection.exactly_once(
        j, name=name, entity_type=ENTITY, slice_range=SliceRange.FULL, handler=handler,
        settings=FAST,
    )  # fmt: skip


@pytest.mark.timeout(120)
async def test_without_projections_the_policy_alone_decides_and_markers_keep_the_seq_nrs(
    journal: Journal,
) -> None:
    await write(journal, range(20), events=3)
    await asyncio.sleep(1.2)
    await write(journal, range(5), events=1)  # newer than the policy: kept
    report = await Retention(journal).apply(KEEP)
    assert report.events == 60 and report.held == 0
    assert await events(journal) == {(pid(i), 4) for i in range(5)}
    # Each id keeps its highest deleted event as a marker: seq_nrs go on after it.
    assert await markers(journal) == {(pid(i), 3) for i in range(20)}
    assert await journal.highest_seq_nr(pid(7)) == 3
    await journal.append(pid(7), [{"n": 9}], expected_seq_nr=3)
    assert [e.seq_nr async for e in journal.current_events_by_persistence_id(pid(7))] == [4]
    again = await Retention(journal).apply(RetentionPolicy(ENTITY, keep="1h"))
    assert again.events == 0


@pytest.mark.timeout(120)
async def test_nothing_a_projection_has_not_consumed_goes_and_a_dry_run_deletes_nothing(
    journal: Journal,
) -> None:
    handler = await create_target(journal, "p")
    await write(journal, range(30), events=2)
    await projection(journal, "p", handler).run(until_caught_up=True)
    consumed = await events(journal)
    await write(journal, range(10), events=2)  # not consumed by p
    await asyncio.sleep(1.2)
    before = await rows(journal)
    dry = await Retention(journal, RetentionSettings(batch_size=7)).apply(KEEP, dry_run=True)
    assert await rows(journal) == before  # a dry run deletes nothing
    assert dry.dry_run and dry.events == 60 and dry.held == 20
    held_by = {h.projection for r in dry.ranges for h in r.held_by}
    assert held_by == {"p"}
    report = await Retention(journal, RetentionSettings(batch_size=7)).apply(KEEP)
    assert report.events == 60
    left = await events(journal)
    assert left == {(pid(i), s) for i in range(10) for s in (3, 4)}
    assert not consumed & left
    # p resumes and applies the rest, each once.
    await projection(journal, "p", handler).run(until_caught_up=True)
    assert await applied(journal, "p") == consumed | left


@pytest.mark.timeout(120)
async def test_a_registered_projection_holds_everything_until_it_consumes_and_retired_holds_nothing(
    journal: Journal,
) -> None:
    retention = Retention(journal)
    await write(journal, range(10), events=2)
    await retention.register("late", ENTITY)  # before it starts: it must see history
    await asyncio.sleep(1.2)
    report = await retention.apply(KEEP)
    assert report.events == 0 and await events(journal) == {
        (pid(i), s) for i in range(10) for s in (1, 2)
    }
    assert {h.projection for r in report.ranges for h in r.held_by} == {"late"}
    # Registered for another entity type or slices it does not cover, it holds nothing there.
    await retention.register("late", "Other")
    assert (await retention.apply(KEEP, dry_run=True)).events == 20
    await retention.register("late", ENTITY, SliceRange(0, 511))
    info = {i.name: i for i in await retention.projections()}["late"]
    assert info.registration is Registration.EXPLICIT and info.slice_range == SliceRange(0, 511)
    held = await retention.apply(KEEP, dry_run=True)
    assert held.events == sum(2 for i in range(10) if slice_for(pid(i)) > 511)
    # Retired, it holds nothing; its offset rows go at the next apply.
    handler = await create_target(journal, "late")
    await projection(journal, "late", handler).run(until_caught_up=True)
    await write(journal, range(3), events=1)
    await asyncio.sleep(1.2)
    await retention.retire("late")
    assert {i.name: i for i in await retention.projections()}["late"].registration is (
        Registration.RETIRED
    )
    report = await retention.apply(KEEP)
    assert report.events == 23 and report.retired_offsets > 0
    offsets = await fetch(
        journal.dsn,
        sql.SQL("SELECT count(*) FROM {}").format(ProjectionTables(journal.tables).offset_store),
    )
    assert offsets == [(0,)]
    with pytest.raises(UnknownProjection):
        await retention.retire("no such projection")


@pytest.mark.timeout(120)
async def test_keep_last_and_keep_snapshot(journal: Journal) -> None:
    await write(journal, range(4), events=5)
    await journal.save_snapshot(pid(0), 3, {"s": 3})
    await journal.save_snapshot(pid(1), 5, {"s": 5})
    report = await Retention(journal).apply(RetentionPolicy(ENTITY, keep_last=2))
    assert report.events == 12
    assert await events(journal) == {(pid(i), s) for i in range(4) for s in (4, 5)}
    await write(journal, range(4), events=2)  # seq_nrs 6, 7
    snapshot = RetentionPolicy(ENTITY, keep_snapshot=True)
    await Retention(journal).apply(snapshot)
    left = await events(journal)
    # pid 0's snapshot is at 3 (nothing more to go), pid 1's at 5; 2 and 3 have none.
    assert left == {(pid(0), s) for s in (4, 5, 6, 7)} | {(pid(1), s) for s in (6, 7)} | {
        (pid(i), s) for i in (2, 3) for s in (4, 5, 6, 7)
    }
    assert await markers(journal) >= {(pid(1), 5)}


@pytest.mark.timeout(60)
async def test_a_paused_projection_holds_and_the_sync_twin_agrees(journal: Journal) -> None:
    handler = await create_target(journal, "paused")
    await write(journal, range(5), events=1)
    await projection(journal, "paused", handler).run(until_caught_up=True)
    await ProjectionManagement(journal).pause("paused")
    await write(journal, range(5, 10), events=1)
    await asyncio.sleep(1.2)

    def sync_dry_run() -> Any:
        with SyncJournal.connect(journal.dsn, journal.settings) as sj:
            retention = SyncRetention(sj)
            infos = {i.name: i for i in retention.projections()}
            return infos, retention.apply(KEEP, dry_run=True)

    infos, report = await asyncio.to_thread(sync_dry_run)
    assert infos["paused"].paused and infos["paused"].registration is Registration.IMPLICIT
    assert (report.events, report.held) == (5, 5)


@pytest.mark.timeout(30)
async def test_bad_policies_and_arguments_are_refused_before_anything_is_written(
    journal: Journal,
) -> None:
    for bad in ({}, {"keep": "7x"}, {"keep": "0s"}, {"keep": -1}, {"keep_last": 0}):
        with pytest.raises((InvalidSettings, InvalidArgument)):
            RetentionPolicy(ENTITY, **bad)
    with pytest.raises(InvalidPersistenceId):
        RetentionPolicy("bad|type", keep="1d")
    with pytest.raises(InvalidSettings):
        RetentionSettings(batch_size=0)
    retention = Retention(journal)
    with pytest.raises(InvalidArgument):
        await retention.register("", ENTITY)
    with pytest.raises(InvalidArgument):
        await retention.apply("keep everything")  # type: ignore[arg-type]


@pytest.mark.timeout(300)
async def test_writers_a_running_and_a_paused_projection_and_retention_in_a_loop(
    pg_dsn: str, schema: str
) -> None:
    """The issue's run: concurrent writers (some holding their transaction open, so
    events commit late with old timestamps), projection `live` running, `lagging`
    (registered before the writers start) paused for a while, retention with keep=1s
    and small batches applied in a loop meanwhile. Afterwards both,
    resumed, have applied every event ever written exactly once (primary keys), and the
    journal holds no event older than the policy that both have consumed: only markers."""
    from tests.support import bank
    from tests.support.projections import journal_settings

    async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        live_handler = await create_target(j, "live")
        lagging_handler = await create_target(j, "lagging")
        management = ProjectionManagement(j)
        live = projection(j, "live", live_handler)
        lagging = projection(j, "lagging", lagging_handler)
        tasks = [asyncio.create_task(p.run()) for p in (live, lagging)]
        writers = bank.Writers(j, accounts=120, late_fraction=0.05)
        writers.pids = [pid(i) for i in range(120)]  # this test's entity type
        writers.seq = dict.fromkeys(writers.pids, 0)
        # `lagging` must hold retention from the start, before it stores its first offset.
        await Retention(j).register("lagging", ENTITY)
        writers.start(writers=4)
        retention = Retention(j, RetentionSettings(batch_size=50))
        deleted = 0
        loop = asyncio.get_running_loop()
        until = loop.time() + 12
        paused = resumed = False
        while loop.time() < until:
            deleted += (await retention.apply(KEEP)).events
            if not paused and loop.time() > until - 10:
                await management.pause("lagging")
                paused = True
            if not resumed and loop.time() > until - 4:
                await management.resume("lagging")  # it catches up while retention runs on
                resumed = True
            await asyncio.sleep(0.2)
        await writers.stop()
        written = {(p, s) for p, n in writers.seq.items() for s in range(1, n + 1)}

        async def caught_up() -> bool:
            return await applied(j, "live") == written and await applied(j, "lagging") == written

        await eventually(caught_up, "both projections applied every event", within=120)
        for p in (live, lagging):
            await p.stop()
        await asyncio.gather(*tasks)
        assert deleted > 0 and writers.late > 0  # deleted while late commits came in
        await asyncio.sleep(1.1)
        await Retention(j).apply(KEEP)
        # Exactly once: the primary keys refused any second application, and every
        # written event is in both targets (checked above); none is left in the journal
        # but the markers, one per id at its highest seq_nr.
        assert await events(j) == set()
        assert await markers(j) == {(p, n) for p, n in writers.seq.items() if n}
        for p, n in list(writers.seq.items())[:3]:
            assert await j.highest_seq_nr(p) == n

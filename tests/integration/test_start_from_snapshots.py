"""Start from snapshots on a real PostgreSQL (issue 31): each id's snapshot in place of
its events up to the snapshot's seq_nr.

A read model folded from the start-from-snapshot stream (a snapshot replaces the state,
an event adds to it) must equal the fold of every event, for generated histories of
appends, snapshots and `delete_events_to` (hypothesis), while the server ships only
the snapshots and the events after them. A live exactly-once projection over four
ranges, started before and running while writers append (some holding their
transaction open: late commits) and save snapshots, applies every id's events once and
ends at each id's latest total; an id it has a record for is still accepted when a
snapshot jumps over events it had not read.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import AsyncConnection, sql

from journal import (
    EventEnvelope,
    EventFilter,
    InvalidArgument,
    Journal,
    SliceRange,
    SyncJournal,
    slice_ranges,
)
from projections import Projection, ProjectionGroup, SyncProjection
from projections.aio.runner import run_fenced
from projections.fencing import Fence
from tests.support.fleet import claim
from tests.support.pg import fetch
from tests.support.projections import FAST, eventually, journal_settings

ENTITY = "Till"

# One id's history: ("append", amount), ("snapshot",) at the current seq_nr,
# ("delete_to",) deleting every event up to the current seq_nr.
OP = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 9)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("delete_to")),
)
HISTORY = st.lists(st.lists(OP, min_size=1, max_size=12), min_size=1, max_size=6)


def fold(envelopes: list[EventEnvelope]) -> dict[str, tuple[int, int]]:
    """(total, highest seq_nr) per id: a snapshot replaces the state, an event adds."""
    state: dict[str, tuple[int, int]] = {}
    for env in envelopes:
        total, seq = state.get(env.persistence_id, (0, 0))
        assert env.seq_nr > seq, f"{env.persistence_id}: seq_nr {env.seq_nr} after {seq}"
        if env.from_snapshot:
            state[env.persistence_id] = (env.event["total"], env.seq_nr)
        else:
            assert env.seq_nr == seq + 1, f"{env.persistence_id}: event {env.seq_nr} after {seq}"
            state[env.persistence_id] = (total + env.event["amount"], env.seq_nr)
    return state


async def play(j: Journal, prefix: str, history: list[list[tuple[Any, ...]]]) -> dict[str, Any]:
    """Run each id's ops in order; the expected (total, seq) per id with events, and how
    many rows a start-from-snapshot read must ship."""
    expected: dict[str, tuple[int, int]] = {}
    shipped = 0
    for i, ops in enumerate(history):
        pid = f"{ENTITY}|{prefix}-{i}"
        total = seq = snapshot_at = 0
        for op in ops:
            if op[0] == "append":
                await j.append(pid, [{"amount": op[1]}], expected_seq_nr=seq)
                seq += 1
                total += op[1]
            elif op[0] == "snapshot" and seq > 0:
                await j.save_snapshot(pid, seq, {"total": total})
                snapshot_at = seq
            elif op[0] == "delete_to" and snapshot_at > 0:
                # Deleting below a snapshot, as an application that snapshots does.
                await j.delete_events_to(pid, snapshot_at)
        if seq:
            expected[pid] = (total, seq)
            shipped += (1 if snapshot_at else 0) + seq - snapshot_at
    return {"expected": expected, "shipped": shipped}


@pytest.mark.timeout(180)
async def test_a_fold_from_snapshots_equals_the_fold_of_every_event(
    pg_dsn: str, schema: str
) -> None:
    async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        examples = iter(range(10_000))

        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(HISTORY)
        def check(history: list[list[tuple[Any, ...]]]) -> None:
            # Hypothesis runs examples synchronously: this runs in a worker thread and
            # each example on the test's event loop, which awaits the thread meanwhile.
            future = asyncio.run_coroutine_threadsafe(one(history), loop)
            future.result(timeout=60)

        async def one(history: list[list[tuple[Any, ...]]]) -> None:
            prefix = f"h{next(examples)}"
            played = await play(j, prefix, history)
            read = []
            for r in slice_ranges(4):
                async for env in j.current_events_by_slices_from_snapshots(
                    ENTITY, r.min_slice, r.max_slice
                ):
                    if env.persistence_id.startswith(f"{ENTITY}|{prefix}-"):
                        read.append(env)
            assert fold(read) == played["expected"]
            assert len(read) == played["shipped"]

        loop = asyncio.get_running_loop()
        await asyncio.to_thread(check)


@pytest.mark.timeout(60)
async def test_snapshots_are_shipped_instead_of_the_events_they_cover(journal: Journal) -> None:
    for n in range(3):
        pid = f"{ENTITY}|s{n}"
        for seq in range(10):
            await journal.append(pid, [{"amount": 1}], expected_seq_nr=seq)
        await journal.save_snapshot(pid, 7, {"total": 7})
    plain = [e async for e in journal.current_events_by_slices(ENTITY, 0, 1023)]
    from_snapshots = [
        e async for e in journal.current_events_by_slices_from_snapshots(ENTITY, 0, 1023)
    ]
    assert len(plain) == 30 and len(from_snapshots) == 12  # a snapshot and 3 events per id
    snapshots = [e for e in from_snapshots if e.from_snapshot]
    assert [(e.seq_nr, e.event, e.source) for e in snapshots] == [(7, {"total": 7}, "snapshot")] * 3
    # Each snapshot stands where its event stood: same db_timestamp, then the id's later events.
    at = {(e.persistence_id, e.seq_nr): e.db_timestamp for e in plain}
    for s in snapshots:
        assert s.db_timestamp == at[(s.persistence_id, 7)]
        assert (await journal.load_snapshot(s.persistence_id)).db_timestamp == s.db_timestamp  # type: ignore[union-attr]
    # Resuming from a snapshot's offset continues with the id's next event.
    first = snapshots[0]
    rest = [
        e
        async for e in journal.current_events_by_slices_from_snapshots(
            ENTITY, 0, 1023, first.offset
        )
    ]
    assert [e.seq_nr for e in rest if e.persistence_id == first.persistence_id] == [8, 9, 10]


@pytest.mark.timeout(180)
async def test_a_live_projection_from_snapshots_applies_every_event_once(
    pg_dsn: str, schema: str
) -> None:
    rng = random.Random(31)
    table = sql.Identifier(schema, "tills")
    async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        async with j.pool.connection() as conn:
            await conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (pid text PRIMARY KEY, total bigint, seq_nr bigint, "
                    "snapshots int, events int)"
                ).format(table)
            )
        wrong: list[str] = []

        async def handle(conn: AsyncConnection[Any], env: EventEnvelope) -> None:
            cur = await conn.execute(
                sql.SQL("SELECT total, seq_nr FROM {} WHERE pid = %s").format(table),
                (env.persistence_id,),
            )
            row = await cur.fetchone()
            total, seq = row if row else (0, 0)
            if env.from_snapshot:
                total, kind = env.event["total"], "snapshots"
            else:
                if env.seq_nr != seq + 1:
                    wrong.append(f"{env.persistence_id}: event {env.seq_nr} after {seq}")
                total, kind = total + env.event["amount"], "events"
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {t} (pid, total, seq_nr, snapshots, events) "
                    "VALUES (%s, %s, %s, 0, 0) ON CONFLICT (pid) DO UPDATE SET "
                    "total = excluded.total, seq_nr = excluded.seq_nr"
                ).format(t=table),
                (env.persistence_id, total, env.seq_nr),
            )
            await conn.execute(
                sql.SQL("UPDATE {} SET {k} = {k} + 1 WHERE pid = %s").format(
                    table, k=sql.Identifier(kind)
                ),
                (env.persistence_id,),
            )

        # Histories before the projection starts: snapshots at 15 of 20 events.
        expected: dict[str, tuple[int, int]] = {}
        for i in range(12):
            pid = f"{ENTITY}|old-{i}"
            for seq in range(20):
                await j.append(pid, [{"amount": i + 1}], expected_seq_nr=seq)
            await j.save_snapshot(pid, 15, {"total": 15 * (i + 1)})
            expected[pid] = (20 * (i + 1), 20)
        group = ProjectionGroup(
            lambda r: Projection.exactly_once(
                j,
                name="tills",
                entity_type=ENTITY,
                slice_range=r,
                handler=handle,
                settings=FAST,
                from_snapshots=True,
            ),
            4,
        )
        await group.start()

        async def writer(w: int) -> None:
            for i in range(w, 16, 4):
                pid = f"{ENTITY}|new-{i}"
                total = 0
                for seq in range(25):
                    amount = rng.randint(1, 9)
                    if rng.random() < 0.1:  # a late commit
                        async with j.pool.connection() as conn, conn.transaction():
                            await j.append(
                                pid, [{"amount": amount}], expected_seq_nr=seq, conn=conn
                            )
                            await asyncio.sleep(rng.uniform(0.2, 0.8))
                    else:
                        await j.append(pid, [{"amount": amount}], expected_seq_nr=seq)
                    total += amount
                    if seq % 7 == 6:
                        await j.save_snapshot(pid, seq + 1, {"total": total})
                expected[pid] = (total, 25)

        await asyncio.gather(*(writer(w) for w in range(4)))

        async def done() -> bool:
            rows = await fetch(j.dsn, sql.SQL("SELECT pid, total, seq_nr FROM {}").format(table))
            return {p: (int(t), int(s)) for p, t, s in rows} == expected

        await eventually(done, "every id at its latest total", within=90)
        assert group.failed() is None
        await group.stop()
        assert wrong == []
        rows = await fetch(
            j.dsn,
            sql.SQL("SELECT pid, snapshots, events FROM {} WHERE pid LIKE %s").format(table),
            (f"{ENTITY}|old-%",),
        )
        # Ids snapshotted before the start: their snapshot and the 5 events after it only.
        assert sorted((int(s), int(e)) for _, s, e in rows) == [(1, 5)] * 12


@pytest.mark.timeout(60)
def test_the_sync_runner_starts_from_snapshots(pg_dsn: str, schema: str) -> None:
    """The generated blocking runner reads the same stream: each id's snapshot, then its
    later events; a second run has nothing left."""
    totals: dict[str, int] = {}
    delivered: list[tuple[str, int, bool]] = []

    def handle(conn: Any, env: EventEnvelope) -> None:
        delivered.append((env.persistence_id, env.seq_nr, env.from_snapshot))
        if env.from_snapshot:
            totals[env.persistence_id] = env.event["total"]
        else:
            totals[env.persistence_id] = totals.get(env.persistence_id, 0) + env.event["amount"]

    with SyncJournal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        for n in range(4):
            pid = f"{ENTITY}|y{n}"
            j.append(pid, [{"amount": 2}] * 6, expected_seq_nr=0)
            if n % 2 == 0:
                j.save_snapshot(pid, 4, {"total": 8})

        def projection() -> SyncProjection:
            return SyncProjection.exactly_once(
                j, name="sync-snapshots", entity_type=ENTITY, slice_range=SliceRange.FULL,
                handler=handle, settings=FAST, from_snapshots=True,
            )  # fmt: skip

        projection().run(until_caught_up=True)
        assert totals == {f"{ENTITY}|y{n}": 12 for n in range(4)}
        assert sorted(delivered) == sorted(
            [(f"{ENTITY}|y{n}", s, s == 4) for n in (0, 2) for s in (4, 5, 6)]
            + [(f"{ENTITY}|y{n}", s, False) for n in (1, 3) for s in range(1, 7)]
        )
        delivered.clear()
        projection().run(until_caught_up=True)
        assert delivered == []


@pytest.mark.timeout(30)
async def test_a_filter_does_not_combine_with_snapshots(journal: Journal) -> None:
    with pytest.raises(InvalidArgument, match="from_snapshots"):
        Projection.exactly_once(
            journal, name="p", entity_type=ENTITY, slice_range=SliceRange.FULL,
            handler=_noop, filter=EventFilter(manifests=("x",)), from_snapshots=True,
        )  # fmt: skip


async def _noop(conn: Any, env: EventEnvelope) -> None:
    return None


@pytest.mark.timeout(120)
async def test_a_fenced_instance_starts_from_snapshots_and_stores_every_offset(
    pg_dsn: str, schema: str
) -> None:
    """A fleet worker's instance (fenced by its lease: the fence and the offsets go in one
    statement) starting from snapshots: each id's read model is the fold of its snapshot
    and later events, written while it runs too, and a restart under a new lease
    applies nothing twice."""
    rng = random.Random(17)
    async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        expected = (await play(j, "f", [[("append", 3)] * 6 + [("snapshot",)]] * 8))["expected"]
        seen: list[EventEnvelope] = []

        async def handle(conn: AsyncConnection[Any], envs: list[EventEnvelope]) -> None:
            seen.extend(envs)

        def instance() -> Projection:
            return Projection.grouped(
                j, name="tills-fenced", entity_type=ENTITY, slice_range=SliceRange(0, 1023),
                handler=handle, settings=FAST, from_snapshots=True,
            )  # fmt: skip

        async def run_under_lease(owner: str) -> tuple[Projection, asyncio.Task[Any]]:
            epoch = await claim(j, SliceRange(0, 1023), owner, "tills-fenced")
            projection = instance()
            fence = Fence("tills-fenced", SliceRange(0, 1023), owner, epoch, 60_000)
            return projection, asyncio.create_task(run_fenced(projection, fence))

        first, task = await run_under_lease("w1")

        async def caught_up() -> bool:
            return fold(seen) == expected

        await eventually(caught_up, "every id folded from its snapshot", within=60)
        for i in range(8):  # more events, and one more snapshot of half the ids
            pid = f"{ENTITY}|f-{i}"
            amount = rng.randint(1, 9)
            await j.append(pid, [{"amount": amount}], expected_seq_nr=6)
            total, _ = expected[pid]
            expected[pid] = (total + amount, 7)
            if i % 2:
                await j.save_snapshot(pid, 7, {"total": total + amount})
        await eventually(caught_up, "every id folded to its latest total", within=60)
        await first.stop()
        await task
        handled = len(seen)
        # Another owner takes the range over and starts from the stored offsets.
        second, task = await run_under_lease("w2")
        await asyncio.sleep(1.5)
        await second.stop()
        await task
    assert len(seen) == handled, "events applied again after the takeover"
    # Each id starts from its snapshot at 6; after that, a snapshot saved while the
    # instance runs may stand in for the event it was taken at (never both).
    firsts = {}
    for env in seen:
        firsts.setdefault(env.persistence_id, (env.seq_nr, env.from_snapshot))
    assert set(firsts.values()) == {(6, True)}
    assert len({(e.persistence_id, e.seq_nr) for e in seen}) == len(seen)

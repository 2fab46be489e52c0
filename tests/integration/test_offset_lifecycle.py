"""The offset store at Akka's level, on a real PostgreSQL (issue 23): deleted versus
not visible yet, ids erased and reset (`Journal.delete_all`), cleanup per slice and
`delete_after_consumed`, and a downscale that adopts the merged ranges' rows.

Each test restates its scenario; the rules themselves are in tests/unit.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection, sql

from journal import (
    BacktrackingSettings,
    EventEnvelope,
    HorizonSettings,
    InvalidArgument,
    InvalidPersistenceId,
    Journal,
    SliceRange,
    SyncJournal,
    slice_for,
    slice_ranges,
)
from journal.model import TOMBSTONE_MANIFEST, TOMBSTONE_SER_ID
from projections import (
    Projection,
    ProjectionGroup,
    ProjectionManagement,
    ProjectionSettings,
)
from projections.aio.core_io import reply_to
from projections.aio.offset_dao import OffsetDao
from projections.core import StoredOffset
from projections.offset_store import Record
from projections.tables import ProjectionTables
from tests.support import bank
from tests.support.pg import fast_query_settings
from tests.support.projections import FAST, assert_exact, eventually

EVENT = {"amount": 1}
# The horizon stops waiting for an idle transaction after 0.3 s (the default is 10 s).
QUERY = fast_query_settings(
    buffer_size=100,
    backtracking=BacktrackingSettings(window=20, behind_current_time=6),
    horizon=HorizonSettings(max_hold=0.3),
)
SETTINGS = ProjectionSettings(
    management_poll_interval=0.2,
    cleanup_interval=1.0,
    progress_interval=0.5,
    rejected_retry_interval=0.3,
)

Seen = list[tuple[str, int, bool]]


def recording(j: Journal, seen: Seen, *, name: str = "lifecycle", **options: Any) -> Projection:
    """An exactly-once projection over every slice that records what its handler gets."""

    async def handler(conn: AsyncConnection[Any], env: EventEnvelope) -> None:
        seen.append((env.persistence_id, env.seq_nr, env.deleted))

    return Projection.exactly_once(
        j, name=name, entity_type=bank.ENTITY, slice_range=SliceRange(0, 1023),
        handler=handler, settings=options.pop("settings", SETTINGS), query_settings=QUERY,
        **options,
    )  # fmt: skip


async def insert_raw(conn: AsyncConnection[Any], j: Journal, pid: str, seq_nr: int) -> None:
    """A row written around the journal's append (a restore, a replicated write): its
    db_timestamp is its transaction's start, whatever the id's other rows say."""
    template = sql.SQL(
        "SELECT event_ser_id, event_ser_manifest, event_payload FROM {} "
        "WHERE persistence_id = %s AND seq_nr = 1"
    ).format(j.tables.journal)
    cur = await conn.execute(template, (pid,))
    ser_id, manifest, payload = await cur.fetchone() or (None, None, None)
    insert = sql.SQL(
        "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
        "event_ser_id, event_ser_manifest, event_payload, writer) "
        "VALUES (%s, %s, %s, %s, transaction_timestamp(), %s, %s, %s, 'restore')"
    ).format(j.tables.journal)
    params = (slice_for(pid), bank.ENTITY, pid, seq_nr, ser_id, manifest, payload)
    await conn.execute(insert, params)


async def test_a_late_predecessor_is_waited_for_never_taken_for_deleted(
    bank_journal: Journal, pg_dsn: str
) -> None:
    # seq_nr 2 is written by a transaction that was open before seq_nr 3 committed
    # and commits after the projection met 3. With nothing in the journal saying 2
    # was deleted, 3 must wait: then 2 and 3 are applied, once each, in order.
    j = bank_journal
    pid = bank.account(1)
    await j.append(pid, [EVENT], expected_seq_nr=0)
    seen: Seen = []
    projection = recording(j, seen)
    run = asyncio.create_task(projection.run())
    try:
        await eventually(lambda: seen == [(pid, 1, False)], "seq_nr 1 applied")
        held = await psycopg.AsyncConnection.connect(pg_dsn)
        async with held:
            await held.execute("SELECT 1")  # its transaction (and 2's db_timestamp) starts here
            await asyncio.sleep(1.0)  # idle beyond max_hold: the horizon no longer waits
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as other:
                await insert_raw(other, j, pid, 3)
            await eventually(lambda: projection.stats.rejected >= 1, "seq_nr 3 rejected")
            await asyncio.sleep(0.5)
            assert seen == [(pid, 1, False)], "3 must not be applied before 2"
            await insert_raw(held, j, pid, 2)
            await held.commit()
        want = [(pid, 1, False), (pid, 2, False), (pid, 3, False)]
        await eventually(lambda: seen == want, "2 then 3 applied")
        await asyncio.sleep(1.0)  # backtracking re-delivers both: duplicates, not applied
        assert seen == want
    finally:
        await projection.stop()
        await run


async def test_an_event_after_a_real_deletion_is_accepted(bank_journal: Journal) -> None:
    # 2 and 3 were deleted (delete_events_to) before the projection read them: the
    # marker row at 3 is the evidence, so 4 is applied at once, nothing rejected.
    j = bank_journal
    pid = bank.account(2)
    await j.append(pid, [EVENT], expected_seq_nr=0)
    seen: Seen = []
    projection = recording(j, seen)
    await projection.run(until_caught_up=True)
    await j.append(pid, [EVENT, EVENT, EVENT], expected_seq_nr=1)
    assert await j.delete_events_to(pid, 3) == 3
    await projection.run(until_caught_up=True)
    assert seen == [(pid, 1, False), (pid, 4, False)]
    assert projection.stats.rejected == 0


async def journal_rows(j: Journal, pid: str) -> list[tuple[int, bool, str]]:
    query = sql.SQL(
        "SELECT seq_nr, deleted, event_ser_manifest FROM {} WHERE persistence_id = %s "
        "ORDER BY seq_nr"
    ).format(j.tables.journal)
    async with j.pool.connection() as conn:
        cur = await conn.execute(query, (pid,))
        return [(int(n), bool(d), str(m)) for n, d, m in await cur.fetchall()]


async def test_delete_all_tells_projections_and_the_id_continues_or_starts_again(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    kept, reset = bank.account(3), bank.account(4)
    for pid in (kept, reset):
        await j.append(pid, [EVENT] * 5, expected_seq_nr=0)
    await j.save_snapshot(kept, 5, {"balance": 5})
    seen: Seen = []
    projection = recording(j, seen)
    await projection.run(until_caught_up=True)
    assert len(seen) == 10

    # Erased without a reset: a tombstone at 6, the next append continues at 7.
    assert await j.delete_all(kept, batch_size=2) == 5
    assert await journal_rows(j, kept) == [(6, True, "slicejournal.tombstone")]
    assert await j.load_snapshot(kept) is None
    assert await j.highest_seq_nr(kept) == 6
    await j.append(kept, [EVENT], expected_seq_nr=6)
    # Erased with a reset: the tombstone at 0, the id starts again at 1.
    assert await j.delete_all(reset, reset_sequence_number=True, batch_size=2) == 5
    assert await j.highest_seq_nr(reset) == 0
    await j.append(reset, [EVENT, EVENT], expected_seq_nr=0)

    seen.clear()
    await projection.run(until_caught_up=True)
    # Each projection gets the tombstone (deleted, no event) and then the new events.
    assert sorted(seen) == sorted(
        [(kept, 6, True), (kept, 7, False), (reset, 0, True), (reset, 1, False), (reset, 2, False)]
    )
    assert [s for s in seen if s[0] == reset] == [(reset, 0, True), (reset, 1, False),
                                                  (reset, 2, False)]  # fmt: skip
    # Run again (and restart from the stored offsets): everything is a duplicate now.
    seen.clear()
    await projection.run(until_caught_up=True)
    assert seen == []


async def test_a_tombstone_the_stream_brings_late_is_handled_before_the_next_lifetime(
    bank_journal: Journal,
) -> None:
    # An erasure's tombstone whose db_timestamp the stream has already passed when it
    # becomes visible (as backtracking or a transaction the horizon did not wait for
    # bring it): the id's next event finds it through its gap fill, so the handler
    # erases first. Taken for mere deletion evidence, the erased lifetime's rows would
    # stay in the read model, and the late tombstone itself is "from the pid's past".
    j = bank_journal
    kept, reset, other = bank.account(6), bank.account(7), bank.account(8)
    for pid in (kept, reset):
        await j.append(pid, [EVENT] * 5, expected_seq_nr=0)
    await j.append(other, [EVENT], expected_seq_nr=0)
    seen: Seen = []
    projection = recording(j, seen)
    running = asyncio.create_task(projection.run())
    await eventually(lambda: len(seen) == 11, "the first events handled")
    passed = await j.timestamp_of(other, 1)
    assert passed is not None
    tombstone = sql.SQL(
        "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
        "event_ser_id, event_ser_manifest, event_payload, deleted) "
        "VALUES (%s, %s, %s, %s, %s, 'eraser', %s, %s, ''::bytea, true)"
    ).format(j.tables.journal)
    erase = sql.SQL("DELETE FROM {} WHERE persistence_id = %s AND seq_nr > 0").format(
        j.tables.journal
    )
    late = passed - timedelta(microseconds=1)  # after the ids' events, before the position
    async with j.pool.connection() as conn, conn.transaction():
        for pid, seq_nr in ((kept, 6), (reset, 0)):
            if seq_nr == 0:
                await conn.execute(erase, (pid,))
            await conn.execute(
                tombstone,
                (slice_for(pid), bank.ENTITY, pid, seq_nr, late, TOMBSTONE_SER_ID,
                 TOMBSTONE_MANIFEST),
            )  # fmt: skip
        await conn.execute(
            sql.SQL("DELETE FROM {} WHERE persistence_id = %s AND seq_nr < 6").format(
                j.tables.journal
            ),
            (kept,),
        )
    assert len(seen) == 11
    await j.append(kept, [EVENT], expected_seq_nr=6)
    await j.append(reset, [EVENT], expected_seq_nr=0)
    await eventually(
        lambda: {(kept, 7, False), (reset, 1, False)} <= set(seen), "the next lifetimes handled"
    )
    await projection.stop()
    await running
    assert [s for s in seen[11:] if s[0] == kept] == [(kept, 6, True), (kept, 7, False)]
    assert [s for s in seen[11:] if s[0] == reset] == [(reset, 0, True), (reset, 1, False)]
    seen.clear()
    await projection.run(until_caught_up=True)  # from the stored offsets: all handled
    assert seen == []


async def test_an_id_reset_without_a_tombstone_reaches_projections_by_its_timestamp(
    bank_journal: Journal,
) -> None:
    # A JVM service erases an id its own way (every row gone, no tombstone) and writes
    # it again from seq_nr 1: later than the handled seq_nr 5, so a new lifetime.
    # With accept_sequence_number_reset_after off, it is taken for a duplicate.
    j = bank_journal
    pid = bank.account(5)
    await j.append(pid, [EVENT] * 5, expected_seq_nr=0)
    on: Seen = []
    off: Seen = []
    with_reset = recording(j, on, name="with-reset")
    without = recording(
        j, off, name="without-reset",
        settings=SETTINGS.__class__(accept_sequence_number_reset_after=None),
    )  # fmt: skip
    for p in (with_reset, without):
        await p.run(until_caught_up=True)
    delete = sql.SQL("DELETE FROM {} WHERE persistence_id = %s").format(j.tables.journal)
    async with j.pool.connection() as conn:
        await conn.execute(delete, (pid,))
    await j.append(pid, [EVENT, EVENT], expected_seq_nr=0)
    for p in (with_reset, without):
        await p.run(until_caught_up=True)
    assert [s[1] for s in on] == [1, 2, 3, 4, 5, 1, 2]
    assert [s[1] for s in off] == [1, 2, 3, 4, 5]


async def test_delete_all_checks_its_input_before_writing(bank_journal: Journal) -> None:
    j = bank_journal
    pid = bank.account(6)
    await j.append(pid, [EVENT], expected_seq_nr=0)
    for args, kwargs in (
        (("",), {}),
        ((pid, "yes"), {}),
        ((pid,), {"batch_size": 0}),
        ((pid,), {"batch_size": True}),
    ):
        with pytest.raises((InvalidArgument, InvalidPersistenceId)):
            await j.delete_all(*args, **kwargs)
    assert [(n, d) for n, d, _ in await journal_rows(j, pid)] == [(1, False)]
    assert await j.delete_all(bank.account(999)) == 0  # no events: nothing written


def test_sync_journal_delete_all_is_the_same(pg_dsn: str, schema: str) -> None:
    from tests.support.projections import journal_settings

    with SyncJournal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        pid = "Bank|sync"
        j.append(pid, [EVENT] * 3, expected_seq_nr=0)
        assert j.delete_all(pid, True, batch_size=1) == 3
        assert j.highest_seq_nr(pid) == 0
        j.append(pid, [EVENT], expected_seq_nr=0)
        assert [e.seq_nr for e in j.current_events_by_persistence_id(pid)] == [1]


def ts(seconds: float) -> datetime:
    return datetime(2024, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)


async def test_cleanup_keeps_each_slices_latest_rows_and_waits_after_consumed(
    bank_journal: Journal,
) -> None:
    # Slice 1 went quiet an hour before slice 2: its rows are its own latest and stay,
    # however far slice 2 moves on (Akka #1255). Beside the window, delete_after_consumed
    # keeps rows stored recently (Akka #1396); an unknown pid's row is then found there.
    j = bank_journal
    dao = OffsetDao(ProjectionTables(j.tables), "cleanup")
    quiet = [Record(1, "Bank|q", n, ts(n)) for n in (1, 2)]
    busy = [Record(2, "Bank|b", n, ts(3600 + 100 * n)) for n in (1, 2, 3)]
    async with j.pool.connection() as conn:
        await dao.save(conn, "0-1023", [*quiet, *busy])
        window = timedelta(seconds=150)
        # Consumed just now: outside the window but kept for a day.
        assert await dao.cleanup(conn, SliceRange(0, 1023), window, timedelta(days=1)) == 0
        stored = await reply_to(conn, j.tables, j.serializers, StoredOffset("Bank|b", 2), dao.sql)
        assert stored == busy[-1]
        assert await dao.cleanup(conn, SliceRange(0, 1023), window) == 1  # Bank|b 1
        rows = await dao.load(conn, SliceRange(0, 1023))
    assert sorted(rows, key=lambda r: (r.slice, r.seq_nr)) == [*quiet, *busy[1:]]


@pytest.mark.slow
async def test_a_downscaled_range_starts_from_the_earliest_and_adopts_the_rows(
    bank_journal: Journal,
) -> None:
    # 4 ranges, 0-255 paused (behind); rescaled to 2: 0-511 merges the lagging 0-255
    # with 256-511, which is ahead. It starts from 0-255's offset and knows 256-511's
    # rows (written under that key), so every event is applied once (Akka #1185, #1218).
    j = bank_journal
    handler = bank.make_handler(j)
    group = ProjectionGroup(
        lambda r: Projection.exactly_once(
            j, name="balances", entity_type=bank.ENTITY, slice_range=r, handler=handler,
            settings=FAST,
        ),
        4,
    )  # fmt: skip
    mgmt = ProjectionManagement(j)
    lagging = slice_ranges(4)[0]
    await mgmt.pause("balances", lagging)
    await group.start()
    try:
        for i in range(40):
            await j.append(bank.account(100 + i), [EVENT, EVENT], expected_seq_nr=0)
        await asyncio.sleep(2.0)
        await group.rescale(2)
        await mgmt.resume("balances", lagging)
        for i in range(40):
            await j.append(bank.account(100 + i), [EVENT], expected_seq_nr=2)
        await assert_exact(j)
        assert group.failed() is None
    finally:
        await group.stop()
    merged = group.stats()[-2]  # the new 0-511 instance
    assert merged.duplicates > 0  # 256-511's events came again and were known

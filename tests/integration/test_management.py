"""Operating projections on a real PostgreSQL: pause/resume, set/clear offsets, status,
dead letters, name validation, and the offset DAO's per-slice cleanup.

Waits are bounded polls of the database or of the running instance's counters;
nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import (
    BacktrackingSettings,
    EventEnvelope,
    InvalidArgument,
    Journal,
    JournalSettings,
    SliceRange,
    slice_for,
    slice_ranges,
)
from projections import (
    DeadLetter,
    Projection,
    ProjectionManagement,
    ProjectionSettings,
)
from projections.aio.offset_dao import OffsetDao
from projections.errors import UnknownProjection
from projections.offset_store import PROGRESS_PID, PROGRESS_SEQ_NR, START_SEQ_NR, Record
from projections.tables import ProjectionTables
from tests.support import bank
from tests.support.pg import fast_query_settings
from tests.support.projections import eventually

NAME = "balances"
ALL = SliceRange(0, 1023)
LOWER, UPPER = SliceRange(0, 511), SliceRange(512, 1023)

SETTINGS = ProjectionSettings(
    management_poll_interval=timedelta(milliseconds=100),
    cleanup_interval=timedelta(seconds=1),
    progress_interval=timedelta(milliseconds=500),
)


def journal_settings(schema: str) -> JournalSettings:
    # Backtracking re-reads rows older than 0.2 s, so old events come again quickly.
    return JournalSettings(
        schema=schema,
        pool_max_size=30,
        query=fast_query_settings(
            refresh_interval=0.2,
            heartbeat_interval=0.3,
            backtracking=BacktrackingSettings(
                window=timedelta(seconds=20), behind_current_time=timedelta(milliseconds=200)
            ),
        ),
    )


@pytest.fixture
async def bank_journal(pg_dsn: str, schema: str) -> AsyncIterator[Journal]:
    async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        await bank.create_read_model(j)
        yield j


class Watched(Projection):
    """An exactly-once bank projection that counts the polls in which it found itself
    paused (a test hook on the real runner; the database is real)."""

    paused_polls = 0

    @classmethod
    def of(cls, j: Journal, slice_range: SliceRange) -> Watched:
        projection = cls.exactly_once(
            j,
            name=NAME,
            entity_type=bank.ENTITY,
            slice_range=slice_range,
            handler=bank.make_handler(j),
            settings=SETTINGS,
        )
        assert isinstance(projection, Watched)
        return projection

    async def _paused(self) -> bool:
        paused = await super()._paused()
        self.paused_polls += paused
        return paused


@contextlib.asynccontextmanager
async def running(*projections: Projection) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(p.run()) for p in projections]
    try:
        yield
    finally:
        for p in projections:
            await p.stop()
        await asyncio.gather(*tasks)


async def applied(j: Journal) -> set[tuple[str, int]]:
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT pid, seq_nr FROM {}").format(bank.table(j, "applied"))
        )
        return {(p, int(n)) for p, n in await cur.fetchall()}


async def balances(j: Journal) -> dict[str, int]:
    return (await bank.projected(j))[0]


async def reset_read_model(j: Journal) -> None:
    async with await psycopg.AsyncConnection.connect(j.dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("TRUNCATE {}, {}").format(bank.table(j, "applied"), bank.table(j, "balances"))
        )


async def offset_rows(j: Journal, name: str = NAME) -> list[tuple[int, str, int, datetime]]:
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(
            sql.SQL(
                "SELECT slice, persistence_id, seq_nr, timestamp_offset FROM {} "
                "WHERE projection_name = %s ORDER BY slice, timestamp_offset, persistence_id"
            ).format(ProjectionTables(j.tables).offset_store),
            (name,),
        )
        return [(s, p, int(n), ts) for s, p, n, ts in await cur.fetchall()]


def accounts_in(slices: SliceRange, count: int) -> list[str]:
    """`count` bank accounts whose slices lie in `slices`."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        if slice_for(bank.account(i)) in slices:
            out.append(bank.account(i))
        i += 1
    return out


async def journal_head(j: Journal) -> datetime:
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT max(db_timestamp) FROM {}").format(j.tables.journal)
        )
        row = await cur.fetchone()
        assert row is not None and row[0] is not None
        head: datetime = row[0]
        return head


async def caught_up(p: Projection, j: Journal) -> None:
    """Wait until `p` has handled every event of the journal: it reached the newest
    timestamp, and then an idle heartbeat, which the stream queues after every event
    of a query's rows, came through too."""
    head = await journal_head(j)

    def at_head() -> bool:
        latest = p.stats.latest_timestamp
        return latest is not None and latest >= head

    await eventually(at_head, f"{p.key} reached the journal head")
    heartbeats = p.stats.heartbeats
    await eventually(lambda: p.stats.heartbeats > heartbeats, f"{p.key} went idle")


# -- pause and resume ------------------------------------------------------------------------------


async def test_pausing_the_whole_projection_holds_events_until_resume(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    mgmt = ProjectionManagement(j)
    a, b = accounts_in(LOWER, 1)[0], accounts_in(UPPER, 1)[0]
    await j.append(a, [{"amount": 1}], expected_seq_nr=0)
    p = Watched.of(j, ALL)
    async with running(p):
        await eventually(lambda: _has(j, {(a, 1)}), "the first event is applied")
        await mgmt.pause(NAME)
        assert await mgmt.is_paused(NAME, ALL)
        assert await mgmt.is_paused(NAME, LOWER)  # "*" holds for any range
        await eventually(lambda: p.paused_polls > 0, "the instance sees the pause")
        polls = p.paused_polls
        await j.append(a, [{"amount": 2}, {"amount": 3}], expected_seq_nr=1)
        await j.append(b, [{"amount": 10}], expected_seq_nr=0)
        # The instance keeps looking at the flag (the stream has read the new
        # events meanwhile) and applies nothing.
        await eventually(lambda: p.paused_polls >= polls + 15, "fifteen more paused polls")
        assert await applied(j) == {(a, 1)}
        assert p.stats.accepted == 1
        await mgmt.resume(NAME)
        assert not await mgmt.is_paused(NAME, ALL)
        everything = {(a, 1), (a, 2), (a, 3), (b, 1)}
        await eventually(lambda: _has(j, everything), "the held events are applied")
    assert await applied(j) == everything
    assert await balances(j) == {a: 6, b: 10}
    assert p.stats.accepted == 4


async def test_pausing_one_range_holds_only_that_range(bank_journal: Journal) -> None:
    j = bank_journal
    mgmt = ProjectionManagement(j)
    a, b = accounts_in(LOWER, 1)[0], accounts_in(UPPER, 1)[0]
    await j.append(a, [{"amount": 1}], expected_seq_nr=0)
    await j.append(b, [{"amount": 1}], expected_seq_nr=0)
    lower, upper = Watched.of(j, LOWER), Watched.of(j, UPPER)
    async with running(lower, upper):
        await eventually(lambda: _has(j, {(a, 1), (b, 1)}), "both first events are applied")
        await mgmt.pause(NAME, LOWER)
        assert await mgmt.is_paused(NAME, LOWER)
        assert not await mgmt.is_paused(NAME, UPPER)
        await eventually(lambda: lower.paused_polls > 0, "the lower range sees the pause")
        polls = lower.paused_polls
        await j.append(a, [{"amount": 2}], expected_seq_nr=1)
        await j.append(b, [{"amount": 2}], expected_seq_nr=1)
        await eventually(lambda: _has(j, {(b, 2)}), "the running range applies its event")
        await eventually(lambda: lower.paused_polls >= polls + 15, "more paused polls")
        assert (a, 2) not in await applied(j)
        assert upper.paused_polls == 0
        # Resuming the whole projection does not lift a range's own pause ...
        await mgmt.pause(NAME)
        await mgmt.resume(NAME)
        assert await mgmt.is_paused(NAME, LOWER)
        # ... resuming the range does.
        await mgmt.resume(NAME, LOWER)
        assert not await mgmt.is_paused(NAME, LOWER)
        await eventually(lambda: _has(j, {(a, 2)}), "the held event is applied")
    assert await applied(j) == {(a, 1), (a, 2), (b, 1), (b, 2)}
    assert await balances(j) == {a: 3, b: 3}


async def _has(j: Journal, keys: set[tuple[str, int]]) -> bool:
    return keys <= await applied(j)


# -- set_offset and clear_offset -------------------------------------------------------------------


async def test_set_offset_skips_earlier_events_and_applies_later_ones(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    mgmt = ProjectionManagement(j)
    a, b, c = accounts_in(ALL, 3)
    await j.append(a, [{"amount": 1}], expected_seq_nr=0)
    await j.append(b, [{"amount": 10}], expected_seq_nr=0)
    t = await j.database_time()  # after the first events committed, before the next began
    await j.append(a, [{"amount": 2}], expected_seq_nr=1)
    await j.append(c, [{"amount": 100}], expected_seq_nr=0)
    await mgmt.set_offset(NAME, t + timedelta(hours=1))
    await mgmt.set_offset(NAME, t)  # moving it back replaces the first one
    rows = await offset_rows(j)
    assert len(rows) == 1024
    assert {(p, n, ts) for _, p, n, ts in rows} == {(PROGRESS_PID, START_SEQ_NR, t)}

    p = Watched.of(j, ALL)
    async with running(p):
        await eventually(lambda: _has(j, {(a, 2), (c, 1)}), "the later events are applied")
        # a's seq_nr 2 came with a gap (its seq_nr 1 is before the offset); the
        # runner fetched 1, found it a duplicate, then applied 2. Backtracking
        # re-reads the earlier events too; they stay duplicates.
        await eventually(lambda: p.stats.duplicates >= 3, "backtracking re-read old events")
    assert await applied(j) == {(a, 2), (c, 1)}
    assert await balances(j) == {a: 2, c: 100}
    assert p.stats.accepted == 2
    assert p.stats.gaps_filled == 1


async def test_clear_offset_restarts_from_the_beginning(bank_journal: Journal) -> None:
    j = bank_journal
    mgmt = ProjectionManagement(j)
    lower, upper = accounts_in(LOWER, 3), accounts_in(UPPER, 3)
    for i, pid in enumerate(lower + upper):
        await j.append(pid, [{"amount": i}], expected_seq_nr=0)
        await j.append(pid, [{"amount": 1}, {"amount": 2}], expected_seq_nr=1)
    everything = {(pid, n) for pid in lower + upper for n in (1, 2, 3)}

    async def project() -> None:
        p = Watched.of(j, ALL)
        async with running(p):
            await caught_up(p, j)

    await project()
    assert await applied(j) == everything
    assert {s for s, _, _, _ in await offset_rows(j)} >= {slice_for(pid) for pid in lower}

    # Clearing the lower half: only its events are applied again.
    await mgmt.clear_offset(NAME, LOWER)
    assert all(s in UPPER for s, _, _, _ in await offset_rows(j))
    await reset_read_model(j)
    await project()
    assert await applied(j) == {(pid, n) for pid in lower for n in (1, 2, 3)}

    # Clearing everything: a fresh read model gets every event once more.
    await mgmt.clear_offset(NAME)
    assert await offset_rows(j) == []
    await reset_read_model(j)
    await project()
    assert await applied(j) == everything
    _, rows, distinct = await bank.projected(j)
    assert rows == distinct == len(everything)
    assert await balances(j) == await bank.expected_balances(j)


async def test_events_after_deleted_unprojected_ones_are_applied(bank_journal: Journal) -> None:
    # The projection handled a's events up to 3; then 4..6 were written and 4..5
    # deleted before it read them. On restart it sees 6 with a gap it cannot fill.
    j = bank_journal
    a = accounts_in(ALL, 1)[0]
    await j.append(a, [{"amount": 1}, {"amount": 2}, {"amount": 3}], expected_seq_nr=0)
    p = Watched.of(j, ALL)
    async with running(p):
        await caught_up(p, j)
    await j.append(a, [{"amount": 10}, {"amount": 20}], expected_seq_nr=3)
    await j.append(a, [{"amount": 100}], expected_seq_nr=5)
    await j.delete_events_to(a, 5)
    p = Watched.of(j, ALL)
    async with running(p):
        await eventually(lambda: _has(j, {(a, 6)}), "the event after the deleted ones")
        await j.append(a, [{"amount": 1000}], expected_seq_nr=6)
        await eventually(lambda: _has(j, {(a, 7)}), "the pid's next event")
    assert await applied(j) == {(a, 1), (a, 2), (a, 3), (a, 6), (a, 7)}
    assert await balances(j) == {a: 1106}


# -- status and dead letters -----------------------------------------------------------------------


async def test_status_per_range(bank_journal: Journal) -> None:
    j = bank_journal
    mgmt = ProjectionManagement(j)
    ranges = slice_ranges(4)
    first = accounts_in(ranges[0], 1)[0]
    third = accounts_in(ranges[2], 1)[0]
    early = (await j.append(third, [{"amount": 1}], expected_seq_nr=0))[-1].db_timestamp
    t = await j.database_time()
    late = (await j.append(first, [{"amount": 1}, {"amount": 2}], expected_seq_nr=0))[
        -1
    ].db_timestamp
    assert early < t < late

    # A name nothing was ever stored for is reported, not shown as rows of None ...
    with pytest.raises(UnknownProjection, match=NAME):
        await mgmt.status(NAME, bank.ENTITY, ranges=4)
    # ... but an operator's resume (or pause) before the first start makes it known.
    await mgmt.resume(NAME)
    status = await mgmt.status(NAME, bank.ENTITY, ranges=4)
    assert [s.slice_range for s in status] == ranges
    assert [s.journal_head for s in status] == [late, None, early, None]
    assert [s.latest_offset for s in status] == [None] * 4
    assert [s.lag for s in status] == [None, timedelta(0), None, timedelta(0)]
    assert [s.paused for s in status] == [False] * 4

    await mgmt.set_offset(NAME, t)
    status = await mgmt.status(NAME, bank.ENTITY, ranges=4)
    assert [s.latest_offset for s in status] == [t] * 4
    assert [s.lag for s in status] == [late - t, timedelta(0), timedelta(0), timedelta(0)]

    await mgmt.pause(NAME, ranges[2])
    status = await mgmt.status(NAME, bank.ENTITY, ranges=4)
    assert [s.paused for s in status] == [False, False, True, False]
    await mgmt.pause(NAME)
    assert all(s.paused for s in await mgmt.status(NAME, bank.ENTITY, ranges=4))
    await mgmt.resume(NAME)
    await mgmt.resume(NAME, ranges[2])
    assert not any(s.paused for s in await mgmt.status(NAME, bank.ENTITY, ranges=4))

    p = Watched.of(j, ALL)
    async with running(p):
        await caught_up(p, j)
    status = await mgmt.status(NAME, bank.ENTITY, ranges=4)
    assert status[0].latest_offset is not None and status[0].latest_offset >= late
    assert [s.lag for s in status] == [timedelta(0)] * 4
    # One range given explicitly; another entity type has no events.
    [whole] = await mgmt.status(NAME, bank.ENTITY, ranges=[ALL])
    assert whole.journal_head == late and whole.lag == timedelta(0)
    [other] = await mgmt.status(NAME, "Other", ranges=[ALL])
    assert other.journal_head is None and other.lag == timedelta(0)
    assert await mgmt.dead_letters(NAME) == []


async def test_dead_letters_are_empty_by_default_and_per_projection(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    mgmt = ProjectionManagement(j)
    assert await mgmt.dead_letters(NAME) == []
    assert await mgmt.dead_letters("never-ran") == []
    # Another projection's dead letter is its own.
    t = datetime(2024, 1, 1, tzinfo=UTC)
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (projection_name, projection_key, slice, persistence_id, "
                "seq_nr, db_timestamp, error, failed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(ProjectionTables(j.tables).dead_letter),
            ("other", "0-1023", 7, "Bank|x", 3, t, "ValueError: boom", t),
        )
    assert await mgmt.dead_letters(NAME) == []
    assert await mgmt.dead_letters("other") == [
        DeadLetter("Bank|x", 3, 7, t, "ValueError: boom", t)
    ]


BAD_NAMES: dict[str, Any] = {
    "empty": "",
    "256 chars": "x" * 256,
    "NUL": "a\x00b",
    "None": None,
    "int": 42,
    "bytes": b"balances",
}


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
async def test_bad_projection_names_are_rejected(bank_journal: Journal, name: Any) -> None:
    j = bank_journal
    mgmt = ProjectionManagement(j)
    t = datetime(2024, 1, 1, tzinfo=UTC)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: mgmt.pause(name),
        lambda: mgmt.pause(name, LOWER),
        lambda: mgmt.resume(name),
        lambda: mgmt.is_paused(name, LOWER),
        lambda: mgmt.set_offset(name, t),
        lambda: mgmt.clear_offset(name),
        lambda: mgmt.status(name, bank.ENTITY),
        lambda: mgmt.dead_letters(name),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="projection name"):
            await call()
    with pytest.raises(ValueError, match="projection name"):
        Projection.exactly_once(
            j, name=name, entity_type=bank.ENTITY, slice_range=ALL, handler=bank.make_handler(j)
        )
    # Nothing was written.
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        for table in (
            ProjectionTables(j.tables).management,
            ProjectionTables(j.tables).offset_store,
        ):
            cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
            assert await cur.fetchone() == (0,)


async def test_odd_but_valid_names_are_stored_verbatim(bank_journal: Journal) -> None:
    mgmt = ProjectionManagement(bank_journal)
    for name in ("n" * 255, "x'); DROP TABLE applied; --", "Ünïcødé 🎉"):
        await mgmt.pause(name, LOWER)
        assert await mgmt.is_paused(name, LOWER)
        assert not await mgmt.is_paused(name, UPPER)
        assert not await mgmt.is_paused(name[:100] + "-other", LOWER)
    assert await applied(bank_journal) == set()  # the read model is still there


# -- the DAO's cleanup -----------------------------------------------------------------------------


async def test_dao_cleanup_keeps_each_slices_latest_row(bank_journal: Journal) -> None:
    j = bank_journal
    t0 = datetime(2024, 1, 1, tzinfo=UTC)

    def at(seconds: int) -> datetime:
        return t0 + timedelta(seconds=seconds)

    def marker(slice_: int, seconds: int) -> Record:
        return Record(slice_, PROGRESS_PID, PROGRESS_SEQ_NR, at(seconds))

    rows = [
        # slice 0: latest 100, window 30 -> rows before 70 go
        Record(0, "T|a", 1, at(0)),
        Record(0, "T|a", 2, at(10)),
        Record(0, "T|b", 1, at(50)),
        Record(0, "T|edge", 1, at(70)),
        Record(0, "T|c", 1, at(100)),
        # slice 1: old rows within the window of its latest (a marker)
        Record(1, "T|d", 1, at(0)),
        marker(1, 1),
        # slice 2: an old progress marker and a newer event
        marker(2, 5),
        Record(2, "T|e", 1, at(200)),
        # slice 3: only a progress marker
        marker(3, 300),
        # slice 600: outside the cleaned range
        Record(600, "T|f", 1, at(0)),
        Record(600, "T|f", 2, at(100)),
    ]
    dao, other = (
        OffsetDao(ProjectionTables(j.tables), NAME),
        OffsetDao(ProjectionTables(j.tables), "other"),
    )
    async with j.pool.connection() as conn:
        await dao.save(conn, "0-1023", rows)
        # Storing an event's offset twice is refused as a whole (another instance
        # handled it): the transaction fails and changes nothing.
        with pytest.raises(psycopg.errors.UniqueViolation):
            async with conn.transaction():
                await dao.save(conn, "0-1023", rows)
        await other.save(conn, "0-1023", rows[:5])
    async with j.pool.connection() as conn:
        deleted = await dao.cleanup(conn, LOWER, timedelta(seconds=30))
    assert deleted == 4

    def row(r: Record) -> tuple[int, str, int, datetime]:
        return (r.slice, r.persistence_id, r.seq_nr, r.timestamp)

    kept = [rows[3], rows[4], rows[5], rows[6], rows[8], rows[9], rows[10], rows[11]]
    assert await offset_rows(j) == sorted(map(row, kept), key=lambda x: (x[0], x[3], x[1]))
    assert len(await offset_rows(j, "other")) == 5  # another projection's rows are untouched

    # A slice's new progress marker replaces its old one (only that slice's); cleaning
    # again deletes nothing.
    async with j.pool.connection() as conn:
        await dao.save(conn, "0-1023", [marker(3, 400)])
        assert await dao.cleanup(conn, LOWER, timedelta(seconds=30)) == 0
        loaded = await dao.load(conn, SliceRange(1, 3))
    assert sorted(loaded, key=lambda r: (r.slice, r.timestamp)) == [
        rows[5],
        rows[6],
        rows[8],
        marker(3, 400),
    ]


async def test_a_range_pause_holds_across_a_different_split(bank_journal: Journal) -> None:
    mgmt = ProjectionManagement(bank_journal)
    await mgmt.pause(NAME, SliceRange(0, 255))
    # Any instance sharing a slice with the paused range is paused, whatever the split.
    assert await mgmt.is_paused(NAME, LOWER)
    assert await mgmt.is_paused(NAME, ALL)
    assert await mgmt.is_paused(NAME, SliceRange(255, 300))
    assert not await mgmt.is_paused(NAME, SliceRange(256, 511))
    assert not await mgmt.is_paused(NAME, UPPER)
    status = await mgmt.status(NAME, bank.ENTITY, ranges=8)
    assert [s.paused for s in status] == [True, True] + [False] * 6
    await mgmt.resume(NAME, SliceRange(0, 255))
    assert not await mgmt.is_paused(NAME, ALL)


async def test_status_tells_where_a_merged_range_would_resume(bank_journal: Journal) -> None:
    mgmt = ProjectionManagement(bank_journal)
    early = datetime(2024, 1, 1, tzinfo=UTC)
    late = early + timedelta(minutes=10)
    await mgmt.set_offset(NAME, early, LOWER)
    await mgmt.set_offset(NAME, late, UPPER)
    [whole] = await mgmt.status(NAME, bank.ENTITY, ranges=1)
    assert whole.latest_offset == late  # the newest row ...
    assert whole.resume_from == early  # ... but a merged instance starts at the earliest
    await mgmt.clear_offset(NAME, UPPER)
    [whole] = await mgmt.status(NAME, bank.ENTITY, ranges=1)
    assert whole.resume_from is None  # a slice without a row: from the beginning


async def test_management_rejects_bad_arguments_with_typed_errors(bank_journal: Journal) -> None:
    mgmt = ProjectionManagement(bank_journal)
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        await mgmt.set_offset(NAME, datetime(2024, 1, 1))
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        await mgmt.set_offset(NAME, "yesterday")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="SliceRange"):
        await mgmt.pause(NAME, "0-255")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="SliceRange"):
        await mgmt.clear_offset(NAME, (0, 255))  # type: ignore[arg-type]


async def test_a_pause_is_seen_within_a_poll_in_the_middle_of_a_catch_up(
    bank_journal: Journal,
) -> None:
    """The stream reaches an instance in parts of up to 50 envelopes; the management poll
    (pause) still comes between envelopes, not only between parts: with a handler of 20 ms
    an envelope and a poll every 0.1 s, a pause stops it within a few events."""
    j = bank_journal
    mgmt = ProjectionManagement(j)
    pids = accounts_in(ALL, 10)
    for pid in pids:
        await j.append(pid, [{"amount": 1}] * 20, expected_seq_nr=0)
    handled = 0
    inner = bank.make_handler(j)

    async def slow(conn: Any, env: EventEnvelope) -> None:
        nonlocal handled
        await asyncio.sleep(0.02)
        await inner(conn, env)
        handled += 1

    p = Projection.exactly_once(
        j, name=NAME, entity_type=bank.ENTITY, slice_range=ALL, handler=slow, settings=SETTINGS
    )
    async with running(p):
        await eventually(lambda: handled >= 5, "the catch-up is under way")
        await mgmt.pause(NAME)
        at_pause = handled
        await eventually(lambda: mgmt.is_paused(NAME, ALL), "paused")
        stopped_at = handled

        async def settled() -> bool:
            nonlocal stopped_at
            before, stopped_at = stopped_at, handled
            await asyncio.sleep(0.5)
            return handled == before == stopped_at

        await eventually(settled, "the instance stops handling")
        assert handled - at_pause < 30, (at_pause, handled)  # a part is 50 envelopes
        assert handled < len(pids) * 20
        await mgmt.resume(NAME)
        await eventually(lambda: handled == len(pids) * 20, "every event after the resume")

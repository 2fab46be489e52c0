"""events_by_slices / current_events_by_slices against a real PostgreSQL.

The late-commit test holds real transactions open after they took their
timestamp while others commit, and checks every event end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from journal import (
    BacktrackingSettings,
    EventEnvelope,
    InvalidArgument,
    InvalidPersistenceId,
    Journal,
    JournalSettings,
    TimestampOffset,
    slice_for,
    slice_ranges,
)
from journal.model import NOT_LOADED
from tests.support.pg import fast_query_settings
from tests.support.slices import collect_until, journal_events

ENTITY = "Acc"


def pids_across_all_slices(n: int) -> list[str]:
    pids = [f"{ENTITY}|{uuid.uuid5(uuid.NAMESPACE_OID, str(i))}" for i in range(n)]
    assert len({slice_for(p) // 256 for p in pids}) == 4
    return pids


@pytest.mark.slow
async def test_late_commits_are_delivered_by_four_live_queries(pg_dsn: str, schema: str) -> None:
    settings = JournalSettings(
        schema=schema,
        pool_max_size=40,
        query=fast_query_settings(
            buffer_size=50,
            backtracking=BacktrackingSettings(window=30, behind_current_time=6),
        ),
    )
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        outs: list[list[EventEnvelope]] = [[] for _ in range(4)]
        stop = asyncio.Event()
        readers = [
            asyncio.create_task(
                collect_until(j.events_by_slices(ENTITY, r.min_slice, r.max_slice), outs[i], stop)
            )
            for i, r in enumerate(slice_ranges(4))
        ]
        rng = random.Random(7)
        pids = pids_across_all_slices(400)
        seq = dict.fromkeys(pids, 0)
        late_held = 0

        async def writer(w: int) -> None:
            nonlocal late_held
            mine = pids[w::8]
            for _ in range(40):
                pid = rng.choice(mine)
                n = rng.randint(1, 3)
                if rng.random() < 0.15:
                    # Take the timestamp now, commit 1-5 s later.
                    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
                        await j.append(pid, [{"w": w}] * n, expected_seq_nr=seq[pid], conn=conn)
                        seq[pid] += n
                        late_held += 1
                        await asyncio.sleep(rng.uniform(1, 5))
                        await conn.commit()
                else:
                    await j.append(pid, [{"w": w}] * n, expected_seq_nr=seq[pid])
                    seq[pid] += n
                await asyncio.sleep(rng.uniform(0, 0.05))

        await asyncio.gather(*(writer(w) for w in range(8)))
        expected = await journal_events(j)
        assert late_held > 5
        # Wait until every event has arrived (backtracking needs ~behind_current_time).
        for _ in range(600):
            got = {(e.persistence_id, e.seq_nr) for out in outs for e in out}
            if got >= expected:
                break
            await asyncio.sleep(0.1)
        stop.set()
        for t in readers:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        delivered = [(e.persistence_id, e.seq_nr) for out in outs for e in out]
        assert set(delivered) == expected, f"missing: {sorted(expected - set(delivered))[:10]}"
        for i, r in enumerate(slice_ranges(4)):
            assert all(r.min_slice <= e.slice <= r.max_slice for e in outs[i])
            last: dict[str, int] = {}
            for e in outs[i]:
                if e.source == "query":
                    assert e.seq_nr > last.get(e.persistence_id, 0), e
                    last[e.persistence_id] = e.seq_nr
                    assert e.event == {"w": e.event["w"]}
                else:
                    assert e.source == "backtracking" and e.event is NOT_LOADED
        duplicates = len(delivered) - len(expected)
        print(f"\n{len(expected)} events, {late_held} late transactions, {duplicates} duplicates")


async def test_thousands_of_events_sharing_one_timestamp(pg_dsn: str, schema: str) -> None:
    settings = JournalSettings(schema=schema, query=fast_query_settings(buffer_size=100))
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            for p in range(30):
                await j.append(
                    f"{ENTITY}|tie-{p}",
                    [{"n": i} for i in range(100)],
                    expected_seq_nr=0,
                    conn=conn,
                )
            await conn.commit()
        expected = await journal_events(j)
        assert len(expected) == 3000
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            cur = await conn.execute(
                psycopg.sql.SQL("SELECT count(DISTINCT db_timestamp) FROM {}").format(
                    j.tables.journal
                )
            )
            assert (await cur.fetchone()) == (1,)
        current = [e async for e in j.current_events_by_slices(ENTITY, 0, 1023)]
        assert len(current) == 3000
        assert {(e.persistence_id, e.seq_nr) for e in current} == expected
        assert [e.seq_nr for e in current] == sorted(e.seq_nr for e in current)
        live: list[EventEnvelope] = []
        stream = j.events_by_slices(ENTITY, 0, 1023)
        async for e in stream:
            if e.source == "query":
                live.append(e)
            if len(live) == 3000:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        assert {(e.persistence_id, e.seq_nr) for e in live} == expected


async def test_resume_from_random_offsets_gives_the_journal_once(pg_dsn: str, schema: str) -> None:
    query = fast_query_settings(buffer_size=7, backtracking=BacktrackingSettings(enabled=False))
    settings = JournalSettings(schema=schema, query=query)
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        rng = random.Random(3)
        for p in range(25):
            seq = 0
            for _ in range(rng.randint(1, 4)):
                n = rng.randint(1, 5)
                await j.append(f"{ENTITY}|r{p}", [p] * n, expected_seq_nr=seq)
                seq += n
        expected = await journal_events(j)
        got: list[tuple[str, int]] = []
        offset: TimestampOffset | None = None
        restarts = 0
        while len(got) < len(expected) and restarts < 200:
            take = rng.randint(1, 12)
            stream = j.events_by_slices(ENTITY, 0, 1023, offset)
            async for e in stream:
                got.append((e.persistence_id, e.seq_nr))
                offset = e.offset
                take -= 1
                if take == 0 or len(got) == len(expected):
                    break
            await stream.aclose()  # type: ignore[attr-defined]
            restarts += 1
        assert restarts > 5
        assert len(got) == len(set(got)), "an event was repeated after a restart"
        assert set(got) == expected


async def test_current_events_by_slices_stops_at_start_time(journal: Journal) -> None:
    for i in range(5):
        await journal.append(f"{ENTITY}|c{i}", [i], expected_seq_nr=0)
    stream = journal.current_events_by_slices(ENTITY, 0, 1023)
    first = await stream.__anext__()
    await journal.append(f"{ENTITY}|later", ["late"], expected_seq_nr=0)
    rest = [e async for e in stream]
    assert sorted([first.persistence_id] + [e.persistence_id for e in rest]) == [
        f"{ENTITY}|c{i}" for i in range(5)
    ]


async def test_notifications_wake_a_quiet_stream(pg_dsn: str, schema: str) -> None:
    # refresh_interval is a minute: only a notification can deliver within the test.
    settings = JournalSettings(
        schema=schema, query=fast_query_settings(refresh_interval=60, heartbeat_interval=120)
    )
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        stream = j.events_by_slices(ENTITY, 0, 1023)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.5)  # the stream is now waiting
        await j.append(f"{ENTITY}|n", ["hello"], expected_seq_nr=0)
        env = await asyncio.wait_for(first, 20)
        assert env.event == "hello"
        # Kill the listening backend: the listener reconnects and later appends still wake it.
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
            cur = await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
            )
            assert await cur.fetchall(), "no LISTEN backend found"
        await asyncio.sleep(1.0)
        nxt = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.5)
        await j.append(f"{ENTITY}|n", ["again"], expected_seq_nr=1)
        env = await asyncio.wait_for(nxt, 20)
        assert env.event == "again"
        await stream.aclose()  # type: ignore[attr-defined]


async def test_idle_stream_emits_advancing_heartbeats(journal: Journal) -> None:
    await journal.append(f"{ENTITY}|h", ["x"], expected_seq_nr=0)
    beats: list[EventEnvelope] = []
    stream = journal.events_by_slices(ENTITY, 0, 1023, heartbeats=True)
    async for e in stream:
        if e.is_heartbeat:
            beats.append(e)
            if len(beats) == 2:
                break
    await stream.aclose()  # type: ignore[attr-defined]
    assert beats[0].offset is not None and beats[1].offset is not None
    assert beats[1].offset.timestamp > beats[0].offset.timestamp


async def test_backtracking_envelopes_load_their_payload(journal: Journal) -> None:
    await journal.append(f"{ENTITY}|b", [{"v": 1}, {"v": 2}], expected_seq_nr=0)
    env = await journal.load_envelope(f"{ENTITY}|b", 2)
    assert env is not None and env.event == {"v": 2}
    ts = await journal.timestamp_of(f"{ENTITY}|b", 1)
    assert ts == env.db_timestamp
    assert await journal.load_envelope(f"{ENTITY}|b", 3) is None
    assert await journal.timestamp_of(f"{ENTITY}|nope", 1) is None


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((ENTITY, 10, 5), InvalidArgument),
        ((ENTITY, -1, 5), InvalidArgument),
        ((ENTITY, 0, 1024), InvalidArgument),
        ((ENTITY, 0, "5"), InvalidArgument),
        (("", 0, 5), InvalidPersistenceId),
        (("A|b", 0, 5), InvalidPersistenceId),
    ],
)
async def test_bad_slice_query_arguments_fail_up_front(
    journal: Journal, args: tuple[Any, ...], error: type[Exception]
) -> None:
    with pytest.raises(error):
        journal.events_by_slices(*args)
    with pytest.raises(error):
        journal.current_events_by_slices(*args)


async def test_offset_of_the_wrong_type_fails_up_front(journal: Journal) -> None:
    with pytest.raises(InvalidArgument, match="TimestampOffset"):
        journal.events_by_slices(ENTITY, 0, 1, offset="2024-01-01")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        journal.current_events_by_slices(ENTITY, 0, 1, offset=timedelta(1))  # type: ignore[arg-type]


async def test_catch_up_query_uses_the_slice_index(pg_dsn: str, journal: Journal) -> None:
    from journal.query import sql as q
    from journal.query.by_slice import RowsQuery

    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
                "event_ser_id, event_ser_manifest, event_payload, writer) "
                "SELECT s % 1024, 'Acc', 'Acc|' || s, 1, "
                "now() - interval '1 hour' + s * interval '1 millisecond', 31, '', "
                "'1'::bytea, 'w' FROM generate_series(1, 50000) s"
            ).format(journal.tables.journal)
        )
        await conn.execute(psycopg.sql.SQL("ANALYZE {}").format(journal.tables.journal))
        async with contextlib.aclosing(
            journal.current_events_by_slices(ENTITY, 0, 255)  # type: ignore[type-var]
        ) as stream:
            first = await anext(aiter(stream))
        assert first.offset is not None
        query = RowsQuery(
            backtracking=False,
            from_timestamp=first.offset.timestamp,
            exclude={},
            to_inclusive=None,
            until_exclusive=first.offset.timestamp + timedelta(seconds=10),
            behind_current_time=timedelta(milliseconds=100),
            limit=None,
        )
        statement, params = q.slice_rows(journal.tables, ENTITY, 0, 255, query)
        cur = await conn.execute(psycopg.sql.SQL("EXPLAIN ") + statement, params)
        plan = "\n".join(r[0] for r in await cur.fetchall())
        assert journal.tables.journal_slice_index.as_string(conn).strip('"') in plan, plan


@pytest.mark.timeout(30)
async def test_settings_of_a_slice_query_is_the_deprecated_name_of_query_settings(
    journal: Journal,
) -> None:
    await journal.append("Acct|dep", [{"n": 1}], expected_seq_nr=0)
    query = fast_query_settings(buffer_size=7)
    with pytest.warns(DeprecationWarning, match="query_settings="):
        read = [e async for e in journal.current_events_by_slices("Acct", 0, 1023, settings=query)]
    assert [e.seq_nr for e in read] == [1]
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidArgument, match="only"):
        journal.events_by_slices("Acct", 0, 1023, settings=query, query_settings=query)


async def test_reads_arrive_in_utc_whatever_the_session_time_zone(pg_dsn: str, schema: str) -> None:
    """The read pool's sessions run in UTC (no time-zone conversion per value read): a
    user's session zone changes how an appended timestamp is labelled, not which instant
    it is, and every reader sees the instant the writer stored."""
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, options="-c TimeZone=America/New_York")
    async with Journal.connect(dsn, JournalSettings(schema=schema), create_schema=True) as j:
        written = await j.append(f"{ENTITY}|tz", [{"n": 1}, {"n": 2}], expected_seq_nr=0)
        async with j.pool.connection() as conn:  # the write pool keeps the user's zone
            cur = await conn.execute("SHOW TimeZone")
            assert (await cur.fetchone()) == ("America/New_York",)
        pid = f"{ENTITY}|tz"
        by_slices = [
            e async for e in j.current_events_by_slices(ENTITY, slice_for(pid), slice_for(pid))
        ]
        by_pid = [e async for e in j.current_events_by_persistence_id(pid)]
    for read in (by_slices, by_pid):
        assert [e.db_timestamp for e in read] == [e.db_timestamp for e in written]
        assert all(e.db_timestamp.utcoffset() == timedelta(0) for e in read)
        assert all(e.offset is None or e.offset.read_timestamp.utcoffset() == timedelta(0)
                   for e in read)  # fmt: skip


async def test_the_stream_in_parts_is_the_stream(journal: Journal) -> None:
    """`SliceReader.stream_parts` (what a projection's pump reads) flattens to exactly what
    the public stream yields, in parts of at most `PART` envelopes, none empty."""
    from journal.aio.slice_reader import PART
    from journal.query.source import EVENTS

    for i in range(7):
        await journal.append(f"Part|{i}", [{"n": n} for n in range(1, 31)], expected_seq_nr=0)
    streamed = [e async for e in journal.current_events_by_slices("Part", 0, 1023)]
    parts = [
        part
        async for part in journal._slices.stream_parts(
            "Part", 0, 1023, None, source=EVENTS, live=False
        )
    ]

    def key(e: Any) -> tuple[Any, ...]:  # all but the time each read ran
        return (*e[:11], e.offset.timestamp, dict(e.offset.seen), e.source)

    assert [key(e) for part in parts for e in part] == [key(e) for e in streamed]
    assert len(streamed) == 210 and len(parts) > 210 // PART
    assert all(0 < len(part) <= PART for part in parts)

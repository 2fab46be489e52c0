"""The visibility horizon on a real server, with transactions really held open.

Long transactions are the case Pekko's query misses: an event whose transaction
commits after backtracking has passed its timestamp. Here they are held open
for 15-25 s (through `append(conn=)` and through Pekko's own INSERT) while
short writes go on, and every live stream and an exactly-once projection must
deliver every event once. A stream without the horizon runs beside them and
must miss some, which shows the scenario is the one that loses events.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import attrs
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from journal import (
    EventEnvelope,
    HorizonSettings,
    Journal,
    SliceRange,
    slice_ranges,
)
from projections import Projection
from tests.support import bank
from tests.support.long_transactions import LongWriters, horizon_settings, short_writes, stop_all
from tests.support.projections import FAST
from tests.support.slices import collect_until, journal_events


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_long_transactions_reach_every_stream_and_projection_once(
    pg_dsn: str, schema: str
) -> None:
    async with Journal.connect(
        pg_dsn, horizon_settings(schema, max_hold=4), create_schema=True
    ) as j:
        await bank.create_read_model(j)
        projection = Projection.exactly_once(
            j,
            name="balances",
            entity_type=bank.ENTITY,
            slice_range=SliceRange(0, 1023),
            handler=bank.make_handler(j),
            settings=FAST,
        )
        running = asyncio.create_task(projection.run())
        ranges = slice_ranges(4)
        outs: list[list[EventEnvelope]] = [[] for _ in ranges]
        behind_clock: list[EventEnvelope] = []
        done = asyncio.Event()
        pekko_query = attrs.evolve(j.settings.query, horizon=HorizonSettings(enabled=False))
        readers = [
            asyncio.create_task(
                collect_until(j.events_by_slices(bank.ENTITY, r.min_slice, r.max_slice), out, done)
            )
            for r, out in zip(ranges, outs, strict=True)
        ]
        readers.append(
            asyncio.create_task(
                collect_until(
                    j.events_by_slices(bank.ENTITY, 0, 1023, query_settings=pekko_query),
                    behind_clock,
                    done,
                )
            )
        )
        stop = asyncio.Event()
        shorts = [asyncio.create_task(short_writes(j, stop, seed)) for seed in range(3)]
        long_writers = LongWriters(j, pg_dsn)
        await long_writers.run()
        stop.set()
        written = sum(await asyncio.gather(*shorts))
        expected = await journal_events(j)
        assert written + 8 == len(expected)

        def delivered() -> set[tuple[str, int]]:
            return {(e.persistence_id, e.seq_nr) for out in outs for e in out}

        for _ in range(300):
            if delivered() >= expected:
                break
            await asyncio.sleep(0.1)
        await bank.assert_applied_exactly_once(j, within=60)
        done.set()
        await stop_all(readers)
        await projection.stop()
        await running

        assert delivered() == expected, f"missing: {sorted(expected - delivered())[:10]}"
        for r, out in zip(ranges, outs, strict=True):
            assert all(r.min_slice <= e.slice <= r.max_slice for e in out)
            normal = [(e.persistence_id, e.seq_nr) for e in out if e.source == "query"]
            assert len(normal) == len(set(normal)), "a normal query delivered an event twice"
        # The same history, read behind the clock without the horizon, loses events.
        long_events = {(p, s) for p, s in expected if p in long_writers.pids}
        seen_behind = {(e.persistence_id, e.seq_nr) for e in behind_clock}
        assert long_events - seen_behind, "the scenario did not outlast backtracking"


async def append_latencies(j: Journal, count: int, every: float) -> list[float]:
    """Append `count` events and return how long each took to reach a live stream."""
    loop = asyncio.get_running_loop()
    sent: dict[int, float] = {}
    got: dict[int, float] = {}
    pid = f"{bank.ENTITY}|probe-{uuid.uuid4().hex[:8]}"

    async def read() -> None:
        async for env in j.events_by_slices(bank.ENTITY, 0, 1023):
            if env.persistence_id == pid:
                got[env.seq_nr] = loop.time()
                if len(got) == count:
                    return

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.5)
    for seq_nr in range(1, count + 1):
        sent[seq_nr] = loop.time()
        await j.append(pid, [{"amount": 1}], expected_seq_nr=seq_nr - 1)
        await asyncio.sleep(every)
    await asyncio.wait_for(reader, 30)
    return [got[s] - sent[s] for s in sent]


@pytest.mark.timeout(90)
async def test_an_idle_transaction_holds_the_tail_at_most_max_hold(
    pg_dsn: str, schema: str
) -> None:
    async with (
        Journal.connect(pg_dsn, horizon_settings(schema, max_hold=2), create_schema=True) as j,
        await psycopg.AsyncConnection.connect(pg_dsn) as idle,
    ):
        await idle.execute("SELECT 1")  # idle in transaction, never writes
        latencies = await append_latencies(j, 30, 0.2)
        await idle.rollback()
    # Held while the session was younger than max_hold, then not waited for.
    assert max(latencies) > 0.5, "the idle transaction was not waited for at all"
    assert max(latencies) < 2 + 1.5, f"the tail stalled beyond max_hold: {max(latencies):.2f} s"


@pytest.mark.timeout(90)
async def test_a_transaction_in_another_database_does_not_hold_the_tail(
    pg_dsn: str, schema: str
) -> None:
    other = make_conninfo(pg_dsn, dbname="template1")
    async with Journal.connect(
        pg_dsn, horizon_settings(schema, max_hold=60), create_schema=True
    ) as j:
        try:
            conn = await psycopg.AsyncConnection.connect(other)
        except psycopg.OperationalError as e:
            pytest.skip(f"cannot open a session in another database: {e}")
        async with conn:
            await conn.execute("SELECT 1")  # open, read-only, in template1
            latencies = await append_latencies(j, 20, 0.1)
            await conn.rollback()
    assert max(latencies) < 1.0, f"held by another database: {max(latencies):.2f} s"


@pytest.mark.timeout(90)
async def test_without_the_privilege_the_journal_warns_once_and_falls_back(
    pg_dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that cannot see other roles' sessions in pg_stat_activity (here a
    superuser's, which may write to the journal) says so once, naming the grant,
    and still delivers every event by staying behind the clock."""
    params = conninfo_to_dict(pg_dsn)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
        cur = await admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = await cur.fetchone()
        if not (row and row[0]) or params.get("password"):
            pytest.skip("needs a superuser DSN without a password (the embedded server)")
        role = f"sj_reader_{uuid.uuid4().hex[:8]}"
        ident = sql.Identifier(role)
        settings = horizon_settings(schema)
        # The schema and its tables exist before the role gets its grants.
        async with Journal.connect(pg_dsn, settings, create_schema=True):
            pass
        await admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        try:
            await admin.execute(
                sql.SQL(
                    "GRANT USAGE ON SCHEMA {s} TO {r}; "
                    "GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA {s} TO {r}"
                ).format(s=sql.Identifier(schema), r=ident)
            )
            caplog.set_level(logging.WARNING, logger="slicejournal.journal.query")
            as_role = make_conninfo(pg_dsn, user=role)
            async with (
                Journal.connect(pg_dsn, settings) as writer,
                Journal.connect(as_role, settings) as reader,
            ):
                pid = f"{bank.ENTITY}|fallback"
                got: list[EventEnvelope] = []
                done = asyncio.Event()
                task = asyncio.create_task(
                    collect_until(reader.events_by_slices(bank.ENTITY, 0, 1023), got, done)
                )
                for i in range(10):
                    await writer.append(pid, [{"amount": i}], expected_seq_nr=i)
                    await asyncio.sleep(0.1)
                for _ in range(100):
                    if len(got) >= 10:
                        break
                    await asyncio.sleep(0.1)
                done.set()
                await stop_all([task])
            assert [e.seq_nr for e in got] == list(range(1, 11))
            warnings = [r.getMessage() for r in caplog.records if "horizon" in r.getMessage()]
            assert len(warnings) == 1, warnings
            assert f"GRANT pg_read_all_stats TO {role}" in warnings[0]
        finally:
            await admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            await admin.execute(sql.SQL("DROP ROLE {}").format(ident))


@pytest.mark.timeout(60)
async def test_a_stream_closed_with_a_re_read_due_says_so(
    pg_dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="slicejournal.journal.query")
    async with Journal.connect(
        pg_dsn, horizon_settings(schema, max_hold=0.5), create_schema=True
    ) as j:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as idle:
            await idle.execute("SELECT 1")  # may still write; not waited for after 0.5 s
            latencies = await append_latencies(j, 10, 0.1)
            assert max(latencies) < 5
            await asyncio.sleep(0.2)  # the stream above has closed by now
            closed = [r.getMessage() for r in caplog.records if "closed before" in r.getMessage()]
            assert len(closed) == 1, closed
            await idle.rollback()
        # Once the transaction has ended and been re-read for, closing is quiet.
        caplog.clear()
        await append_latencies(j, 3, 0.1)
        assert not [r for r in caplog.records if "closed before" in r.getMessage()]

"""Concurrent appends of one process share a statement (`journal/append_groups.py`).

A group must store exactly what the same appends store alone, give every
append its own outcome (stored, or `ConcurrencyError` with nothing of it
stored), and never let one append's failure take the others with it. The
statements are held open with real uncommitted rows on other connections, so
that the order of events is forced, not hoped for.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from journal import ConcurrencyError, Journal, JournalSettings, SyncJournal, slice_for
from journal.aio import writer as aio_writer
from journal.append_groups import ESCAPE_SECONDS
from journal.errors import SchemaNotInitialized
from journal.sync import writer as sync_writer
from tests.support.pg import Row, drop_test_schema, fetch, fresh_schema_name

pytestmark = pytest.mark.timeout(60)

COLUMNS = (
    "slice, entity_type, persistence_id, seq_nr, writer, event_ser_id, event_ser_manifest, "
    "event_payload, tags, meta_ser_id, meta_ser_manifest, meta_payload, deleted"
)

# (persistence id, events, tags, metadata): each round's appends run concurrently.
ROUNDS: list[list[tuple[str, list[Any], list[str], Any]]] = [
    [
        ("Acct|a", [{"amount": 1}], [], None),
        ("Acct|b", [{"n": i} for i in range(3)], ['q"u\\o', "t,1", "{x}", "é ✓"], {"m": [1]}),
        ("Acct|c", [b"\x00\xff raw", {"big": 2**70}], ["NULL"], None),
        ("Other|d", ["text", 1.5, None, True], [], {"nested": {"k": "v"}}),
        ("Acct|e", [{"n": i} for i in range(12)], ["one", "two"], "meta"),
        ("Acct|f", [{"x": 1}], ["solo"], None),
    ],
    [
        ("Acct|a", [{"amount": 2}, {"amount": 3}], ["t"], None),
        ("Acct|b", [{"n": 3}], [], "m2"),
        ("Acct|c", [{"n": 4}], ["x", "y", "z"], None),
        ("Other|d", [{"n": 5}], [], None),
    ],
]


def table(schema: str) -> sql.Composable:
    return sql.Identifier(schema, "event_journal")


async def stored(pg_dsn: str, schema: str) -> list[Row]:
    return await fetch(
        pg_dsn,
        sql.SQL("SELECT " + COLUMNS + " FROM {} ORDER BY persistence_id, seq_nr").format(
            table(schema)
        ),
    )


async def group_statement_prepared(journal: Journal) -> bool:
    """Whether the journal's (single) write connection ran a group statement: it is
    prepared there the first time it runs."""
    assert journal.settings.pool_max_size == 1
    wire = journal._writer._sql.append_group.wire
    assert wire is not None
    async with journal.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE name = %s",
            (wire.name.decode(),),
        )
        row = await cur.fetchone()
    return bool(row and row[0])


@pytest.fixture(autouse=True)
def patient_appends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting appends wait for their group however slow this machine is (they run alone
    after `ESCAPE_SECONDS`, which the tests that count groups must not depend on)."""
    monkeypatch.setattr(aio_writer, "ESCAPE_SECONDS", 30.0)
    monkeypatch.setattr(sync_writer, "ESCAPE_SECONDS", 30.0)


@pytest.fixture
def two_schemas(pg_dsn: str) -> Iterator[tuple[str, str]]:
    names = (fresh_schema_name(), fresh_schema_name())
    yield names
    for name in names:
        drop_test_schema(pg_dsn, name)


async def append_rounds(journal: Journal) -> dict[tuple[str, int], datetime]:
    """Append each round's batches concurrently; the returned timestamp of every event."""
    highest: dict[str, int] = {}
    returned: dict[tuple[str, int], datetime] = {}
    for appends in ROUNDS:
        results = await asyncio.gather(
            *(
                journal.append(
                    pid, events, expected_seq_nr=highest.get(pid, 0), tags=tags, metadata=meta
                )
                for pid, events, tags, meta in appends
            )
        )
        for (pid, events, _, _), appended in zip(appends, results, strict=True):
            expected = highest.get(pid, 0)
            assert [e.seq_nr for e in appended] == list(
                range(expected + 1, expected + 1 + len(events))
            )
            assert [e.event for e in appended] == events
            assert len({e.db_timestamp for e in appended}) == 1
            returned.update(((e.persistence_id, e.seq_nr), e.db_timestamp) for e in appended)
            highest[pid] = expected + len(events)
    return returned


async def transactions(pg_dsn: str, schema: str) -> dict[tuple[str, int], tuple[str, datetime]]:
    """Each stored event's transaction (xmin) and db_timestamp."""
    rows = await fetch(
        pg_dsn,
        sql.SQL("SELECT persistence_id, seq_nr, xmin::text, db_timestamp FROM {}").format(
            table(schema)
        ),
    )
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


async def test_a_group_stores_what_the_same_appends_store_alone(
    pg_dsn: str, two_schemas: tuple[str, str]
) -> None:
    grouped, alone = two_schemas
    common = {"pool_max_size": 1, "writer_id": "w-1"}
    async with Journal.connect(
        pg_dsn, JournalSettings(schema=grouped, append_statements=1, **common), create_schema=True
    ) as j:
        returned = await append_rounds(j)
        assert await group_statement_prepared(j)
        read = [e async for e in j.current_events_by_persistence_id("Acct|b")]
    async with Journal.connect(
        pg_dsn, JournalSettings(schema=alone, append_statements=None, **common), create_schema=True
    ) as j:
        await append_rounds(j)
        assert not await group_statement_prepared(j)
    rows = await stored(pg_dsn, grouped)
    assert len(rows) == sum(len(a[1]) for r in ROUNDS for a in r)
    assert rows == await stored(pg_dsn, alone)
    assert [e.event for e in read] == [{"n": i} for i in range(4)]
    assert [e.tags for e in read] == [('q"u\\o', "t,1", "{x}", "é ✓")] * 3 + [()]
    assert [e.metadata for e in read] == [{"m": [1]}] * 3 + ["m2"]
    # Each round's first append ran alone, the rest waited and went as one group: one
    # transaction, so one xmin, for them all. Every returned timestamp is the stored one.
    grouped_rows = await transactions(pg_dsn, grouped)
    assert {key: at for key, (_, at) in grouped_rows.items()} == returned
    highest: dict[str, int] = {}
    for appends in ROUNDS:
        keys = set()
        for pid, events, *_ in appends:
            keys.update((pid, highest.get(pid, 0) + k) for k in range(1, len(events) + 1))
            highest[pid] = highest.get(pid, 0) + len(events)
        assert len({grouped_rows[key][0] for key in keys}) == 2
    alone_rows = await transactions(pg_dsn, alone)
    assert len({xmin for xmin, _ in alone_rows.values()}) == sum(len(r) for r in ROUNDS)


async def test_a_group_keeps_each_ids_timestamps_increasing(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    # A previous row stamped ahead of the clock (another writer's clock, or a row
    # written before the server's clock stepped back): the next event is 1 µs after it.
    ahead = datetime.now(UTC) + timedelta(hours=1)
    async with (
        Journal.connect(
            pg_dsn, attrs.evolve(settings, append_statements=1, pool_max_size=1), create_schema=True
        ) as j,
        await psycopg.AsyncConnection.connect(pg_dsn) as blocker,
    ):
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
                    "writer, event_ser_id, event_ser_manifest, event_payload, deleted) "
                    "VALUES (%s, 'Acct', %s, 1, %s, 'w', 0, '', '\\x'::bytea, false)"
                ).format(table(schema)),
                (slice_for("Acct|ahead"), "Acct|ahead", ahead),
            )
        await uncommitted(blocker, schema, "Acct|held")
        held = asyncio.ensure_future(j.append("Acct|held", [{"a": 0}], expected_seq_nr=0))
        await blocked_by(pg_dsn, blocker)
        late = asyncio.ensure_future(j.append("Acct|ahead", [{"a": 2}], expected_seq_nr=1))
        now = asyncio.ensure_future(j.append("Acct|now", [{"a": 3}], expected_seq_nr=0))
        await asyncio.sleep(0.05)
        await blocker.rollback()
        await held
        (after,) = await late
        (other,) = await now
    assert after.db_timestamp == ahead + timedelta(microseconds=1)
    assert other.db_timestamp < ahead
    stamps = await transactions(pg_dsn, schema)
    assert stamps[("Acct|ahead", 2)][0] == stamps[("Acct|now", 1)][0]  # one group


async def test_an_append_does_not_wait_for_statements_its_own_transaction_blocks(
    pg_dsn: str, settings: JournalSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller appends in its own transaction (`conn=`); two appends of the same id on
    # the pool block on its uncommitted row and fill both statements; the caller then
    # appends another id on the pool before committing. Waiting for a statement to end
    # would wait for the caller itself: the append runs alone instead.
    monkeypatch.setattr(aio_writer, "ESCAPE_SECONDS", ESCAPE_SECONDS)
    async with (
        Journal.connect(
            pg_dsn, attrs.evolve(settings, append_statements=2), create_schema=True
        ) as j,
        await psycopg.AsyncConnection.connect(pg_dsn) as mine,
    ):
        await j.append("Acct|x", [{"a": 1}], expected_seq_nr=0, conn=mine)
        racers = [
            asyncio.ensure_future(j.append("Acct|x", [{"b": i}], expected_seq_nr=0))
            for i in range(2)
        ]
        await blocked_by(pg_dsn, mine, count=2)
        (other,) = await asyncio.wait_for(
            j.append("Acct|other", [{"c": 1}], expected_seq_nr=0), timeout=10
        )
        assert other.seq_nr == 1
        await mine.commit()
        for racer in racers:
            with pytest.raises(ConcurrencyError):
                await racer


async def blocked_by(pg_dsn: str, blocker: psycopg.AsyncConnection[Any], *, count: int = 1) -> None:
    """Until `count` statements wait for a lock `blocker` holds (appends blocked on a
    row that `blocker`'s open transaction is inserting)."""
    for _ in range(500):
        rows = await fetch(
            pg_dsn,
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            (blocker.info.backend_pid,),
        )
        if rows[0][0] >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no statement waited for the blocking transaction")


async def uncommitted(conn: psycopg.AsyncConnection[Any], schema: str, pid: str) -> None:
    """Insert seq_nr 1 of `pid` in `conn`'s open transaction: an append of it blocks."""
    await conn.execute(
        sql.SQL(
            "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
            "writer, event_ser_id, event_ser_manifest, event_payload, deleted) "
            "VALUES (%s, 'Acct', %s, 1, now(), 'blocker', 0, '', '\\x'::bytea, false)"
        ).format(table(schema)),
        (slice_for(pid), pid),
    )


async def test_a_race_lost_inside_a_group_fails_only_that_append(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    # One statement at a time. The first append blocks on a row another transaction is
    # inserting; two more wait and go together once it ends; that group blocks on a
    # second such row, which then commits: the group fails on the primary key and each
    # append runs alone: the one that lost the race gets ConcurrencyError, the other is stored.
    async with (
        Journal.connect(
            pg_dsn, attrs.evolve(settings, append_statements=1, pool_max_size=1), create_schema=True
        ) as j,
        await psycopg.AsyncConnection.connect(pg_dsn) as first,
        await psycopg.AsyncConnection.connect(pg_dsn) as second,
    ):
        await uncommitted(first, schema, "Acct|held")
        await uncommitted(second, schema, "Acct|x")
        held = asyncio.ensure_future(j.append("Acct|held", [{"a": 0}], expected_seq_nr=0))
        await blocked_by(pg_dsn, first)
        lost = asyncio.ensure_future(j.append("Acct|x", [{"a": 1}], expected_seq_nr=0))
        kept = asyncio.ensure_future(j.append("Acct|y", [{"a": 2}, {"a": 3}], expected_seq_nr=0))
        await asyncio.sleep(0.05)
        assert not lost.done() and not kept.done()
        await first.commit()
        with pytest.raises(ConcurrencyError) as held_error:
            await held
        assert held_error.value.actual_seq_nr == 1
        await blocked_by(pg_dsn, second)  # the group, blocked on Acct|x's row
        assert not lost.done()
        await second.commit()
        with pytest.raises(ConcurrencyError) as lost_error:
            await lost
        assert lost_error.value.actual_seq_nr == 1
        assert [e.seq_nr for e in await kept] == [1, 2]
        assert await group_statement_prepared(j)
    rows = await stored(pg_dsn, schema)
    assert [(r[2], r[3], r[4]) for r in rows] == [
        ("Acct|held", 1, "blocker"),
        ("Acct|x", 1, "blocker"),
        ("Acct|y", 1, settings.writer_id),
        ("Acct|y", 2, settings.writer_id),
    ]


async def _outcome(append: Any) -> Any:
    try:
        return await append
    except Exception as e:
        return e


async def test_a_group_of_one_meets_a_missing_table_as_an_append_alone_does(
    pg_dsn: str, settings: JournalSettings, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A group's task runs the group after it: here one append alone (Acct|c), sent after
    # the journal table was dropped. Its caller gets SchemaNotInitialized, as every
    # append alone or in a bigger group does, not the driver's "does not exist".
    mapped: list[BaseException] = []  # errors of groups the callers raised (c's)
    group_error = aio_writer.group_error

    def spy(error: BaseException, pool: Any) -> Any:
        mapped.append(error)
        return group_error(error, pool)

    monkeypatch.setattr(aio_writer, "group_error", spy)
    async with (
        Journal.connect(
            pg_dsn, attrs.evolve(settings, append_statements=1, pool_max_size=4), create_schema=True
        ) as j,
        await psycopg.AsyncConnection.connect(pg_dsn) as first,
        await psycopg.AsyncConnection.connect(pg_dsn) as second,
    ):
        await uncommitted(first, schema, "Acct|held")
        held = asyncio.ensure_future(j.append("Acct|held", [0], expected_seq_nr=0))
        await blocked_by(pg_dsn, first)
        a = asyncio.ensure_future(_outcome(j.append("Acct|a", [1], expected_seq_nr=0)))
        b = asyncio.ensure_future(_outcome(j.append("Acct|b", [1], expected_seq_nr=0)))
        await asyncio.sleep(0.05)
        await uncommitted(second, schema, "Acct|a")  # the group [a, b] waits on this row
        await first.rollback()
        await held  # the group [a, b] runs, in a task of its own
        c = asyncio.ensure_future(_outcome(j.append("Acct|c", [1], expected_seq_nr=0)))
        await asyncio.sleep(0)  # c waits: the task's next group, of one
        await second.execute(sql.SQL("DROP TABLE {}").format(table(schema)))
        await second.commit()
        outcomes = await asyncio.wait_for(asyncio.gather(a, b, c), 10)
        alone = await _outcome(j.append("Acct|d", [1], expected_seq_nr=0))
    for outcome in [*outcomes, alone]:
        assert isinstance(outcome, SchemaNotInitialized), repr(outcome)
    assert len(mapped) == 1  # c's: it went as a group (of one), not alone


async def test_a_stale_append_in_a_group_stores_nothing_and_the_others_are_stored(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    async with (
        Journal.connect(
            pg_dsn, attrs.evolve(settings, append_statements=1, pool_max_size=1), create_schema=True
        ) as j,
        await psycopg.AsyncConnection.connect(pg_dsn) as blocker,
    ):
        await j.append("Acct|s", [{"a": 1}, {"a": 2}], expected_seq_nr=0)
        await uncommitted(blocker, schema, "Acct|held")
        held = asyncio.ensure_future(j.append("Acct|held", [{"a": 0}], expected_seq_nr=0))
        await blocked_by(pg_dsn, blocker)
        stale = asyncio.ensure_future(j.append("Acct|s", [{"a": 3}], expected_seq_nr=1))
        fresh = [
            asyncio.ensure_future(j.append(f"Acct|n{i}", [{"a": i}], expected_seq_nr=0))
            for i in range(5)
        ]
        await asyncio.sleep(0.05)
        await blocker.rollback()  # the held append is stored, then the group runs
        assert [e.seq_nr for e in await held] == [1]
        with pytest.raises(ConcurrencyError) as error:
            await stale
        assert (error.value.expected_seq_nr, error.value.actual_seq_nr) == (1, 2)
        assert [[e.seq_nr for e in await f] for f in fresh] == [[1]] * 5
        assert await group_statement_prepared(j)
    rows = await stored(pg_dsn, schema)
    assert [(r[2], r[3]) for r in rows if r[2] == "Acct|s"] == [("Acct|s", 1), ("Acct|s", 2)]
    assert sum(1 for r in rows if r[2].startswith("Acct|n")) == 5


async def test_a_waiting_append_cancelled_before_its_group_is_never_stored(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    async with (
        Journal.connect(
            pg_dsn, attrs.evolve(settings, append_statements=1, pool_max_size=1), create_schema=True
        ) as j,
        await psycopg.AsyncConnection.connect(pg_dsn) as blocker,
    ):
        await uncommitted(blocker, schema, "Acct|held")
        held = asyncio.ensure_future(j.append("Acct|held", [{"a": 0}], expected_seq_nr=0))
        await blocked_by(pg_dsn, blocker)
        gone = asyncio.ensure_future(j.append("Acct|gone", [{"a": 1}], expected_seq_nr=0))
        kept = asyncio.ensure_future(j.append("Acct|kept", [{"a": 2}], expected_seq_nr=0))
        await asyncio.sleep(0.05)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        await blocker.rollback()
        await held
        await kept
    rows = await stored(pg_dsn, schema)
    assert sorted(r[2] for r in rows) == ["Acct|held", "Acct|kept"]


async def test_racing_writers_in_two_processes_each_seq_nr_stored_once(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    # Two journals (as two processes would) race for the same ids with many concurrent
    # appends each, so groups collide on the primary key. Every append either stored
    # all its events at the seq_nrs it asked for or raised ConcurrencyError; what is
    # stored is exactly the union of what succeeded, each seq_nr once.
    ids = [f"Acct|r{i}" for i in range(6)]
    grouped = attrs.evolve(settings, append_statements=1, pool_max_size=1)
    async with (
        Journal.connect(pg_dsn, grouped, create_schema=True) as one,
        Journal.connect(pg_dsn, attrs.evolve(grouped, writer_id="other")) as two,
    ):
        succeeded: list[tuple[str, int, str]] = []
        conflicts = 0

        async def writer(journal: Journal, name: str, pid: str) -> None:
            nonlocal conflicts
            for _ in range(15):
                expected = await journal.highest_seq_nr(pid)
                events = [{"by": name, "n": k} for k in range(1 + expected % 3)]
                try:
                    appended = await journal.append(pid, events, expected_seq_nr=expected)
                except ConcurrencyError:
                    conflicts += 1
                    continue
                assert [e.seq_nr for e in appended] == list(
                    range(expected + 1, expected + 1 + len(events))
                )
                succeeded.extend((pid, e.seq_nr, f"{name}:{e.event['n']}") for e in appended)

        await asyncio.gather(
            *(
                writer(j, f"{n}{k}", pid)
                for j, n in ((one, "a"), (two, "b"))
                for pid in ids
                for k in range(2)
            )
        )
        assert await group_statement_prepared(one)
    rows = await fetch(
        pg_dsn,
        sql.SQL("SELECT persistence_id, seq_nr, event_payload FROM {} ORDER BY 1, 2").format(
            table(schema)
        ),
    )
    assert conflicts > 0
    stored_keys = [(r[0], r[1]) for r in rows]
    assert stored_keys == sorted((pid, seq) for pid, seq, _ in succeeded)
    for pid in ids:
        seqs = [seq for p, seq in stored_keys if p == pid]
        assert seqs == list(range(1, len(seqs) + 1))


def test_sync_journal_groups_appends_of_threads(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    errors: list[BaseException] = []
    with SyncJournal.connect(
        pg_dsn, attrs.evolve(settings, append_statements=1, pool_max_size=1), create_schema=True
    ) as j:

        def writer(i: int) -> None:
            try:
                for n in range(20):
                    (e,) = j.append(f"Acct|t{i}", [{"n": n}], expected_seq_nr=n)
                    assert e.seq_nr == n + 1
            except BaseException as e:  # reported below, in the test's thread
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        wire = j._writer._sql.append_group.wire
        assert wire is not None
        with j.pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE name = %s",
                (wire.name.decode(),),
            ).fetchone()
    assert errors == []
    rows = asyncio.run(
        fetch(
            pg_dsn,
            sql.SQL("SELECT persistence_id, seq_nr FROM {} ORDER BY 1, 2").format(table(schema)),
        )
    )
    assert rows == [(f"Acct|t{i}", n) for i in range(8) for n in range(1, 21)]
    assert row == (1,)  # the one write connection ran a group statement


async def test_a_group_blocked_by_a_callers_own_row_gives_its_appends_back(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    # The group is already sent when it meets the row a caller's open transaction
    # inserted, and that caller waits for another append of the same group. The
    # group's lock wait ends after its lock_timeout; each append then runs alone:
    # the other one at once, the blocked one once the caller commits.
    async with (
        Journal.connect(
            pg_dsn, attrs.evolve(settings, append_statements=1, pool_max_size=2), create_schema=True
        ) as j,
        await psycopg.AsyncConnection.connect(pg_dsn) as blocker,
        await psycopg.AsyncConnection.connect(pg_dsn) as mine,
    ):
        await uncommitted(blocker, schema, "Acct|held")
        held = asyncio.ensure_future(j.append("Acct|held", [{"a": 0}], expected_seq_nr=0))
        await blocked_by(pg_dsn, blocker)
        await j.append("Acct|x", [{"a": 1}], expected_seq_nr=0, conn=mine)
        racer = asyncio.ensure_future(j.append("Acct|x", [{"b": 1}], expected_seq_nr=0))
        other = asyncio.ensure_future(j.append("Acct|y", [{"c": 1}], expected_seq_nr=0))
        await asyncio.sleep(0.05)
        await blocker.rollback()
        await held
        # `mine` is still open: the append of Acct|y must not wait for it
        (y,) = await asyncio.wait_for(other, timeout=10)
        assert y.seq_nr == 1
        assert not racer.done()
        await mine.commit()
        with pytest.raises(ConcurrencyError):
            await racer
        async with j.pool.connection() as conn:
            cur = await conn.execute("SHOW lock_timeout")
            assert await cur.fetchone() == ("0",)  # the group's own transaction's only
    rows = await stored(pg_dsn, schema)
    assert sorted((r[2], r[3], r[4]) for r in rows) == [
        ("Acct|held", 1, settings.writer_id),
        ("Acct|x", 1, settings.writer_id),
        ("Acct|y", 1, settings.writer_id),
    ]


def test_a_sync_append_does_not_wait_for_statements_its_own_transaction_blocks(
    pg_dsn: str, settings: JournalSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The blocking flavour's twin of the test above: threads, and the timer a thread.
    monkeypatch.setattr(sync_writer, "ESCAPE_SECONDS", ESCAPE_SECONDS)
    outcomes: list[BaseException | None] = []
    with (
        SyncJournal.connect(
            pg_dsn, attrs.evolve(settings, append_statements=2), create_schema=True
        ) as j,
        psycopg.Connection.connect(pg_dsn) as mine,
    ):
        j.append("Acct|x", [{"a": 1}], expected_seq_nr=0, conn=mine)

        def racer(i: int) -> None:
            try:
                j.append("Acct|x", [{"b": i}], expected_seq_nr=0)
                outcomes.append(None)
            except BaseException as e:  # checked below, in the test's thread
                outcomes.append(e)

        racers = [threading.Thread(target=racer, args=(i,)) for i in range(2)]
        for t in racers:
            t.start()
        asyncio.run(blocked_by(pg_dsn, mine, count=2))
        started = time.monotonic()
        (other,) = j.append("Acct|other", [{"c": 1}], expected_seq_nr=0)
        assert other.seq_nr == 1
        assert time.monotonic() - started < 10
        mine.commit()
        for t in racers:
            t.join(10)
    assert [type(e) for e in outcomes] == [ConcurrencyError, ConcurrencyError]

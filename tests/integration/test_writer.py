"""The write side against a real PostgreSQL: append, concurrency, deletes, snapshots, reads.

Every check reads back from the database, either through a separate psycopg
connection or through the journal's own read API.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from journal import (
    UNDECODABLE,
    ConcurrencyError,
    DeserializationError,
    EventEnvelope,
    InvalidArgument,
    InvalidPersistenceId,
    Journal,
    JournalSettings,
    QuerySettings,
    SerializationError,
    SerializerRegistry,
    entity_type_of,
    slice_for,
)
from tests.support.pg import Row, fetch

# -- helpers ------------------------------------------------------------------


def table(schema: str, name: str = "event_journal") -> sql.Identifier:
    return sql.Identifier(schema, name)


async def count_rows(pg_dsn: str, schema: str, pid: str | None = None) -> int:
    if pid is None:
        rows = await fetch(pg_dsn, sql.SQL("SELECT count(*) FROM {}").format(table(schema)))
    else:
        rows = await fetch(
            pg_dsn,
            sql.SQL("SELECT count(*) FROM {} WHERE persistence_id = %s").format(table(schema)),
            (pid,),
        )
    return int(rows[0][0])


async def read_all(
    journal: Journal, pid: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
) -> list[EventEnvelope]:
    return [
        env async for env in journal.current_events_by_persistence_id(pid, from_seq_nr, to_seq_nr)
    ]


async def stored_rows(pg_dsn: str, schema: str, pid: str) -> list[Row]:
    """(seq_nr, db_timestamp, payload-as-json, deleted) of every row of a pid, in seq_nr order."""
    return await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT seq_nr, db_timestamp, convert_from(event_payload, 'UTF8'), deleted "
            "FROM {} WHERE persistence_id = %s ORDER BY seq_nr"
        ).format(table(schema)),
        (pid,),
    )


# -- append basics --------------------------------------------------------------


async def test_append_assigns_seq_nrs_and_stores_columns(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    pid = "Account|alice"
    first = await journal.append(pid, [{"n": 1}, {"n": 2}], expected_seq_nr=0)
    second = await journal.append(
        pid, [{"n": 3}], expected_seq_nr=2, tags=["blue", "vip"], metadata={"trace": "t-1"}
    )
    assert [e.seq_nr for e in first] == [1, 2]
    assert [e.seq_nr for e in second] == [3]
    assert first[0].db_timestamp == first[1].db_timestamp  # one atomic write, one timestamp
    assert second[0].db_timestamp > first[1].db_timestamp

    rows = await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT seq_nr, slice, entity_type, writer, tags, deleted, event_ser_id, "
            "event_ser_manifest, meta_ser_id, convert_from(meta_payload, 'UTF8'), db_timestamp "
            "FROM {} WHERE persistence_id = %s ORDER BY seq_nr"
        ).format(table(schema)),
        (pid,),
    )
    assert [r[0] for r in rows] == [1, 2, 3]
    writer = journal.settings.writer_id
    for seq_nr, slice_, entity_type, w, _, deleted, ser_id, manifest, *_ in rows:
        assert slice_ == slice_for(pid), seq_nr
        assert entity_type == "Account"
        assert w == writer
        assert deleted is False
        assert ser_id == 31
        assert manifest == ""
    assert rows[0][4] is None and rows[0][8] is None and rows[0][9] is None
    assert rows[2][4] == ["blue", "vip"]
    assert rows[2][8] == 31 and rows[2][9] == '{"trace":"t-1"}'
    assert [r[10] for r in rows] == [e.db_timestamp for e in (*first, *second)]

    read = await read_all(journal, pid)
    assert [(e.seq_nr, e.event) for e in read] == [(1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3})]
    assert read[2].tags == ("blue", "vip")
    assert read[2].metadata == {"trace": "t-1"}
    assert read[0].metadata is None and read[0].tags == ()
    assert {(e.entity_type, e.slice, e.writer) for e in read} == {
        ("Account", slice_for(pid), writer)
    }


async def test_metadata_round_trip_with_registered_class(pg_dsn: str, schema: str) -> None:
    @attrs.frozen
    class Trace:
        trace_id: str
        hops: int

    registry = SerializerRegistry()
    registry.register(Trace, "test.Trace")
    settings = JournalSettings(schema=schema)
    async with Journal.connect(pg_dsn, settings, serializers=registry, create_schema=True) as j:
        await j.append(
            "Doc|1", [b"\x00\x01raw", {"x": 1}], expected_seq_nr=0, metadata=Trace("a", 2)
        )
        read = await read_all(j, "Doc|1")
    assert [e.event for e in read] == [b"\x00\x01raw", {"x": 1}]
    assert [e.serializer_id for e in read] == [4, 31]
    assert [e.metadata for e in read] == [Trace("a", 2), Trace("a", 2)]
    rows = await fetch(
        pg_dsn,
        sql.SQL("SELECT meta_ser_manifest FROM {} ORDER BY seq_nr").format(table(schema)),
    )
    assert rows == [("test.Trace",), ("test.Trace",)]


async def test_read_bounds(journal: Journal) -> None:
    pid = "Bounds|1"
    await journal.append(pid, [{"i": i} for i in range(1, 8)], expected_seq_nr=0)
    assert [e.seq_nr for e in await read_all(journal, pid, 3)] == [3, 4, 5, 6, 7]
    assert [e.seq_nr for e in await read_all(journal, pid, 2, 4)] == [2, 3, 4]
    assert [e.seq_nr for e in await read_all(journal, pid, 5, 5)] == [5]
    assert [e.seq_nr for e in await read_all(journal, pid, 6, 3)] == []
    assert [e.seq_nr for e in await read_all(journal, pid, 8)] == []
    assert [e.event for e in await read_all(journal, pid, 0, 2)] == [{"i": 1}, {"i": 2}]
    with pytest.raises(InvalidArgument):
        await read_all(journal, pid, -1)
    with pytest.raises(InvalidArgument):
        await read_all(journal, pid, 1, -2)


async def test_reads_page_through_many_events(pg_dsn: str, schema: str) -> None:
    settings = JournalSettings(schema=schema, page_size=3)
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        await j.append("Paged|1", [{"i": i} for i in range(10)], expected_seq_nr=0)
        events = await read_all(j, "Paged|1")
        bounded = await read_all(j, "Paged|1", 2, 7)
    assert [e.event for e in events] == [{"i": i} for i in range(10)]
    assert [e.seq_nr for e in bounded] == [2, 3, 4, 5, 6, 7]


async def test_highest_seq_nr(journal: Journal) -> None:
    assert await journal.highest_seq_nr("Nobody|here") == 0
    await journal.append("High|1", [1, 2, 3], expected_seq_nr=0)
    await journal.append("High|2", [1], expected_seq_nr=0)
    assert await journal.highest_seq_nr("High|1") == 3
    assert await journal.highest_seq_nr("High|2") == 1
    await journal.append("High|1", [4], expected_seq_nr=3)
    assert await journal.highest_seq_nr("High|1") == 4


# -- optimistic concurrency -------------------------------------------------------


@pytest.mark.parametrize("expected", [0, 2, 4, 100], ids=["behind0", "behind", "ahead", "far"])
async def test_concurrency_error_when_expected_is_wrong(
    journal: Journal, pg_dsn: str, schema: str, expected: int
) -> None:
    pid = f"Conc|{expected}"
    await journal.append(pid, [{"a": 1}, {"a": 2}, {"a": 3}], expected_seq_nr=0)
    with pytest.raises(ConcurrencyError) as info:
        await journal.append(pid, [{"late": True}, {"late": 2}], expected_seq_nr=expected)
    err = info.value
    assert (err.persistence_id, err.expected_seq_nr, err.actual_seq_nr) == (pid, expected, 3)
    assert repr(pid) in str(err)
    assert f"expected highest seq_nr {expected}" in str(err)
    assert "the journal has 3" in str(err)
    assert await count_rows(pg_dsn, schema, pid) == 3
    assert [e.event for e in await read_all(journal, pid)] == [{"a": 1}, {"a": 2}, {"a": 3}]


async def test_concurrency_error_on_empty_pid_with_nonzero_expected(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    with pytest.raises(ConcurrencyError) as info:
        await journal.append("Fresh|1", [{"a": 1}], expected_seq_nr=4)
    assert (info.value.expected_seq_nr, info.value.actual_seq_nr) == (4, 0)
    assert await count_rows(pg_dsn, schema) == 0
    # expecting 0 after a failure works, so the failure left no trace
    assert [e.seq_nr for e in await journal.append("Fresh|1", [1], expected_seq_nr=0)] == [1]


BAD_APPENDS: list[tuple[str, Any, Any, type[Exception]]] = [
    ("no events", "Ok|1", {"events": [], "expected_seq_nr": 0}, InvalidArgument),
    ("no events tuple", "Ok|1", {"events": (), "expected_seq_nr": 0}, InvalidArgument),
    ("events is a str", "Ok|1", {"events": "abc", "expected_seq_nr": 0}, InvalidArgument),
    ("negative expected", "Ok|1", {"events": [1], "expected_seq_nr": -1}, InvalidArgument),
    ("str expected", "Ok|1", {"events": [1], "expected_seq_nr": "0"}, InvalidArgument),
    ("float expected", "Ok|1", {"events": [1], "expected_seq_nr": 0.0}, InvalidArgument),
    ("bool expected", "Ok|1", {"events": [1], "expected_seq_nr": False}, InvalidArgument),
    ("None expected", "Ok|1", {"events": [1], "expected_seq_nr": None}, InvalidArgument),
    ("int pid", 42, {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("bytes pid", b"Ok|1", {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("None pid", None, {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("empty pid", "", {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("long pid", "A|" + "x" * 254, {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("newline pid", "A|x\ny", {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("NUL pid", "A|x\x00", {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("DEL pid", "A|\x7f", {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("tab pid", "A\t|1", {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("surrogate pid", "A|\ud800", {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("no entity type", "|1", {"events": [1], "expected_seq_nr": 0}, InvalidPersistenceId),
    ("str tags", "Ok|1", {"events": [1], "expected_seq_nr": 0, "tags": "t"}, InvalidArgument),
    ("empty tag", "Ok|1", {"events": [1], "expected_seq_nr": 0, "tags": [""]}, InvalidArgument),
    ("int tag", "Ok|1", {"events": [1], "expected_seq_nr": 0, "tags": [1]}, InvalidArgument),
    ("bad event", "Ok|1", {"events": [1, object()], "expected_seq_nr": 0}, SerializationError),
    (
        "bad metadata",
        "Ok|1",
        {"events": [1], "expected_seq_nr": 0, "metadata": object()},
        SerializationError,
    ),
]


async def test_bad_input_fails_before_touching_the_database(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    await journal.append("Ok|1", [{"seed": True}], expected_seq_nr=0)
    # A journal whose pools were never opened: any I/O would fail differently.
    unopened = Journal(pg_dsn, JournalSettings(schema=schema), SerializerRegistry())
    for case, pid, kwargs, error in BAD_APPENDS:
        for j in (journal, unopened):
            with pytest.raises(error):
                await j.append(pid, **kwargs)
                pytest.fail(f"{case}: no error")
    assert await count_rows(pg_dsn, schema) == 1
    assert await journal.highest_seq_nr("Ok|1") == 1


# -- delete_events_to ---------------------------------------------------------------


async def test_delete_events_to(journal: Journal, pg_dsn: str, schema: str) -> None:
    pid = "Del|1"
    await journal.append(pid, [{"i": i} for i in range(1, 6)], expected_seq_nr=0)
    other = "Del|2"
    await journal.append(other, [{"o": 1}, {"o": 2}], expected_seq_nr=0)

    assert await journal.delete_events_to(pid, 3) == 3
    assert [e.seq_nr for e in await read_all(journal, pid)] == [4, 5]
    assert [e.seq_nr for e in await read_all(journal, pid, 1, 3)] == []
    assert await journal.highest_seq_nr(pid) == 5
    assert [e.seq_nr for e in await read_all(journal, other)] == [1, 2]  # untouched

    # the next append continues after the highest; an old expected seq_nr fails
    with pytest.raises(ConcurrencyError):
        await journal.append(pid, [{"i": "stale"}], expected_seq_nr=3)
    with pytest.raises(ConcurrencyError):
        await journal.append(pid, [{"i": "reset"}], expected_seq_nr=0)
    assert [e.seq_nr for e in await journal.append(pid, [{"i": 6}], expected_seq_nr=5)] == [6]
    assert [e.event for e in await read_all(journal, pid)] == [{"i": 4}, {"i": 5}, {"i": 6}]

    # deleting beyond the highest clips to it and keeps the sequence
    assert await journal.delete_events_to(pid, 1000) == 6
    assert await read_all(journal, pid) == []
    assert await journal.highest_seq_nr(pid) == 6
    with pytest.raises(ConcurrencyError):
        await journal.append(pid, [{"i": "reuse"}], expected_seq_nr=0)
    assert [e.seq_nr for e in await journal.append(pid, [{"i": 7}], expected_seq_nr=6)] == [7]

    rows = await stored_rows(pg_dsn, schema, pid)
    assert [(r[0], r[3]) for r in rows] == [(6, True), (7, False)]
    assert [e.event for e in await read_all(journal, pid)] == [{"i": 7}]

    # nothing to delete / deleting an unknown id
    assert await journal.delete_events_to("Del|none", 10) == 0
    assert await journal.delete_events_to(other, 0) == 0
    assert [e.seq_nr for e in await read_all(journal, other)] == [1, 2]
    with pytest.raises(InvalidArgument):
        await journal.delete_events_to(other, -1)
    with pytest.raises(InvalidPersistenceId):
        await journal.delete_events_to("", 1)


async def test_deleted_events_are_not_in_slice_queries(journal: Journal) -> None:
    pid = "SliceDel|1"
    await journal.append(pid, [{"i": 1}, {"i": 2}, {"i": 3}], expected_seq_nr=0)
    await journal.delete_events_to(pid, 2)
    s = slice_for(pid)
    seen = [e.seq_nr async for e in journal.current_events_by_slices("SliceDel", s, s)]
    assert seen == [3]


# -- current_persistence_ids -----------------------------------------------------------


async def test_current_persistence_ids_pages_and_filters(pg_dsn: str, schema: str) -> None:
    settings = JournalSettings(schema=schema, page_size=3)
    carts = [f"Cart|{i:02d}" for i in range(7)]
    users = [f"User|{i:02d}" for i in range(4)]
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        for pid in [*users, *carts]:
            await j.append(pid, [{"e": 1}, {"e": 2}], expected_seq_nr=0)
        await j.append("Cartography|1", [1], expected_seq_nr=0)  # shares a prefix only
        await j.append("Bare", [1], expected_seq_nr=0)  # no '|': entity type is the whole id
        all_ids = [pid async for pid in j.current_persistence_ids()]
        cart_ids = [pid async for pid in j.current_persistence_ids("Cart")]
        user_ids = [pid async for pid in j.current_persistence_ids("User")]
        bare_ids = [pid async for pid in j.current_persistence_ids("Bare")]
        none_ids = [pid async for pid in j.current_persistence_ids("Nothing")]
        with pytest.raises(InvalidPersistenceId):
            [pid async for pid in j.current_persistence_ids("Cart|01")]
    assert all_ids == sorted([*carts, *users, "Cartography|1", "Bare"])
    assert len(set(all_ids)) == len(all_ids)
    assert cart_ids == carts
    assert user_ids == users
    assert bare_ids == ["Bare"]
    assert none_ids == []


async def test_current_persistence_ids_exact_page_multiple(pg_dsn: str, schema: str) -> None:
    settings = JournalSettings(schema=schema, page_size=3)
    pids = [f"Six|{i}" for i in range(6)]
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        for pid in pids:
            await j.append(pid, [1], expected_seq_nr=0)
        assert [pid async for pid in j.current_persistence_ids()] == pids


# -- events_by_persistence_id (live) ----------------------------------------------------


async def test_events_by_persistence_id_live_receives_later_appends(journal: Journal) -> None:
    pid = "Live|1"
    await journal.append(pid, [{"i": 1}, {"i": 2}], expected_seq_nr=0)
    received: asyncio.Queue[EventEnvelope] = asyncio.Queue()

    async def reader() -> list[int]:
        seqs = []
        async for env in journal.events_by_persistence_id(pid, 1, to_seq_nr=4):
            seqs.append(env.seq_nr)
            await received.put(env)
        return seqs

    task = asyncio.create_task(reader())
    try:
        # the reader has caught up with everything stored so far
        first = [await asyncio.wait_for(received.get(), 20) for _ in range(2)]
        assert [e.event for e in first] == [{"i": 1}, {"i": 2}]
        await asyncio.sleep(0.05)
        assert received.empty() and not task.done()
        await journal.append(pid, [{"i": 3}], expected_seq_nr=2)
        third = await asyncio.wait_for(received.get(), 20)
        assert (third.seq_nr, third.event) == (3, {"i": 3})
        assert not task.done()  # still waiting for seq_nr 4
        await journal.append(pid, [{"i": 4}, {"i": 5}], expected_seq_nr=3)
        seqs = await asyncio.wait_for(task, 20)  # ends at to_seq_nr
    finally:
        task.cancel()
    assert seqs == [1, 2, 3, 4]


async def test_events_by_persistence_id_live_without_notifications(
    pg_dsn: str, schema: str
) -> None:
    query = QuerySettings(
        refresh_interval=timedelta(seconds=0.2),
        behind_current_time=timedelta(milliseconds=50),
        notifications=False,
    )
    settings = JournalSettings(schema=schema, notify=False, query=query)
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        task = asyncio.create_task(_collect(j.events_by_persistence_id("Poll|1", to_seq_nr=2)))
        await asyncio.sleep(0.1)
        await j.append("Poll|1", [{"a": 1}], expected_seq_nr=0)
        await j.append("Poll|1", [{"a": 2}], expected_seq_nr=1)
        envs = await asyncio.wait_for(task, 20)
    assert [(e.seq_nr, e.event) for e in envs] == [(1, {"a": 1}), (2, {"a": 2})]


async def _collect(it: Any) -> list[EventEnvelope]:
    return [env async for env in it]


# -- snapshots ---------------------------------------------------------------------------


async def test_snapshots_save_load_delete(journal: Journal, pg_dsn: str, schema: str) -> None:
    pid = "Snap|1"
    assert await journal.load_snapshot(pid) is None
    await journal.save_snapshot(pid, 5, {"balance": 50}, tags=["t"], metadata={"m": 1})
    snap = await journal.load_snapshot(pid)
    assert snap is not None
    assert (snap.persistence_id, snap.seq_nr, snap.state) == (pid, 5, {"balance": 50})
    assert snap.tags == ("t",) and snap.metadata == {"m": 1}

    # an older snapshot never overwrites a newer one
    await journal.save_snapshot(pid, 3, {"balance": 30})
    snap = await journal.load_snapshot(pid)
    assert snap is not None and (snap.seq_nr, snap.state) == (5, {"balance": 50})

    await journal.save_snapshot(pid, 8, {"balance": 80})
    snap = await journal.load_snapshot(pid)
    assert snap is not None and (snap.seq_nr, snap.state) == (8, {"balance": 80})
    assert snap.metadata is None and snap.tags == ()

    rows = await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT slice, entity_type, seq_nr, db_timestamp, write_timestamp, ser_id, "
            "convert_from(snapshot, 'UTF8') FROM {} WHERE persistence_id = %s"
        ).format(table(schema, "snapshot")),
        (pid,),
    )
    assert len(rows) == 1
    slice_, entity_type, seq_nr, db_ts, write_ts, ser_id, payload = rows[0]
    assert (slice_, entity_type, seq_nr, ser_id) == (slice_for(pid), "Snap", 8, 31)
    assert isinstance(db_ts, datetime) and db_ts.tzinfo is not None
    assert isinstance(write_ts, int) and write_ts > 0
    assert payload == '{"balance":80}'

    await journal.save_snapshot("Snap|2", 1, {"other": True})
    await journal.delete_snapshot(pid)
    assert await journal.load_snapshot(pid) is None
    assert await journal.load_snapshot("Snap|2") is not None
    await journal.delete_snapshot(pid)  # deleting twice is harmless

    with pytest.raises(InvalidArgument):
        await journal.save_snapshot(pid, 0, {"x": 1})
    with pytest.raises(SerializationError):
        await journal.save_snapshot(pid, 1, object())
    with pytest.raises(InvalidPersistenceId):
        await journal.save_snapshot("", 1, {"x": 1})
    assert await journal.load_snapshot(pid) is None


# -- append(conn=...) in the caller's transaction ---------------------------------------


async def _caller_table(pg_dsn: str, schema: str) -> sql.Identifier:
    name = table(schema, "caller_rows")
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE TABLE {} (note text)").format(name))
    return name


async def test_append_in_rolled_back_caller_transaction_leaves_nothing(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    own = await _caller_table(pg_dsn, schema)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await conn.execute(sql.SQL("INSERT INTO {} VALUES ('mine')").format(own))
        envs = await journal.append("Tx|1", [{"a": 1}, {"a": 2}], expected_seq_nr=0, conn=conn)
        assert [e.seq_nr for e in envs] == [1, 2]
        assert await count_rows(pg_dsn, schema) == 0  # not visible before commit
        await conn.rollback()
    assert await count_rows(pg_dsn, schema) == 0
    assert await fetch(pg_dsn, sql.SQL("SELECT * FROM {}").format(own)) == []
    assert await journal.highest_seq_nr("Tx|1") == 0


async def test_append_as_first_statement_of_caller_transaction_is_rolled_back(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    """On a non-autocommit connection the transaction starts with the first statement."""
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await journal.append("Tx|first", [{"a": 1}], expected_seq_nr=0, conn=conn)
        await conn.rollback()
    assert await count_rows(pg_dsn, schema) == 0


async def test_append_in_committed_caller_transaction(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    own = await _caller_table(pg_dsn, schema)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await conn.execute(sql.SQL("INSERT INTO {} VALUES ('mine')").format(own))
        await journal.append("Tx|2", [{"a": 1}, {"a": 2}], expected_seq_nr=0, conn=conn)
        await conn.commit()
    assert await fetch(pg_dsn, sql.SQL("SELECT note FROM {}").format(own)) == [("mine",)]
    assert [e.event for e in await read_all(journal, "Tx|2")] == [{"a": 1}, {"a": 2}]


async def test_concurrency_error_in_caller_transaction_keeps_its_other_work(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    own = await _caller_table(pg_dsn, schema)
    await journal.append("Tx|3", [{"a": 1}], expected_seq_nr=0)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await conn.execute(sql.SQL("INSERT INTO {} VALUES ('before')").format(own))
        # a conflict on the primary key (another writer's committed seq_nr 1) ...
        with pytest.raises(ConcurrencyError) as info:
            await journal.append("Tx|3", [{"a": "x"}], expected_seq_nr=0, conn=conn)
        assert info.value.actual_seq_nr == 1
        # ... and a plain mismatch both leave the transaction usable
        with pytest.raises(ConcurrencyError):
            await journal.append("Tx|3", [{"a": "y"}], expected_seq_nr=7, conn=conn)
        await conn.execute(sql.SQL("INSERT INTO {} VALUES ('after')").format(own))
        await journal.append("Tx|3", [{"a": 2}], expected_seq_nr=1, conn=conn)
        await journal.append("Tx|other", [{"b": 1}], expected_seq_nr=0, conn=conn)
        await conn.commit()
    notes = await fetch(pg_dsn, sql.SQL("SELECT note FROM {} ORDER BY note").format(own))
    assert notes == [("after",), ("before",)]
    assert [e.event for e in await read_all(journal, "Tx|3")] == [{"a": 1}, {"a": 2}]
    assert [e.event for e in await read_all(journal, "Tx|other")] == [{"b": 1}]


async def test_caller_transaction_sees_its_own_uncommitted_events(journal: Journal) -> None:
    async with await psycopg.AsyncConnection.connect(journal.dsn) as conn:
        await journal.append("Tx|4", [{"a": 1}], expected_seq_nr=0, conn=conn)
        await journal.append("Tx|4", [{"a": 2}], expected_seq_nr=1, conn=conn)
        with pytest.raises(ConcurrencyError) as info:
            await journal.append("Tx|4", [{"a": 3}], expected_seq_nr=1, conn=conn)
        # the caller's own (uncommitted) events count for the reported actual seq_nr
        assert info.value.actual_seq_nr == 2
        await conn.commit()
    assert [e.seq_nr for e in await read_all(journal, "Tx|4")] == [1, 2]


# -- correctness scenarios --------------------------------------------------------------


@attrs.frozen
class Outcome:
    writer: int
    round: int
    seq_nrs: tuple[int, ...]


async def test_twenty_concurrent_writers_on_one_pid(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    pid = "Race|1"
    rounds = 25
    wins: list[Outcome] = []
    losses: list[tuple[int, int]] = []

    async def writer(w: int) -> None:
        rng = random.Random(w)
        for r in range(rounds):
            expected = await journal.highest_seq_nr(pid)
            n = rng.randint(1, 3)
            batch = [{"w": w, "r": r, "i": i, "n": n} for i in range(n)]
            try:
                envs = await journal.append(pid, batch, expected_seq_nr=expected)
            except ConcurrencyError as e:
                assert e.expected_seq_nr == expected
                assert e.actual_seq_nr != expected
                losses.append((w, r))
            else:
                assert [e.seq_nr for e in envs] == list(range(expected + 1, expected + n + 1))
                wins.append(Outcome(w, r, tuple(e.seq_nr for e in envs)))

    await asyncio.gather(*(writer(w) for w in range(20)))

    assert losses, "the writers never collided; the race was not exercised"
    assert wins
    highest = await journal.highest_seq_nr(pid)
    rows = await stored_rows(pg_dsn, schema, pid)
    assert [r[0] for r in rows] == list(range(1, highest + 1))  # no gaps, no duplicates
    assert sum(len(o.seq_nrs) for o in wins) == highest

    by_batch: dict[tuple[int, int], list[tuple[int, datetime, dict[str, int]]]] = defaultdict(list)
    for seq_nr, db_ts, payload, deleted in rows:
        assert not deleted
        event = json.loads(payload)
        by_batch[(event["w"], event["r"])].append((seq_nr, db_ts, event))
    won = {(o.writer, o.round): o for o in wins}
    assert set(by_batch) == set(won)  # no event of a losing batch was stored
    assert not set(losses) & set(by_batch)
    for key, stored in by_batch.items():
        outcome = won[key]
        assert tuple(s for s, _, _ in stored) == outcome.seq_nrs
        assert [e["i"] for _, _, e in stored] == list(range(stored[0][2]["n"]))
        assert len({ts for _, ts, _ in stored}) == 1  # one write, one timestamp
    timestamps = [r[1] for r in rows]
    assert all(a <= b for a, b in itertools.pairwise(timestamps))
    starts = sorted(by_batch.values(), key=lambda b: b[0][0])
    assert all(a[0][1] < b[0][1] for a, b in itertools.pairwise(starts))

    # the read API agrees with the table
    read = await read_all(journal, pid)
    assert [e.seq_nr for e in read] == list(range(1, highest + 1))


async def test_conflicting_writers_do_not_exhaust_a_small_pool(pg_dsn: str, schema: str) -> None:
    """A losing append must not need a second pool connection while holding the first."""
    settings = JournalSettings(schema=schema, pool_min_size=1, pool_max_size=2)
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        await j.append("Small|1", [{"seed": 0}], expected_seq_nr=0)

        async def stale_append(i: int) -> str:
            try:
                await j.append("Small|1", [{"i": i}], expected_seq_nr=0)
            except ConcurrencyError:
                return "conflict"
            return "ok"

        results = await asyncio.gather(*(stale_append(i) for i in range(8)))
        assert results == ["conflict"] * 8
        assert await j.highest_seq_nr("Small|1") == 1


async def test_db_timestamp_increases_even_when_transaction_started_earlier(
    journal: Journal, pg_dsn: str
) -> None:
    pid = "Mono|1"
    async with await psycopg.AsyncConnection.connect(pg_dsn) as a:
        cur = await a.execute("SELECT transaction_timestamp()")  # starts A's transaction
        row = await cur.fetchone()
        assert row is not None
        a_started: datetime = row[0]
        await asyncio.sleep(0.05)
        (b_env,) = await journal.append(pid, [{"by": "B"}], expected_seq_nr=0)
        (a_env,) = await journal.append(pid, [{"by": "A"}], expected_seq_nr=1, conn=a)
        cur = await a.execute("SELECT transaction_timestamp()")
        row = await cur.fetchone()
        assert row is not None and row[0] == a_started  # still the same transaction
        await a.commit()

    rows = await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT seq_nr, db_timestamp FROM {} WHERE persistence_id = %s ORDER BY seq_nr"
        ).format(table(journal.settings.schema)),
        (pid,),
    )
    (s1, t1), (s2, t2) = rows
    assert (s1, s2) == (1, 2)
    assert a_started < t1  # A's own clock is earlier than B's event ...
    assert t2 > t1  # ... yet A's event is stamped after it
    assert (b_env.db_timestamp, a_env.db_timestamp) == (t1, t2)
    assert [e.db_timestamp for e in await read_all(journal, pid)] == [t1, t2]


async def test_unserializable_event_in_batch_writes_nothing(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    pid = "Atomic|1"
    batch: list[Any] = [{"i": i} for i in range(10)]
    batch[4] = object()
    with pytest.raises(SerializationError) as info:
        await journal.append(pid, batch, expected_seq_nr=0)
    message = str(info.value)
    assert "event 5 of 10" in message
    assert repr(pid) in message
    assert "seq_nr 5" in message
    assert "object" in message

    batch[4] = {"nested": {1, 2}}  # a set inside a JSON value
    with pytest.raises(SerializationError) as info:
        await journal.append(pid, batch, expected_seq_nr=0)
    assert "event 5 of 10" in str(info.value)

    batch[4] = {"nan": float("nan")}
    with pytest.raises(SerializationError):
        await journal.append(pid, batch, expected_seq_nr=0)

    assert await count_rows(pg_dsn, schema) == 0
    batch[4] = {"i": 4}
    envs = await journal.append(pid, batch, expected_seq_nr=0)
    assert [e.seq_nr for e in envs] == list(range(1, 11))


async def test_killed_connection_mid_transaction_leaves_nothing(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    pid = "Killed|1"
    raw = await psycopg.AsyncConnection.connect(pg_dsn)
    try:
        await raw.execute("SELECT 1")  # BEGIN
        backend = raw.info.backend_pid
        await journal.append(pid, [{"i": 1}, {"i": 2}], expected_seq_nr=0, conn=raw)
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
            cur = await admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
            assert await cur.fetchone() == (True,)
            for _ in range(500):  # until the backend is really gone
                cur = await admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)
                )
                if await cur.fetchone() == (0,):
                    break
                await asyncio.sleep(0.01)
        with pytest.raises(psycopg.OperationalError):
            await raw.commit()
        assert raw.broken or raw.closed
    finally:
        await raw.close()

    assert await count_rows(pg_dsn, schema) == 0
    assert await journal.highest_seq_nr(pid) == 0
    envs = await journal.append(pid, [{"i": "again"}], expected_seq_nr=0)
    assert [e.seq_nr for e in envs] == [1]
    assert [e.event for e in await read_all(journal, pid)] == [{"i": "again"}]


async def test_unknown_manifest_on_read_names_pid_and_seq_nr(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    pid = "Unknown|1"
    await journal.append(pid, [{"ok": 1}], expected_seq_nr=0)
    insert = sql.SQL(
        "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
        "event_ser_id, event_ser_manifest, event_payload, writer) "
        "VALUES (%s, %s, %s, %s, now(), %s, %s, %s, 'someone-else')"
    ).format(table(schema))
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            insert, (slice_for(pid), "Unknown", pid, 2, 31, "com.example.Nobody", b'{"a":1}')
        )
        await conn.execute(insert, (slice_for(pid), "Unknown", pid, 3, 9999, "", b"\x01"))

    # Every read path carries the error in the envelope instead of ending the read.
    envs = await read_all(journal, pid)
    assert [e.event for e in envs] == [{"ok": 1}, UNDECODABLE, UNDECODABLE]
    assert envs[0].error is None and envs[0].decoded_event() == {"ok": 1}
    with pytest.raises(DeserializationError) as info:
        envs[1].decoded_event()
    err = info.value
    assert err is envs[1].error
    assert (err.persistence_id, err.seq_nr) == (pid, 2)
    assert repr(pid) in str(err) and "seq_nr 2" in str(err)
    assert "com.example.Nobody" in str(err)

    third = envs[2].error
    assert third is not None and (third.persistence_id, third.seq_nr) == (pid, 3)
    assert "9999" in str(third) and "seq_nr 3" in str(third)

    loaded = await journal.load_envelope(pid, 2)
    assert loaded is not None and loaded.error is not None and loaded.error.seq_nr == 2
    s = slice_for(pid)
    by_slice = [e async for e in journal.current_events_by_slices("Unknown", s, s)]
    assert [(e.seq_nr, e.error is None) for e in by_slice] == [(1, True), (2, False), (3, False)]

    # the readable event before it is still readable on its own
    assert [e.event for e in await read_all(journal, pid, 1, 1)] == [{"ok": 1}]


async def test_entity_type_and_slice_follow_the_persistence_id(journal: Journal) -> None:
    pids = ["Order|a|b", "Solo", "Émoji|😀"]
    for pid in pids:
        (env,) = await journal.append(pid, [{"p": pid}], expected_seq_nr=0)
        assert env.entity_type == entity_type_of(pid)
        assert env.slice == slice_for(pid)
    assert entity_type_of("Order|a|b") == "Order"
    s = slice_for("Émoji|😀")
    envs = [e async for e in journal.current_events_by_slices("Émoji", s, s)]
    assert [e.event for e in envs] == [{"p": "Émoji|😀"}]


async def test_every_batch_size_stores_the_same_rows(pg_dsn: str, journal: Journal) -> None:
    """Batches of 1, of 2..MAX_VALUES_EVENTS (VALUES rows) and beyond (arrays) store the
    same columns, return matching envelopes and refuse a stale `expected_seq_nr` whole."""
    from journal.writer import MAX_VALUES_EVENTS

    schema = journal.settings.schema
    for size in range(1, MAX_VALUES_EVENTS + 3):
        pid = f"Sizes|{size}"
        events: list[Any] = [{"i": i} for i in range(size)]
        events[-1] = b"raw"  # a second serializer in the same batch
        first = await journal.append(pid, events[:1], expected_seq_nr=0)
        appended = await journal.append(
            pid, events, expected_seq_nr=1, tags=["t1", "t2"], metadata={"m": size}
        )
        assert [e.seq_nr for e in appended] == list(range(2, size + 2))
        assert [e.event for e in appended] == events
        assert len({e.db_timestamp for e in appended}) == 1
        assert appended[0].db_timestamp > first[0].db_timestamp
        assert all(e.tags == ("t1", "t2") and e.metadata == {"m": size} for e in appended)
        with pytest.raises(ConcurrencyError):
            await journal.append(pid, events, expected_seq_nr=1)
        rows = await fetch(
            pg_dsn,
            sql.SQL(
                "SELECT seq_nr, db_timestamp, event_ser_id, event_ser_manifest, event_payload,"
                " tags, meta_payload FROM {} WHERE persistence_id = %s ORDER BY seq_nr"
            ).format(table(schema)),
            (pid,),
        )
        assert [r[0] for r in rows] == list(range(1, size + 2))
        stored = rows[1:]
        assert [r[1] for r in stored] == [e.db_timestamp for e in appended]
        assert [r[2] for r in stored] == [e.serializer_id for e in appended]
        assert [bytes(r[4]) for r in stored[:-1]] == [
            json.dumps(e, separators=(",", ":")).encode() for e in events[:-1]
        ]
        assert bytes(stored[-1][4]) == b"raw"
        assert all(
            r[5] == ["t1", "t2"] and bytes(r[6]) == b'{"m":' + str(size).encode() + b"}"
            for r in stored
        )
        assert [e.event for e in await read_all(journal, pid)] == [events[0], *events]

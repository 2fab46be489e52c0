"""Appends and durable state writes run through libpq, prepared once per connection
(`journal/aio/prepared.py`).

The prepared path must store exactly what the cursor path stores: every batch
below is appended (every state written) once through each, into two journals,
and the rows are compared column by column as PostgreSQL returns them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from journal import (
    ConcurrencyError,
    DurableStateStore,
    InvalidArgument,
    Journal,
    JournalSettings,
    SerializationError,
    SerializerRegistry,
    SyncJournal,
    slice_for,
)
from journal.aio import prepared
from journal.sync import prepared as sync_prepared
from tests.support.pg import Row, drop_test_schema, fetch, fresh_schema_name

pytestmark = pytest.mark.timeout(60)

# (persistence id, events, tags, metadata): one event, a few (VALUES rows), ten (the
# most the scalar statements take) and eleven (arrays, never prepared).
BATCHES: list[tuple[str, list[Any], list[str], Any]] = [
    ("Acct|a", [{"amount": 1}], [], None),
    ("Acct|a", [{"n": i} for i in range(3)], ['q"u\\o', "t,1", "{x}", "é ✓"], {"m": [1, 2]}),
    ("Acct|ü-b", [b"\x00\xff raw", {"big": 2**70}], ["NULL"], None),
    ("Acct|c", [{"n": i} for i in range(10)], ["one"], "meta"),
    ("Acct|c", [{"n": i} for i in range(11)], [], None),
    ("Other|d", ["text", 1.5, None, True], [], {"nested": {"k": "v"}}),
    # the array form with tags, metadata and payloads of every serializer
    ("Acct|ü-b", [{"n": i} for i in range(12)] + [b"\x00 raw", None, "é"], ["x", "NULL"], 7),
]

COLUMNS = (
    "slice, entity_type, persistence_id, seq_nr, writer, event_ser_id, event_ser_manifest, "
    "event_payload, tags, meta_ser_id, meta_ser_manifest, meta_payload, deleted"
)


@pytest.fixture
def two_schemas(pg_dsn: str) -> Iterator[tuple[str, str]]:
    names = (fresh_schema_name(), fresh_schema_name())
    yield names
    for name in names:
        drop_test_schema(pg_dsn, name)


async def stored(pg_dsn: str, schema: str) -> list[Row]:
    return await fetch(
        pg_dsn,
        sql.SQL("SELECT " + COLUMNS + " FROM {} ORDER BY persistence_id, seq_nr").format(
            sql.Identifier(schema, "event_journal")
        ),
    )


async def prepared_names(journal: Journal) -> set[str]:
    async with journal._writer._pool.connection() as conn:
        cur = await conn.execute(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'slicejournal%'"
        )
        return {row[0] for row in await cur.fetchall()}


async def append_all(journal: Journal) -> None:
    highest: dict[str, int] = {}
    for pid, events, tags, metadata in BATCHES:
        expected = highest.get(pid, 0)
        appended = await journal.append(
            pid, events, expected_seq_nr=expected, tags=tags, metadata=metadata
        )
        assert [e.seq_nr for e in appended] == list(range(expected + 1, expected + 1 + len(events)))
        assert [e.event for e in appended] == events
        assert len({e.db_timestamp for e in appended}) == 1
        highest[pid] = expected + len(events)


async def test_the_prepared_path_stores_what_the_cursor_path_stores(
    pg_dsn: str, two_schemas: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lean, plain = two_schemas
    settings = {"pool_max_size": 1, "writer_id": "w-1"}
    async with Journal.connect(
        pg_dsn, JournalSettings(schema=lean, **settings), create_schema=True
    ) as j:
        await append_all(j)
        names = await prepared_names(j)
        # one statement per scalar batch size used (1, 2, 3, 4 and 10 events), and the
        # array form (11 and 15)
        assert len(names) == 6, names
        envelopes = [e async for e in j.current_events_by_persistence_id("Acct|a")]
    with monkeypatch.context() as patch:
        patch.setattr(prepared, "PREPARED", False)
        async with Journal.connect(
            pg_dsn, JournalSettings(schema=plain, **settings), create_schema=True
        ) as j:
            await append_all(j)
            assert await prepared_names(j) == set()
    rows = await stored(pg_dsn, lean)
    assert len(rows) == sum(len(b[1]) for b in BATCHES)
    assert rows == await stored(pg_dsn, plain)
    assert [e.event for e in envelopes] == [{"amount": 1}] + [{"n": i} for i in range(3)]


async def test_an_append_returns_the_stored_timestamp_in_the_sessions_zone(
    pg_dsn: str, schema: str
) -> None:
    # Every path (prepared, for 1 and for 11 events, a caller's connection) gives the
    # timestamp as psycopg reads it on the writing session: in that session's zone.
    berlin = psycopg.conninfo.make_conninfo(pg_dsn, options="-c TimeZone=Europe/Berlin")
    async with Journal.connect(berlin, JournalSettings(schema=schema), create_schema=True) as j:
        (one,) = await j.append("Acct|t", [{"a": 1}], expected_seq_nr=0)
        eleven = await j.append("Acct|t", [{"a": i} for i in range(11)], expected_seq_nr=1)
        async with await psycopg.AsyncConnection.connect(berlin) as conn:
            (mine,) = await j.append("Acct|t", [{"a": 12}], expected_seq_nr=12, conn=conn)
            await conn.commit()
        returned = [one, *eleven, mine]
        read = [e async for e in j.current_events_by_persistence_id("Acct|t")]
    assert [e.db_timestamp for e in read] == [e.db_timestamp for e in returned]
    assert {str(e.db_timestamp.tzinfo) for e in returned} == {"Europe/Berlin"}


async def test_a_statement_the_session_has_but_forgot_is_used(
    pg_dsn: str, settings: JournalSettings
) -> None:
    # A task cancelled while its statement was being prepared leaves the statement on
    # the server and its name unrecorded: the next prepare finds it there.
    async with Journal.connect(
        pg_dsn, attrs.evolve(settings, pool_max_size=1), create_schema=True
    ) as j:
        await j.append("Acct|g", [{"a": 1}], expected_seq_nr=0)
        prepared._prepared.clear()
        await j.append("Acct|g", [{"a": 2}], expected_seq_nr=1)
        assert len(await prepared_names(j)) == 1
        assert [e.seq_nr async for e in j.current_events_by_persistence_id("Acct|g")] == [1, 2]


async def test_a_seq_nr_beyond_int4_appends_on_every_path(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    edge = 2**31 - 1
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
                "writer, event_ser_id, event_ser_manifest, event_payload, deleted) "
                "VALUES (%s, 'Acct', %s, %s, now(), 'w', 0, '', '\\x'::bytea, false)"
            ).format(sql.Identifier(schema, "event_journal")),
            (slice_for("Acct|edge"), "Acct|edge", edge),
        )
    # psycopg sends 2**31 - 1 as an int4: `expected + 1` must not overflow
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        (mine,) = await journal.append("Acct|edge", [{"a": 1}], expected_seq_nr=edge, conn=conn)
        await conn.commit()
    (pooled,) = await journal.append("Acct|edge", [{"a": 2}], expected_seq_nr=edge + 1)
    assert (mine.seq_nr, pooled.seq_nr) == (edge + 1, edge + 2)


async def test_a_statement_the_session_forgot_is_prepared_again(
    pg_dsn: str, settings: JournalSettings
) -> None:
    async with Journal.connect(
        pg_dsn, attrs.evolve(settings, pool_max_size=1), create_schema=True
    ) as j:
        await j.append("Acct|f", [{"a": 1}], expected_seq_nr=0)
        assert await prepared_names(j)
        async with j._writer._pool.connection() as conn:
            await conn.execute("DEALLOCATE ALL")
        await j.append("Acct|f", [{"a": 2}], expected_seq_nr=1)
        assert len(await prepared_names(j)) == 1
        with pytest.raises(ConcurrencyError):
            await j.append("Acct|f", [{"a": 2}], expected_seq_nr=1)
        assert [e.event async for e in j.current_events_by_persistence_id("Acct|f")] == [
            {"a": 1},
            {"a": 2},
        ]


async def test_concurrent_conflicting_appends_on_the_prepared_path(journal: Journal) -> None:
    async def attempt(i: int) -> int | None:
        try:
            await journal.append("Acct|race", [{"writer": i}, {"writer": i}], expected_seq_nr=0)
            return i
        except ConcurrencyError:
            return None

    winners = [w for w in await asyncio.gather(*(attempt(i) for i in range(12))) if w is not None]
    assert len(winners) == 1
    read = [e.event async for e in journal.current_events_by_persistence_id("Acct|race")]
    assert read == [{"writer": winners[0]}] * 2


async def test_a_session_not_in_utf8_uses_the_cursor(pg_dsn: str, schema: str) -> None:
    latin1 = psycopg.conninfo.make_conninfo(pg_dsn, client_encoding="LATIN1")
    async with Journal.connect(
        latin1, JournalSettings(schema=schema, pool_max_size=1), create_schema=True
    ) as j:
        await j.append("Acct|l", [{"name": "é"}], expected_seq_nr=0, tags=["ü"])
        assert await prepared_names(j) == set()
        (read,) = [e async for e in j.current_events_by_persistence_id("Acct|l")]
        assert (read.event, read.tags) == ({"name": "é"}, ("ü",))


def test_the_sync_flavour_appends_prepared(pg_dsn: str, schema: str) -> None:
    assert sync_prepared.PREPARED
    with SyncJournal.connect(
        pg_dsn, JournalSettings(schema=schema, pool_max_size=1), create_schema=True
    ) as j:
        j.append("Acct|s", [{"a": 1}], expected_seq_nr=0, tags=["x"])
        j.append("Acct|s", [{"a": 2}, {"a": 3}], expected_seq_nr=1)
        with pytest.raises(ConcurrencyError):
            j.append("Acct|s", [{"a": 9}], expected_seq_nr=1)
        with j._writer._pool.connection() as conn:
            names = conn.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'slicejournal%'"
            ).fetchone()
        assert names == (2,)
        assert [e.event for e in j.current_events_by_persistence_id("Acct|s")] == [
            {"a": 1},
            {"a": 2},
            {"a": 3},
        ]


async def test_values_beyond_the_columns_are_refused_before_anything_is_written(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    for expected, events in [(2**63 - 1, [{"a": 1}]), (2**63 - 2, [{"a": 1}, {"a": 2}])]:
        with pytest.raises(InvalidArgument, match="beyond the largest"):
            await journal.append("Acct|big", events, expected_seq_nr=expected)

    class Wide:
        id = 2**31
        manifest = to_bytes = from_bytes = None

    with pytest.raises(SerializationError, match="integer range"):
        SerializerRegistry().add(Wide())  # type: ignore[arg-type]
    rows = await fetch(
        pg_dsn, sql.SQL("SELECT seq_nr FROM {}").format(sql.Identifier(schema, "event_journal"))
    )
    assert rows == []


STATE_COLUMNS = (
    "slice, entity_type, persistence_id, revision, state_ser_id, state_ser_manifest, "
    "state_payload, tags"
)


async def write_states(journal: Journal) -> list[Any]:
    store = DurableStateStore(journal)
    await store.upsert("Cart|1", {"items": ["é"]}, revision=1, tags=['q"u', "t,1"])
    await store.upsert("Cart|1", {"items": []}, revision=2)
    await store.upsert("Cart|2", b"\x00raw", revision=1)
    await store.delete("Cart|2", revision=2)
    with pytest.raises(ConcurrencyError):
        await store.upsert("Cart|1", {"stale": True}, revision=2)
    with pytest.raises(ConcurrencyError):
        await store.upsert("Cart|3", {"skipped": True}, revision=2)
    state = await store.get("Cart|1")
    assert state is not None
    return [state.revision, state.value]


async def test_durable_state_writes_store_what_the_cursor_path_stores(
    pg_dsn: str, two_schemas: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lean, plain = two_schemas
    async with Journal.connect(
        pg_dsn, JournalSettings(schema=lean, pool_max_size=1), create_schema=True
    ) as j:
        got = await write_states(j)
        assert len(await prepared_names(j)) == 2  # the insert and the update
    with monkeypatch.context() as patch:
        patch.setattr(prepared, "PREPARED", False)
        async with Journal.connect(
            pg_dsn, JournalSettings(schema=plain, pool_max_size=1), create_schema=True
        ) as j:
            assert await write_states(j) == got == [2, {"items": []}]
            assert await prepared_names(j) == set()

    async def states(schema: str) -> list[Row]:
        return await fetch(
            pg_dsn,
            sql.SQL("SELECT " + STATE_COLUMNS + " FROM {} ORDER BY persistence_id").format(
                sql.Identifier(schema, "durable_state")
            ),
        )

    rows = await states(lean)
    assert len(rows) == 2
    assert rows == await states(plain)

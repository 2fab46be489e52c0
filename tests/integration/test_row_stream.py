"""Catch-up chunks streamed by the server and read ahead (`journal.aio.row_stream`,
`SliceReader`'s `_Ahead`), against the server-side cursor they replace.

A current query over many bounded chunks must read the same envelopes, in the
same order, whichever way its chunks are fetched; a stream left in the middle of
a chunk (with the next one already started) must cancel both statements and give
every connection back to the read pool idle.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
import pytest

from journal import Journal, JournalSettings
from journal.aio import row_stream, slice_reader
from journal.query.horizon import READER_APPLICATION
from tests.support.pg import fast_query_settings

ENTITY = "Chunk"
EVENTS = 12_000


async def _fill(pg_dsn: str, journal: Journal) -> None:
    # Over an hour: the bucket counts cut the catch-up into many bounded chunks.
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
                "event_ser_id, event_ser_manifest, event_payload, writer) "
                "SELECT s %% 1024, %s, %s || (s %% 500), s / 500 + 1, "
                "now() - interval '1 hour' + s * interval '250 milliseconds', 31, '', "
                "convert_to('{{\"n\": ' || s || '}}', 'UTF8'), 'w' "
                "FROM generate_series(0, %s) s"
            ).format(journal.tables.journal),
            (ENTITY, f"{ENTITY}|", EVENTS - 1),
        )
        await conn.execute(psycopg.sql.SQL("ANALYZE {}").format(journal.tables.journal))


def _key(e: Any) -> tuple[Any, ...]:
    return (e.persistence_id, e.seq_nr, e.db_timestamp, e.event, e.offset.timestamp)


async def _settled(journal: Journal) -> dict[str, int]:
    """The read pool's figures once no connection is being opened (a stream that found
    none free to read ahead with lets the pool open one)."""
    for _ in range(100):
        stats = journal.read_pool.get_stats()
        if stats.get("pool_available", 0) == stats["pool_size"]:
            break
        await asyncio.sleep(0.05)
    return stats


async def _read(journal: Journal) -> list[tuple[Any, ...]]:
    return [_key(e) async for e in journal.current_events_by_slices(ENTITY, 0, 1023)]


@pytest.mark.timeout(120)
async def test_streamed_chunks_read_ahead_are_the_cursor_s_chunks(
    pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert row_stream.STREAMING, "the installed psycopg and libpq stream chunks"
    # Read connections open from the start: reading ahead does not wait for the pool to grow.
    settings = JournalSettings(
        schema=schema, pool_min_size=3, query=fast_query_settings(buffer_size=100)
    )
    async with Journal.connect(pg_dsn, settings, create_schema=True) as journal:
        await _fill(pg_dsn, journal)
        read_ahead = 0
        rows = slice_reader._Ahead.rows

        def counted(self: Any) -> Any:
            nonlocal read_ahead
            read_ahead += 1
            return rows(self)

        monkeypatch.setattr(slice_reader._Ahead, "rows", counted)
        streamed = await _read(journal)
        assert read_ahead >= 5, "chunks were read ahead"
        monkeypatch.setattr(row_stream, "STREAMING", False)
        read_ahead = 0
        cursor = await _read(journal)
        assert read_ahead == 0
    assert len(streamed) == EVENTS
    assert streamed == cursor
    assert sorted(streamed, key=lambda k: (k[2], k[1], k[0])) == streamed
    assert {k[3]["n"] for k in streamed} == set(range(EVENTS))


@pytest.mark.timeout(120)
async def test_a_stream_left_mid_chunk_cancels_its_statements_and_returns_its_connections(
    pg_dsn: str, schema: str
) -> None:
    assert row_stream.STREAMING
    # Read connections open from the start: reading ahead does not wait for the pool to grow.
    settings = JournalSettings(
        schema=schema, pool_min_size=3, query=fast_query_settings(buffer_size=100)
    )
    async with Journal.connect(pg_dsn, settings, create_schema=True) as journal:
        await _fill(pg_dsn, journal)
        for take in (1, 150, 2_500):  # in the first chunk, its second batch, further on
            async with contextlib.aclosing(
                journal.current_events_by_slices(ENTITY, 0, 1023)  # type: ignore[type-var]
            ) as stream:
                n = 0
                async for _ in stream:
                    n += 1
                    if n == take:
                        break
            stats = await _settled(journal)
            assert stats.get("pool_available", 0) == stats["pool_size"], stats
            assert stats.get("returns_bad", 0) == 0, "a connection came back busy"
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = %s AND state <> 'idle'",
                    (READER_APPLICATION,),
                )
                assert await cur.fetchone() == (0,), "a reader's statement still runs"
        assert len(await _read(journal)) == EVENTS


@pytest.mark.timeout(120)
async def test_reading_ahead_never_takes_the_read_pool_s_last_connection(
    pg_dsn: str, schema: str
) -> None:
    # Two read connections: a paused catch-up holds one, and must leave the other to
    # the rest of the journal's reads (here by persistence id) instead of reading ahead.
    settings = JournalSettings(
        schema=schema, pool_max_size=2, query=fast_query_settings(buffer_size=100)
    )
    async with Journal.connect(pg_dsn, settings, create_schema=True) as journal:
        await _fill(pg_dsn, journal)
        async with contextlib.aclosing(
            journal.current_events_by_slices(ENTITY, 0, 1023)  # type: ignore[type-var]
        ) as stream:
            n = 0
            async for _ in stream:
                n += 1
                if n in (1, 900, 5_000):  # in chunks that could read ahead
                    by_id = [
                        e.seq_nr
                        async for e in journal.current_events_by_persistence_id(f"{ENTITY}|7")
                    ]
                    assert by_id == list(range(1, len(by_id) + 1)) and by_id
        assert n == EVENTS


@pytest.mark.timeout(60)
async def test_read_sessions_run_in_utc_without_parallel_workers(journal: Journal) -> None:
    # A chunk's parallel plan costs the server more CPU for a sooner first row, which a
    # stream reading ahead does not wait for (`journal.aio.pool._configure_reader`).
    async with journal.read_pool.connection() as conn:
        cur = await conn.execute("SELECT current_setting('max_parallel_workers_per_gather')")
        assert await cur.fetchone() == ("0",)
        cur = await conn.execute("SELECT current_setting('TimeZone')")
        assert await cur.fetchone() == ("UTC",)
    async with journal.pool.connection() as conn:  # the write pool keeps the server's
        cur = await conn.execute(
            "SELECT current_setting('max_parallel_workers_per_gather') = "
            "(SELECT reset_val FROM pg_settings WHERE name = 'max_parallel_workers_per_gather')"
        )
        assert await cur.fetchone() == (True,)

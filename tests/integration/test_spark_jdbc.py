"""`read_events`: the batch read planned by slicejournal, executed by Spark's JDBC source,
against the `slicejournal` source's own read of the same journal (real Spark, real
PostgreSQL over TCP, the real PostgreSQL JDBC driver)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import Journal
from journal.slices import slice_for
from projections.spark import read_events
from projections.spark.options import SourceOptionError
from tests.support.jdbc import JDBC_JAR, tcp_dsn

ENTITY = "Ledger"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tcp(pg_dsn: str) -> Iterator[str]:
    with tcp_dsn(pg_dsn) as dsn:
        yield dsn


async def _fill(j: Journal) -> None:
    for i in range(60):
        pid = f"{ENTITY}|l{i}"
        events: list[Any] = [{"amount": k, "i": i} for k in range(1 + i % 5)]
        if i % 7 == 0:
            events.append(b"\x00raw bytes")  # serializer 4: read as bytes, not text
        await j.append(pid, events, expected_seq_nr=0, tags=["t1", "t2"] if i % 3 == 0 else ())
    await j.append(f"{ENTITY}|meta", [{"m": 1}], expected_seq_nr=0, metadata={"trace": "x"})
    await j.delete_events_to(f"{ENTITY}|l4", 2)  # deleted events are not read
    await j.delete_all(f"{ENTITY}|l5", reset_sequence_number=True)  # its tombstone is read
    await j.append("Other|x", [{"amount": 1}], expected_seq_nr=0)
    await asyncio.sleep(0.05)  # past the horizon's margin: every event below the bound


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in frame.collect())


def _options(dsn: str, schema: str, **more: object) -> dict[str, str]:
    return {
        "dsn": dsn,
        "schema": schema,
        "entityType": ENTITY,
        **{k: str(v) for k, v in more.items()},
    }


@pytest.mark.skipif(not os.path.exists(JDBC_JAR), reason=f"no JDBC driver at {JDBC_JAR}")
async def test_the_jdbc_read_reads_the_sources_rows_and_schema(
    spark: Any, journal: Journal, tcp: str, pg_dsn: str
) -> None:
    await _fill(journal)
    # Half the ids' rows updated: their new row versions lie behind newer rows in the
    # table, so a partition's rows come from the server out of time order unless
    # something sorts them.
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {} SET writer = writer WHERE persistence_id = ANY(%s)").format(
                journal.tables.journal
            ),
            ([f"{ENTITY}|l{i}" for i in range(0, 60, 2)],),
        )
    schema = journal.settings.schema
    for more in [{}, {"numPartitions": 3, "minSlice": 100, "maxSlice": 900}]:
        options = _options(tcp, schema, **more)
        via_jdbc = read_events(spark, options, executor="jdbc")
        via_source = read_events(spark, options, executor="source")
        # The same columns and types (JDBC knows which are NOT NULL; the source does not).
        assert via_jdbc.schema.simpleString() == via_source.schema.simpleString()
        jdbc_rows = _rows(via_jdbc)
        assert jdbc_rows == _rows(via_source)
        assert len(jdbc_rows) > 100
        assert via_jdbc.rdd.getNumPartitions() == via_source.rdd.getNumPartitions()
    rows = {
        (r.persistence_id, r.seq_nr): r for r in read_events(spark, _options(tcp, schema)).collect()
    }
    assert rows[(f"{ENTITY}|l5", 0)].event is None  # the tombstone of an erased id
    assert (f"{ENTITY}|l4", 1) not in rows and (f"{ENTITY}|l4", 3) in rows
    assert rows[(f"{ENTITY}|l0", 2)].event_bytes == b"\x00raw bytes"
    assert rows[(f"{ENTITY}|l0", 2)].event is None and rows[(f"{ENTITY}|l0", 1)].tags == [
        "t1",
        "t2",
    ]
    assert json.loads(rows[(f"{ENTITY}|meta", 1)].metadata) == {"trace": "x"}
    # Each partition in (db_timestamp, seq_nr) order, each id in one partition.
    partitions = via_jdbc.rdd.glom().collect()
    seen: set[str] = set()
    for part in partitions:
        keys = [(r.db_timestamp, r.seq_nr) for r in part]
        assert keys == sorted(keys)
        pids = {r.persistence_id for r in part}
        assert not pids & seen
        seen |= pids
    assert all(100 <= slice_for(p) <= 900 for p in seen)


@pytest.mark.skipif(not os.path.exists(JDBC_JAR), reason=f"no JDBC driver at {JDBC_JAR}")
async def test_the_jdbc_read_stops_below_a_transaction_still_open(
    spark: Any, journal: Journal, tcp: str, pg_dsn: str
) -> None:
    """One cut for every partition: a transaction open while the read is planned holds
    its bound back, so an event committed after it started is in no partition until a
    read planned after it ended (as for the source's stream batches)."""
    await journal.append(f"{ENTITY}|before", [{"n": 1}], expected_seq_nr=0)
    await asyncio.sleep(0.05)
    options = _options(tcp, journal.settings.schema)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as held:
        await held.execute("SELECT 1")  # a transaction open from here on
        await journal.append(f"{ENTITY}|after", [{"n": 2}], expected_seq_nr=0)
        await asyncio.sleep(0.05)
        during = {r.persistence_id for r in read_events(spark, options).collect()}
        await held.rollback()
    await asyncio.sleep(0.05)
    after = {r.persistence_id for r in read_events(spark, options).collect()}
    assert during == {f"{ENTITY}|before"}
    assert after == {f"{ENTITY}|before", f"{ENTITY}|after"}


async def test_auto_falls_back_to_the_source_and_jdbc_says_why_it_cannot(
    spark: Any, journal: Journal, pg_dsn: str
) -> None:
    await _fill(journal)
    schema = journal.settings.schema
    socket_only = pg_dsn if "host=/" in pg_dsn or "@/" in pg_dsn else None
    filtered = _options(pg_dsn, schema, tags="t1")
    assert _rows(read_events(spark, filtered)) == _rows(
        read_events(spark, filtered, executor="source")
    )
    with pytest.raises(SourceOptionError, match="an event filter"):
        read_events(spark, filtered, executor="jdbc")
    if socket_only is not None:
        with pytest.raises(SourceOptionError, match="no single TCP host"):
            read_events(spark, _options(socket_only, schema), executor="jdbc")
        auto = read_events(spark, _options(socket_only, schema))
        assert len(_rows(auto)) > 100
    with pytest.raises(SourceOptionError, match="executor must be"):
        read_events(spark, _options(pg_dsn, schema), executor="odbc")  # type: ignore[arg-type]
    with pytest.raises(SourceOptionError, match="unknown option"):
        read_events(spark, {**_options(pg_dsn, schema), "numPartition": "2"})


@pytest.mark.skipif(not os.path.exists(JDBC_JAR), reason=f"no JDBC driver at {JDBC_JAR}")
async def test_jdbc_properties_reach_the_driver_last_and_bad_text_fails_the_read(
    spark: Any, journal: Journal, tcp: str
) -> None:
    """`jdbc_properties` override the read's own driver properties (here the user, so
    the partitions' connections fail naming it; `prepareThreshold` as a pooler without
    prepared statements needs gives the same rows); a JSON payload that is not UTF-8
    fails the read, as it fails the source's, instead of arriving as broken text."""
    await _fill(journal)
    schema = journal.settings.schema
    options = _options(tcp, schema)
    expected = _rows(read_events(spark, options, executor="jdbc"))
    pooled = read_events(spark, options, executor="jdbc", jdbc_properties={"prepareThreshold": "5"})
    assert _rows(pooled) == expected
    with pytest.raises(Exception, match=r"FAILED_JDBC\.CONNECTION|no_such_reader"):
        read_events(spark, options, executor="jdbc", jdbc_properties={"user": "no_such_reader"})
    with pytest.raises(SourceOptionError, match="jdbc_properties must map str to str"):
        read_events(spark, options, jdbc_properties={"prepareThreshold": 5})  # type: ignore[dict-item]
    async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
        await conn.execute(
            psycopg.sql.SQL(
                "UPDATE {} SET event_payload = '\\xff7b7d'::bytea "
                "WHERE persistence_id = %s AND seq_nr = 1"
            ).format(journal.tables.journal),
            (f"{ENTITY}|l1",),
        )
    for executor in ("jdbc", "source"):
        with pytest.raises(Exception, match=r"(?i)utf-?8"):
            read_events(spark, options, executor=executor).collect()

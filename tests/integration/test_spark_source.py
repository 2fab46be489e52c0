"""The `slicejournal` Spark data source, batch side, against a real local Spark and PostgreSQL."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from journal import DurableStateStore, Journal, SerializerRegistry
from journal.errors import ConnectionFailed, SchemaNotInitialized
from journal.slices import slice_for
from projections.spark import arrow_read, register
from projections.spark.arrow import ARROW_SCHEMA
from projections.spark.options import parse_options
from projections.spark.sql import ReadPlan, window_count

ENTITY = "Acct"


async def _fill(j: Journal, accounts: int = 120) -> dict[str, int]:
    per_pid: dict[str, int] = {}
    for i in range(accounts):
        pid = f"{ENTITY}|a{i}"
        n = 1 + i % 7
        await j.append(pid, [{"amount": k, "i": i} for k in range(n)], expected_seq_nr=0)
        per_pid[pid] = n
    await j.append("Other|x", [{"amount": 1}], expected_seq_nr=0)
    return per_pid


def _reader(spark: Any, dsn: str, schema: str, **options: object) -> Any:
    r = spark.read.format("slicejournal").option("dsn", dsn).option("schema", schema)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def assert_stream_refuses(
    spark: Any, dsn: str, schema: str, options: dict[str, str], message: str
) -> None:
    """A stream with `options` fails as it starts, with `message` (batch-only options)."""
    reader = spark.readStream.format("slicejournal").option("dsn", dsn).option("schema", schema)
    stream = reader.option("entityType", ENTITY).options(**options).load()
    with pytest.raises(Exception, match=message):
        query = stream.writeStream.format("noop").start()
        try:
            query.awaitTermination(60)
        finally:
            query.stop()


@pytest.mark.timeout(300)
async def test_batch_reads_every_event_in_order(spark: Any, journal: Journal, pg_dsn: str) -> None:
    per_pid = await _fill(journal)
    # A deleted event is not read.
    await journal.delete_events_to(f"{ENTITY}|a6", 1)
    per_pid_live = {p: [s for s in range(1, n + 1)] for p, n in per_pid.items()}
    per_pid_live[f"{ENTITY}|a6"] = per_pid_live[f"{ENTITY}|a6"][1:]
    schema = journal.settings.schema
    for lo, hi, parts in [(0, 1023, 1), (0, 1023, 4), (0, 511, 3), (100, 900, 7)]:
        df = _reader(spark, pg_dsn, schema, entityType=ENTITY, minSlice=lo, maxSlice=hi,
                     numPartitions=parts)  # fmt: skip
        assert df.rdd.getNumPartitions() == min(parts, hi - lo + 1)
        rows = df.select("persistence_id", "seq_nr", "slice", "event", "entity_type").collect()
        expected = {p: s for p, s in per_pid_live.items() if lo <= slice_for(p) <= hi}
        got: dict[str, list[int]] = {}
        for row in rows:
            assert row.entity_type == ENTITY and row.slice == slice_for(row.persistence_id)
            assert json.loads(row.event)["amount"] == row.seq_nr - 1
            got.setdefault(row.persistence_id, []).append(row.seq_nr)
        assert got == expected, (lo, hi, parts)


@pytest.mark.timeout(300)
async def test_an_unordered_batch_read_reads_the_same_rows_and_a_stream_refuses_it(
    spark: Any, journal: Journal, pg_dsn: str
) -> None:
    """`ordered=false` drops the server's sort, nothing else: the same rows, each id in
    one partition. A stream needs the order, so it refuses the option."""
    await _fill(journal, 60)
    schema = journal.settings.schema

    def partitioned(ordered: str) -> list[list[tuple[str, int]]]:
        df = _reader(spark, pg_dsn, schema, entityType=ENTITY, numPartitions=4, ordered=ordered)
        parts = df.select("persistence_id", "seq_nr").rdd.glom().collect()
        return [[(r.persistence_id, r.seq_nr) for r in part] for part in parts]

    ordered, unordered = partitioned("true"), partitioned("false")
    assert [sorted(p) for p in unordered] == [sorted(p) for p in ordered]
    assert sum(len(p) for p in unordered) == sum(1 + i % 7 for i in range(60))
    for part in ordered:  # the default keeps each id's events in seq_nr order
        for pid in {p for p, _ in part}:
            seq = [s for p, s in part if p == pid]
            assert seq == sorted(seq)

    assert_stream_refuses(
        spark, pg_dsn, schema, {"ordered": "false"}, "'ordered' applies to batch reads only"
    )


@pytest.mark.timeout(300)
async def test_a_batch_read_from_snapshots_reads_each_snapshot_and_the_events_after_it(
    spark: Any, journal: Journal, pg_dsn: str
) -> None:
    """`fromSnapshots`: an id's snapshot in place of its events up to its seq_nr, flagged
    in the `from_snapshot` column; a stream, or a filter beside it, is refused."""
    per_pid = await _fill(journal, 30)
    snapshotted = {p: n - 1 for p, n in per_pid.items() if n >= 3}  # at the one-but-last
    for pid, seq_nr in snapshotted.items():
        await journal.save_snapshot(pid, seq_nr, {"state": seq_nr})
    schema = journal.settings.schema
    df = _reader(spark, pg_dsn, schema, entityType=ENTITY, numPartitions=3, fromSnapshots="true")
    rows = df.select("persistence_id", "seq_nr", "event", "from_snapshot").collect()
    got = sorted((r.persistence_id, r.seq_nr, r.from_snapshot) for r in rows)
    expected = sorted(
        [(p, s, True) for p, s in snapshotted.items()]
        + [(p, n, False) for p, n in per_pid.items() if p in snapshotted]
        + [(p, s, False) for p, n in per_pid.items() if p not in snapshotted
           for s in range(1, n + 1)]
    )  # fmt: skip
    assert got == expected
    states = {r.persistence_id: json.loads(r.event) for r in rows if r.from_snapshot}
    assert states == {p: {"state": s} for p, s in snapshotted.items()}
    plain = _reader(spark, pg_dsn, schema, entityType=ENTITY)
    assert "from_snapshot" not in plain.columns  # the schema is the events' without it

    with pytest.raises(Exception, match="'fromSnapshots' cannot be combined"):
        _reader(spark, pg_dsn, schema, entityType=ENTITY, fromSnapshots="true", tags="a")
    assert_stream_refuses(
        spark,
        pg_dsn,
        schema,
        {"fromSnapshots": "true"},
        "'fromSnapshots' applies to batch reads only",
    )


@pytest.mark.timeout(300)
async def test_a_batch_read_of_durable_state_reads_each_ids_latest_revision(
    spark: Any, journal: Journal, pg_dsn: str
) -> None:
    """`read=durableState`: one row per id of the entity type, its latest revision and
    state, deleted ones flagged; event filters do not apply to it (its stream:
    test_spark_durable_state.py)."""
    store = DurableStateStore(journal)
    latest: dict[str, tuple[int, Any, bool]] = {}
    for i in range(25):
        pid = f"{ENTITY}|c{i}"
        for revision in range(1, 2 + i % 4):
            await store.upsert(pid, {"items": revision, "i": i}, revision=revision)
        latest[pid] = (1 + i % 4, {"items": 1 + i % 4, "i": i}, False)
        if i % 5 == 0:
            await store.delete(pid, revision=2 + i % 4)
            latest[pid] = (2 + i % 4, None, True)
    await store.upsert("Other|x", {"items": 1}, revision=1)
    await journal.append(f"{ENTITY}|an-event", [{"amount": 1}], expected_seq_nr=0)
    schema = journal.settings.schema
    df = _reader(spark, pg_dsn, schema, entityType=ENTITY, numPartitions=3, read="durableState")
    assert df.columns == [
        "persistence_id", "entity_type", "slice", "revision", "db_timestamp", "value",
        "value_bytes", "ser_id", "ser_manifest", "tags", "deleted",
    ]  # fmt: skip
    got = {
        r.persistence_id: (r.revision, None if r.value is None else json.loads(r.value), r.deleted)
        for r in df.collect()
    }
    assert got == latest
    one = _reader(spark, pg_dsn, schema, entityType=ENTITY, read="DURABLESTATE")
    assert one.filter(one.persistence_id == f"{ENTITY}|c3").count() == 1

    with pytest.raises(Exception, match="do not apply to read=durableState"):
        _reader(spark, pg_dsn, schema, entityType=ENTITY, read="durableState", tags="a")
    with pytest.raises(Exception, match="option 'read' must be one of"):
        _reader(spark, pg_dsn, schema, entityType=ENTITY, read="states")


@pytest.mark.timeout(300)
async def test_timestamp_bounds_and_filters(spark: Any, journal: Journal, pg_dsn: str) -> None:
    await _fill(journal, 40)
    schema = journal.settings.schema
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute(
            sql.SQL(
                "SELECT db_timestamp FROM {} WHERE entity_type = %s ORDER BY db_timestamp"
            ).format(journal.tables.journal),
            (ENTITY,),
        )
        stamps = [r[0] for r in await cur.fetchall()]
    middle = stamps[len(stamps) // 2]
    df = _reader(spark, pg_dsn, schema, entityType=ENTITY, fromTimestamp=middle.isoformat())
    assert df.count() == sum(1 for t in stamps if t >= middle)
    df = _reader(spark, pg_dsn, schema, entityType=ENTITY, toTimestamp=middle.isoformat())
    assert df.count() == sum(1 for t in stamps if t <= middle)

    for pushdown in ("false", "true"):
        spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown)
        register(spark)
        try:
            df = _reader(spark, pg_dsn, schema, entityType=ENTITY)
            one = df.filter(df.persistence_id == f"{ENTITY}|a5").collect()
            assert [r.seq_nr for r in one] == list(range(1, 7))
            ranged = df.filter((df.slice >= 200) & (df.slice < 600)).count()
            assert ranged == sum(
                1 + i % 7 for i in range(40) if 200 <= slice_for(f"{ENTITY}|a{i}") < 600
            )
            assert df.filter(df.db_timestamp >= middle).count() == sum(
                1 for t in stamps if t >= middle
            )
            assert df.filter(df.entity_type == "Other").count() == 0
        finally:
            spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
            register(spark)


@pytest.mark.timeout(300)
async def test_filter_options_and_pushed_manifest_filters(
    spark: Any, journal: Journal, pg_dsn: str
) -> None:
    """Options `manifests`/`tags`/`where` (issue 30): the rows the filter leaves out are
    not read (a DataFrame has no offsets to keep), or read as keys with
    `filteredEnvelopes`; a pushed `ser_manifest` filter is evaluated by PostgreSQL."""
    registry = SerializerRegistry()
    registry.register(Deposit, "acct.Deposit")
    registry.register(Withdrawal, "acct.Withdrawal")
    written: list[tuple[str, int, str, bool]] = []
    async with Journal.connect(pg_dsn, journal.settings, serializers=registry) as typed:
        for i in range(30):
            pid = f"{ENTITY}|f{i}"
            events = [Deposit(k) if (i + k) % 3 else Withdrawal(k) for k in range(4)]
            tagged = i % 2 == 0
            await typed.append(pid, events, expected_seq_nr=0, tags=("eu",) if tagged else ())
            for k, e in enumerate(events):
                written.append((pid, k + 1, f"acct.{type(e).__name__}", tagged))
    schema = journal.settings.schema

    def keys(df: Any) -> set[tuple[str, int]]:
        return {
            (r.persistence_id, r.seq_nr) for r in df.select("persistence_id", "seq_nr").collect()
        }

    df = _reader(spark, pg_dsn, schema, entityType=ENTITY, manifests="acct.Withdrawal",
                 tags='["eu"]', where="seq_nr > 1")  # fmt: skip
    assert keys(df) == {(p, s) for p, s, m, t in written if m == "acct.Withdrawal" and t and s > 1}
    df = _reader(spark, pg_dsn, schema, entityType=ENTITY, tags="eu", filteredEnvelopes="true")
    rows = df.select("persistence_id", "seq_nr", "ser_manifest", "event_bytes", "tags").collect()
    assert len(rows) == len(written)
    left_out = {
        (r.persistence_id, r.seq_nr) for r in rows if r.ser_manifest == "slicejournal.filtered"
    }
    assert left_out == {(p, s) for p, s, _, t in written if not t}
    assert all(
        r.event_bytes is None and r.tags == []
        for r in rows
        if (r.persistence_id, r.seq_nr) in left_out
    )

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    register(spark)
    try:
        df = _reader(spark, pg_dsn, schema, entityType=ENTITY)
        pushed = df.filter(df.ser_manifest.isin("acct.Deposit"))
        assert keys(pushed) == {(p, s) for p, s, m, _ in written if m == "acct.Deposit"}
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
        register(spark)


@attrs.frozen
class Deposit:
    amount: int


@attrs.frozen
class Withdrawal:
    amount: int


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"minSlice": "1024"}, "minSlice"),
        ({"minSlice": "9", "maxSlice": "3"}, "greater than"),
        ({"numPartitions": "0"}, "numPartitions"),
        ({"numPartitions": "many"}, "numPartitions"),
        ({"entityType": "A|B"}, "entityType"),
        ({"fromTimestamp": "yesterday"}, "fromTimestamp"),
        ({"fromTimestamp": "2026-01-01T00:00:00"}, "UTC offset"),
        ({"bogus": "1"}, "unknown option"),
        ({"ordered": "maybe"}, "ordered"),
    ],
)
def test_bad_options_fail_at_load(
    spark: Any, pg_dsn: str, options: dict[str, str], message: str
) -> None:
    r = spark.read.format("slicejournal").option("dsn", pg_dsn).option("entityType", "A")
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(Exception) as info:
        r.load()
    assert message in str(info.value)
    assert "SourceOptionError" in str(info.value)


def test_missing_dsn_and_case_insensitive_options(spark: Any, pg_dsn: str) -> None:
    with pytest.raises(Exception, match="'dsn' is required"):
        spark.read.format("slicejournal").option("entityType", "A").load()
    # Any case of an option name works (Spark lowercases them).
    df = (
        spark.read.format("slicejournal")
        .option("DSN", pg_dsn)
        .option("ENTITYTYPE", "Nothing")
        .option("numpartitions", "2")
        .option("SCHEMA", "public_missing_schema")
        .load()
    )
    # Building the DataFrame needs no database: the schema is the source's own.
    assert df.columns[:4] == ["persistence_id", "entity_type", "slice", "seq_nr"]


@pytest.mark.timeout(300)
async def test_every_serializer_tags_and_metadata_in_small_batches(
    spark: Any, journal: Journal, pg_dsn: str
) -> None:
    # JSON and bytes events interleaved in one partition, read in batches of 3 rows.
    expected: dict[tuple[str, int], tuple[str | None, bytes | None, list[str], str | None]] = {}
    for i in range(12):
        pid = f"{ENTITY}|s{i}"
        if i % 2:
            await journal.append(pid, [b"\x00\xffraw" + bytes([i])], expected_seq_nr=0)
            expected[pid, 1] = (None, b"\x00\xffraw" + bytes([i]), [], None)
        else:
            await journal.append(
                pid, [{"i": i, "text": "é ✓"}], expected_seq_nr=0, tags=["t", f"n{i}"],
                metadata={"by": i},
            )  # fmt: skip
            event = json.dumps({"i": i, "text": "é ✓"})
            expected[pid, 1] = (event, None, ["t", f"n{i}"], json.dumps({"by": i}))
    df = _reader(spark, pg_dsn, journal.settings.schema, entityType=ENTITY, numPartitions=1,
                 batchRows=3)  # fmt: skip
    rows = df.collect()
    got = {
        (r.persistence_id, r.seq_nr): (
            None if r.event is None else json.dumps(json.loads(r.event)),
            None if r.event_bytes is None else bytes(r.event_bytes),
            list(r.tags),
            None if r.metadata is None else json.dumps(json.loads(r.metadata)),
        )
        for r in rows
    }
    assert got == expected
    assert [r.db_timestamp for r in rows] == sorted(r.db_timestamp for r in rows)


async def test_a_partition_streams_in_bounded_batches(
    journal: Journal, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's batches are bounded by bytes, not by the partition: with a 2 KiB
    target a partition of 120 ids arrives in many batches, every row once, in order."""
    per_pid = await _fill(journal)
    await journal.delete_events_to(f"{ENTITY}|a6", 1)
    monkeypatch.setattr(arrow_read, "BATCH_BYTES", 2048)
    options = parse_options({"dsn": pg_dsn, "schema": journal.settings.schema,
                             "entityType": ENTITY, "numPartitions": "1"})  # fmt: skip
    batches = list(arrow_read.read_plan(ReadPlan(options, options.slice_range, None)))
    assert len(batches) > 5
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    rows = [r for b in batches for r in b.to_pylist()]
    keys = [(r["db_timestamp"], r["seq_nr"]) for r in rows]
    assert keys == sorted(keys)
    got: dict[str, list[int]] = {}
    for r in rows:
        got.setdefault(r["persistence_id"], []).append(r["seq_nr"])
    expected = {p: list(range(1, n + 1)) for p, n in per_pid.items() if p.startswith(ENTITY)}
    expected[f"{ENTITY}|a6"] = expected[f"{ENTITY}|a6"][1:]
    assert got == expected


def test_a_missing_table_or_server_is_a_typed_error(spark: Any, pg_dsn: str) -> None:
    options = parse_options({"dsn": pg_dsn, "schema": "public_missing_schema",
                             "entityType": ENTITY})  # fmt: skip
    with pytest.raises(SchemaNotInitialized, match="public_missing_schema"):
        next(arrow_read.read_plan(ReadPlan(options, options.slice_range, None)))
    with pytest.raises(Exception, match="SchemaNotInitialized"):
        _reader(spark, pg_dsn, "public_missing_schema", entityType=ENTITY).collect()

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"postgresql://someone:s3cret-pw@127.0.0.1:{port}/nothing"
    options = parse_options({"dsn": dsn, "entityType": ENTITY})
    with pytest.raises(ConnectionFailed) as info:
        next(arrow_read.read_plan(ReadPlan(options, options.slice_range, None)))
    assert "s3cret-pw" not in str(info.value)


@pytest.mark.timeout(60)
async def test_a_blind_durable_state_streams_detector_sees_every_write_and_only_writes(
    journal: Journal, pg_dsn: str
) -> None:
    """Without a horizon reading a stream finds late writes by a value of the window below
    its offset (`sql.window_count`). For durable state, where an upsert moves the id's row,
    it is the sum of revisions at or after the window's start: an update (of a row below
    the offset too), a deletion and a new id each raise it; nothing else changes it."""
    store = DurableStateStore(journal)
    for i in range(3):
        await store.upsert(f"{ENTITY}|w{i}", {"n": 1}, revision=1)
    options = parse_options(
        {"dsn": pg_dsn, "schema": journal.settings.schema, "entityType": ENTITY,
         "read": "durableState"}
    )  # fmt: skip
    below = await journal.database_time()  # the stream's offset: every row is below it

    async def detector() -> int:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            cur = await conn.execute(*window_count(options, below, timedelta(hours=1)))
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    seen = [await detector()]
    assert seen[0] == await detector()  # quiet: unchanged
    await store.upsert(f"{ENTITY}|w0", {"n": 2}, revision=2)  # a row moves up
    seen.append(await detector())
    await store.delete(f"{ENTITY}|w1", revision=2)
    seen.append(await detector())
    await store.upsert(f"{ENTITY}|w9", {"n": 1}, revision=1)  # a new id
    seen.append(await detector())
    await store.upsert("Other|x", {"n": 1}, revision=1)  # another entity type
    seen.append(await detector())
    assert seen[0] < seen[1] < seen[2] < seen[3] == seen[4], seen

"""A driver program of the cluster tests: what a user runs against a cluster or a
Spark Connect server (`spark_session()` picks it from `MASTER` / `SPARK_REMOTE`).

Run as a script (`python spark_cluster_job.py PHASE...`, copied out of the
tree), never imported: its handlers are functions of `__main__`, which
cloudpickle ships by value, so the executors — a Python with only the
installed wheel — need nothing of this tree. Each phase prints one JSON line
(`{"phase": ..., ...}`) for the test, which checks the database itself.

Environment: `DSN`, `SCHEMA` (the journal's, already created and filled),
`ENTITY` (the entity type written), `WORK` (a directory for checkpoints and
the marker files of the worker-kill test).

Phases:
- `probe`: where the executors' Python and its packages come from.
- `batch`: the source's rows per Spark partition (slice range).
- `project`: `project` with `availableNow` into `SCHEMA.applied` (primary key
  `(pid, seq_nr)`: applying an event twice fails the batch). While
  `WORK/arm` exists, the first partition that gets here writes its pid to
  `WORK/claimed` and sleeps mid-transaction, for the test to kill its worker.
- `stream`: `project` with a processing-time trigger and 3 s leases, renewed
  by the driver, into `SCHEMA.streamed`, while this program appends
  `STREAM_EVENTS` more events.
- `rebuild`: `rebuild` of `SCHEMA.totals` (events per pid).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

from psycopg import Connection, sql
from pyspark.sql import functions as F

from journal import EventEnvelope, JournalSettings, SyncJournal
from projections import RecordingTelemetry
from projections.spark import project, rebuild, spark_session

DSN, SCHEMA, ENTITY, WORK = (os.environ[k] for k in ("DSN", "SCHEMA", "ENTITY", "WORK"))
SETTINGS = JournalSettings(schema=SCHEMA)
STREAM_EVENTS = 200


def emit(phase: str, **result: Any) -> None:
    print(json.dumps({"phase": phase, **result}, default=str), flush=True)


def where_am_i() -> str:
    """Runs on an executor: its interpreter, and where pyspark and journal come from."""
    import pyspark

    import journal

    return json.dumps({
        "python": sys.executable, "pyspark": pyspark.__file__, "journal": journal.__file__,
        "path": sys.path, "pythonpath": os.environ.get("PYTHONPATH", ""),
    })  # fmt: skip


def probe(spark: Any) -> None:
    where = F.udf(where_am_i)
    rows = spark.range(0, 8, 1, 4).select(where().alias("w")).distinct().collect()
    emit("probe", executors=[json.loads(r.w) for r in rows])


def source(spark: Any) -> Any:
    return (
        spark.read.format("slicejournal")
        .option("dsn", DSN).option("schema", SCHEMA).option("entityType", ENTITY)
        .option("numPartitions", "4").load()
    )  # fmt: skip


def batch(spark: Any) -> None:
    df = source(spark).select(F.spark_partition_id().alias("part"), "slice", "persistence_id",
                              "seq_nr")  # fmt: skip
    parts = df.groupBy("part").agg(
        F.min("slice").alias("lo"), F.max("slice").alias("hi"), F.count(F.lit(1)).alias("n")
    )
    rows = sorted((r.part, r.lo, r.hi, r.n) for r in parts.collect())
    distinct = df.select("persistence_id", "seq_nr").distinct().count()
    emit("batch", partitions=rows, distinct=distinct)


def record(
    table: sql.Identifier,
    armed: str,
    claimed: str,
    conn: Connection[Any],
    envs: list[EventEnvelope],
) -> None:
    """The projection's handler: one row per event (a primary key: never twice)."""
    conn.cursor().executemany(
        sql.SQL("INSERT INTO {} (pid, seq_nr) VALUES (%s, %s)").format(table),
        [(e.persistence_id, e.seq_nr) for e in envs],
    )
    if not os.path.exists(armed):
        return
    try:
        fd = os.open(claimed, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:  # another partition is the one to die; or this is the retry
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    time.sleep(600)  # the transaction stays open: its writes are in, its offsets not


def handler(table: str) -> Any:
    armed, claimed = os.path.join(WORK, "arm"), os.path.join(WORK, "claimed")
    return functools.partial(record, sql.Identifier(SCHEMA, table), armed, claimed)


def run_project(spark: Any) -> None:
    query = project(
        spark, dsn=DSN, name="cluster-applied", entity_type=ENTITY, handler=handler("applied"),
        checkpoint_location=os.path.join(WORK, "checkpoint-project"), settings=SETTINGS,
        trigger={"availableNow": True}, num_partitions=4,
    )  # fmt: skip
    query.awaitTermination()
    emit("project", exception=query.exception(), batches=len(query.recentProgress))


def stream(spark: Any) -> None:
    telemetry = RecordingTelemetry()
    query = project(
        spark, dsn=DSN, name="cluster-stream", entity_type=ENTITY, handler=handler("streamed"),
        checkpoint_location=os.path.join(WORK, "checkpoint-stream"), settings=SETTINGS,
        trigger={"processingTime": "1 second"}, num_partitions=2,
        lease_ttl=timedelta(seconds=3), telemetry=telemetry,
    )  # fmt: skip
    with SyncJournal.connect(DSN, SETTINGS) as journal:
        for i in range(STREAM_EVENTS):  # over ~10 s: more than three lease TTLs
            pid = f"{ENTITY}|stream-{i % 10}"
            journal.append(pid, [{"n": i}], expected_seq_nr=journal.highest_seq_nr(pid))
            time.sleep(0.05)
        total = count(journal, "SELECT count(*) FROM {}", journal.settings.journal_table)
        deadline = time.monotonic() + 150
        while count(journal, "SELECT count(*) FROM {}", "streamed") < total:
            if not query.isActive or time.monotonic() > deadline:
                break
            time.sleep(1)
        applied = count(journal, "SELECT count(*) FROM {}", "streamed")
    active, exception = query.isActive, query.exception()
    query.stop()
    time.sleep(2)  # the telemetry watcher notices the end
    reported = [c.name for c in telemetry.calls]
    emit("stream", journal=total, applied=applied, active=active, exception=exception,
         telemetry=sorted(set(reported)), rows_reported=telemetry.total("batch_ended"))  # fmt: skip


def count(journal: SyncJournal, statement: str, table: str) -> int:
    with journal.pool.connection() as conn:
        row = conn.execute(sql.SQL(statement).format(sql.Identifier(SCHEMA, table))).fetchone()
    assert row is not None
    return int(row[0])


def totals(conn: Connection[Any], envs: list[EventEnvelope]) -> None:
    conn.cursor().executemany(
        "INSERT INTO totals (pid, events) VALUES (%s, 1) "
        "ON CONFLICT (pid) DO UPDATE SET events = totals.events + 1",
        [(e.persistence_id,) for e in envs],
    )


def run_rebuild(spark: Any) -> None:
    result = rebuild(
        spark, dsn=DSN, name="cluster-totals", entity_type=ENTITY, handler=totals,
        read_models=[f"{SCHEMA}.totals"], settings=SETTINGS, num_partitions=4,
    )  # fmt: skip
    emit("rebuild", events=result.events, tables=result.read_models)


PHASES = {
    "probe": probe,
    "batch": batch,
    "project": run_project,
    "stream": stream,
    "rebuild": run_rebuild,
}

if __name__ == "__main__":
    session = spark_session("slicejournal-cluster-tests")
    for name in sys.argv[1:]:
        PHASES[name](session)
    # A Connect server may log the plan of the last operation released as the session
    # closes, options and all: let that be one without a DSN.
    session.range(1).count()
    session.stop()

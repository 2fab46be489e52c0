"""Spark: the peak memory of the Python worker that reads one partition, by partition size.

    .venv/bin/python benchmarks/spark_memory.py [--dsn DSN] [--events 1000000,3000000,10000000]

For each size, `N` events (10,000 ids over all 1024 slices, JSON payloads, as
`benchmarks/spark.py` inserts them) go into a fresh schema and are read back
by the `slicejournal` source with `numPartitions=1` — the whole journal in one
partition, one task — forced with Spark's `noop` sink in a local[1] session.
While the read runs, the resident set size (RSS) of every Python process under
Spark's JVM (`pyspark.daemon` and the workers it forks) is sampled every 20 ms;
the table shows the largest, its value before the read (the worker as the
previous read left it) and the read's throughput. Goal: the peak does not grow
with the partition, since a partition streams in record batches of about
`arrow_read.BATCH_BYTES`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import threading
import time
from typing import Any

import psutil  # type: ignore[import-untyped]  # the `embedded` extra's, in the dev venv
import psycopg
from _common import (
    add_dsn_argument,
    bulk_insert_events,
    database,
    drop_schema,
    fresh_schema,
    print_environment,
    print_table,
    run,
)

from journal import Journal, JournalSettings

ENTITY = "Bench"
PIDS = 10_000
MIB = 1024 * 1024


class PeakRss:
    """Samples the RSS of the Python processes under a JVM in a thread, keeping the peak."""

    def __init__(self, jvm_pid: int, interval: float = 0.02) -> None:
        self._jvm = psutil.Process(jvm_pid)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.peak = 0

    def current(self) -> int:
        """The largest RSS among the JVM's Python descendants now (0 if there are none)."""
        largest = 0
        for child in self._jvm.children(recursive=True):
            try:
                if "python" in child.name().lower():
                    largest = max(largest, child.memory_info().rss)
            except psutil.NoSuchProcess:
                continue
        return largest

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current())
            self._stop.wait(self._interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current())


def read_once(spark: Any, dsn: str, schema: str) -> tuple[float, int, int]:
    """(seconds, RSS before, peak RSS) of one full read in one partition."""
    df = (
        spark.read.format("slicejournal").option("dsn", dsn).option("schema", schema)
        .option("entityType", ENTITY).option("numPartitions", "1").load()
    )  # fmt: skip
    sampler = PeakRss(spark.sparkContext._gateway.proc.pid)
    before = sampler.current()
    start = time.perf_counter()
    with sampler:
        df.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - start
    return seconds, before, sampler.peak


async def fill(dsn: str, schema: str, events: int) -> int:
    """A new journal in `schema` with `events` events; returns how many were inserted."""
    async with (
        Journal.connect(dsn, JournalSettings(schema=schema), create_schema=True) as journal,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        return await bulk_insert_events(
            conn, journal.tables.journal, entity_type=ENTITY, pids=PIDS,
            events_per_pid=max(1, events // PIDS), span_seconds=3600,
        )  # fmt: skip


async def main_async(args: argparse.Namespace, dsn: str | None) -> int:
    from projections.spark import local_session

    sizes = [int(s) for s in args.events.split(",")]
    with database(dsn) as db:
        await print_environment(db)
        spark = await asyncio.to_thread(
            functools.partial(local_session, "slicejournal-memory", cores=1)
        )
        print(f"spark:    PySpark {spark.version}, local[1], numPartitions=1")
        rows = []
        try:
            # A first small read starts the Python worker, so every size meets a warm one.
            for events in [PIDS, *sizes]:
                schema = fresh_schema("sparkmem")
                try:
                    inserted = await fill(db.dsn, schema, events)
                    seconds, before, peak = await asyncio.to_thread(
                        read_once, spark, db.dsn, schema
                    )
                finally:
                    await drop_schema(db.dsn, schema)
                if events == PIDS and events not in sizes:
                    continue
                rows.append(
                    [f"{inserted:,}", f"{before / MIB:,.0f}", f"{peak / MIB:,.0f}",
                     f"{inserted / seconds:,.0f}"]
                )  # fmt: skip
                print(f"  {inserted:,} events: peak {peak / MIB:,.0f} MiB", flush=True)
        finally:
            await asyncio.to_thread(spark.stop)
    print()
    print_table(["partition events", "worker RSS before MiB", "peak RSS MiB", "events/s"], rows)
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_dsn_argument(parser)
    parser.add_argument(
        "--events", default="1000000,3000000,10000000", help="sizes, comma-separated"
    )
    args = parser.parse_args(argv)
    return args, args


if __name__ == "__main__":
    sys.exit(run(parse_args(), main_async))

"""Retention's cost: batched, projection-aware deletes against one plain DELETE.

    .venv/bin/python benchmarks/retention.py [--dsn DSN] [--events 1000000]
        [--pids 10000] [--delete-fraction 0.9] [--batch-size 1000] [--rate 100]

For each variant a fresh schema gets `--events` events set-based
(`bulk_insert_events`: `--pids` ids spread over all 1024 slices, gap-free
seq_nrs, db_timestamps spread evenly over the 1000 s before now, then
`VACUUM ANALYZE`); retention then deletes the oldest `--delete-fraction` of
them (keep = the newest rest of the span), while one writer appends single
events to 100 other ids of the entity type at `--rate` per second:

- baseline: one statement, `DELETE FROM event_journal WHERE entity_type = ..
  AND db_timestamp < cutoff` (no markers, no projection check, one long
  transaction holding every deleted row's lock until it commits);
- retention: `Retention.apply(RetentionPolicy(entity_type, keep=...))` with
  `--batch-size` (slice by slice, one short transaction per batch, a deletion
  marker per id, the projections' offsets checked: one projection over every
  slice, caught up, so every event counts as consumed).

Printed: seconds and events deleted per second of each, the ratio retention /
baseline, and the writer's append latency (p50, p99, max) during each delete
and during a quiet phase before it (same schema, same rate).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg
from _common import (
    add_dsn_argument,
    bulk_insert_events,
    database,
    drop_schema,
    fresh_schema,
    latency_cells,
    print_environment,
    print_table,
    run,
)
from psycopg import sql

from journal import Journal, JournalSettings
from projections import ProjectionSettings, Retention, RetentionPolicy, RetentionSettings
from projections.aio.offset_dao import OffsetDao
from projections.offset_store import PROGRESS_PID, PROGRESS_SEQ_NR, Record
from projections.tables import ProjectionTables

ENTITY = "Bench"
SPAN_SECONDS = 1000.0


async def appender(j: Journal, rate: float, stop: asyncio.Event, out: list[float]) -> None:
    """Single-event appends to 100 ids of the entity type at a steady rate."""
    pids = [f"{ENTITY}|writer-{i}" for i in range(100)]
    seq: dict[str, int] = {}
    for p in pids:
        seq[p] = await j.highest_seq_nr(p)
    i = 0
    while not stop.is_set():
        p = pids[i % len(pids)]
        i += 1
        began = time.perf_counter()
        await j.append(p, [{"amount": 1}], expected_seq_nr=seq[p])
        out.append(time.perf_counter() - began)
        seq[p] += 1
        await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - began)))


async def while_appending(j: Journal, rate: float, work: Any) -> tuple[Any, float, list[float]]:
    """Run `work` (a coroutine) with the appender beside it: its result, its seconds and
    the append latencies meanwhile."""
    stop, latencies = asyncio.Event(), list[float]()
    task = asyncio.create_task(appender(j, rate, stop, latencies))
    began = time.perf_counter()
    result = await work
    seconds = time.perf_counter() - began
    stop.set()
    await task
    return result, seconds, latencies


async def one_variant(dsn: str, args: argparse.Namespace, variant: str) -> list[Any]:
    schema = fresh_schema("bench_retention")
    settings = JournalSettings(schema=schema)
    try:
        async with Journal.connect(dsn, settings, create_schema=True) as j:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                per_pid = max(1, args.events // args.pids)
                inserted = await bulk_insert_events(
                    conn, j.tables.journal, entity_type=ENTITY, pids=args.pids,
                    events_per_pid=per_pid, span_seconds=SPAN_SECONDS,
                )  # fmt: skip
                # A projection over every slice, caught up: a progress marker per slice,
                # and (as its offset store keeps them) a row per event of its time window.
                cur = await conn.execute("SELECT now()")
                now = (await cur.fetchone() or (None,))[0]
                markers = [Record(s, PROGRESS_PID, PROGRESS_SEQ_NR, now) for s in range(1024)]
                await OffsetDao(ProjectionTables(j.tables), "caught-up").save(
                    conn, "0-1023", markers
                )
                await conn.execute(
                    sql.SQL(
                        "INSERT INTO {o} SELECT 'caught-up', '0-1023', slice, persistence_id, "
                        "seq_nr, db_timestamp, now() FROM {j} WHERE db_timestamp > %s"
                    ).format(o=ProjectionTables(j.tables).offset_store, j=j.tables.journal),
                    (now - ProjectionSettings().time_window,),
                )
            _, _, quiet = await while_appending(j, args.rate, asyncio.sleep(5))
            keep = timedelta(seconds=SPAN_SECONDS * (1 - args.delete_fraction))
            if variant == "baseline":
                statement = sql.SQL(
                    "DELETE FROM {} WHERE entity_type = %s AND db_timestamp < now() - %s"
                ).format(j.tables.journal)

                async def delete() -> int:
                    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                        cur = await c.execute(statement, (ENTITY, keep))
                        return cur.rowcount

                deleted, seconds, during = await while_appending(j, args.rate, delete())
            else:
                retention = Retention(j, RetentionSettings(batch_size=args.batch_size))
                policy = RetentionPolicy(ENTITY, keep=keep)
                report, seconds, during = await while_appending(
                    j, args.rate, retention.apply(policy)
                )
                deleted = report.events
            print(f"  {variant}: {inserted} events inserted, {deleted} deleted in "
                  f"{seconds:.1f} s", flush=True)  # fmt: skip
            return [variant, deleted, seconds, quiet, during]
    finally:
        await drop_schema(dsn, schema)


async def main_async(args: argparse.Namespace, dsn_arg: str | None) -> int:
    with database(dsn_arg) as db:
        await print_environment(db)
        print(f"{args.events} events over {args.pids} ids; delete {args.delete_fraction:.0%}; "
              f"batch {args.batch_size}; appender {args.rate}/s", flush=True)  # fmt: skip
        results = [await one_variant(db.dsn, args, v) for v in ("baseline", "retention")]
    rows = []
    for variant, deleted, seconds, quiet, during in results:
        rows.append([variant, str(deleted), f"{seconds:.1f}", f"{deleted / seconds:,.0f}",
                     *latency_cells(quiet), *latency_cells(during)])  # fmt: skip
    heads = ["variant", "deleted", "seconds", "events/s", "quiet p50", "p90", "p99", "max",
             "during p50", "p90", "p99", "max"]  # fmt: skip
    print_table(heads, rows)
    base, ours = results
    print(f"retention / baseline time: {ours[2] / base[2]:.2f}x")
    return 0


def parse_args() -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dsn_argument(parser)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--pids", type=int, default=10_000)
    parser.add_argument("--delete-fraction", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    return args, args


if __name__ == "__main__":
    sys.exit(run(parse_args(), main_async))

"""A new projection over long-lived ids: started from snapshots against a full replay.

    .venv/bin/python benchmarks/snapshots.py [--dsn DSN] [--ids 10000] [--events-per-id 40]
                                             [--snapshot-at 35] [--rounds 3]

`--ids` ids (random entity ids, so spread over all 1024 slices) with
`--events-per-id` events each (`{"amount": n, "note": "deposit"}`, JSON) are
inserted set-based over the last 5 minutes, then each id's snapshot at seq_nr
`--snapshot-at` (its state: `{"total": <sum of the amounts up to there>}`, computed
by PostgreSQL from the events) as `Journal.save_snapshot` stores it (db_timestamp
that of the event it was taken at), then `VACUUM ANALYZE`. Each round catches up
a fresh projection (a new name, no stored offsets) with 4 grouped exactly-once
instances run until caught up, concurrently; the handler folds a total per id in
memory (a snapshot replaces it, an event adds its amount):

- full replay: `Projection.grouped(...)`: every event is shipped and folded;
- from snapshots: `Projection.grouped(..., from_snapshots=True)`: each id's
  snapshot and the events after it (`Journal.events_by_slices_from_snapshots`).

Printed per variant: the best round's seconds, the rows the server shipped to the
handlers (events + snapshots), and the share of the full replay's time and rows.
Both read models are compared with each other and with the totals PostgreSQL
computes from every event: they must be equal.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

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
from psycopg import sql

from journal import EventEnvelope, Journal, JournalSettings, slice_ranges
from journal.aio.migrate import migrate
from projections import Projection, ProjectionSettings

ENTITY_TYPE = "Bench"
INSTANCES = 4
FULL = "full replay"
SNAPSHOTS = "from snapshots"

# Each id's snapshot at seq_nr %(at)s: the sum of its amounts up to there, placed at
# that event's db_timestamp (what `Journal.save_snapshot` stores).
_SNAPSHOTS = """
INSERT INTO {snapshot} (slice, entity_type, persistence_id, seq_nr, db_timestamp,
                        write_timestamp, ser_id, ser_manifest, snapshot)
SELECT e.slice, e.entity_type, e.persistence_id, e.seq_nr, e.db_timestamp,
       (extract(epoch FROM now()) * 1000)::bigint, 31, '',
       convert_to('{{"total":' || t.total || '}}', 'UTF8')
FROM {journal} AS e
JOIN (SELECT persistence_id,
             sum((convert_from(event_payload, 'UTF8')::jsonb ->> 'amount')::bigint) AS total
      FROM {journal} WHERE seq_nr <= %(at)s GROUP BY persistence_id) AS t
  ON t.persistence_id = e.persistence_id
WHERE e.seq_nr = %(at)s
"""
_TOTALS = """
SELECT persistence_id, sum((convert_from(event_payload, 'UTF8')::jsonb ->> 'amount')::bigint)
FROM {journal} GROUP BY persistence_id
"""


@dataclass(frozen=True)
class Config:
    ids: int
    events_per_id: int
    snapshot_at: int
    rounds: int


async def catch_up(
    journal: Journal, name: str, *, from_snapshots: bool
) -> tuple[float, int, dict[str, int]]:
    totals: dict[str, int] = {}
    shipped = 0

    async def handler(conn: Any, envs: list[EventEnvelope]) -> None:
        nonlocal shipped
        shipped += len(envs)
        for env in envs:
            if env.from_snapshot:
                totals[env.persistence_id] = env.event["total"]
            else:
                pid = env.persistence_id
                totals[pid] = totals.get(pid, 0) + env.event["amount"]

    projections = [
        Projection.grouped(
            journal, name=name, entity_type=ENTITY_TYPE, slice_range=r, handler=handler,
            settings=ProjectionSettings(group_after_envelopes=200),
            from_snapshots=from_snapshots,
        )
        for r in slice_ranges(INSTANCES)
    ]  # fmt: skip
    started = time.perf_counter()
    await asyncio.gather(*(p.run(until_caught_up=True) for p in projections))
    return time.perf_counter() - started, shipped, totals


async def main_async(config: Config, dsn_arg: str | None) -> int:
    with database(dsn_arg) as db:
        await print_environment(db)
        schema = fresh_schema("bench_snapshots")
        settings = JournalSettings(schema=schema)
        journal_table = sql.Identifier(schema, settings.journal_table)
        snapshot_table = sql.Identifier(schema, settings.snapshot_table)
        try:
            async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as conn:
                await migrate(conn, settings)
                events = await bulk_insert_events(
                    conn, journal_table, entity_type=ENTITY_TYPE, pids=config.ids,
                    events_per_pid=config.events_per_id, span_seconds=300,
                )  # fmt: skip
                await conn.execute(
                    sql.SQL(_SNAPSHOTS).format(snapshot=snapshot_table, journal=journal_table),
                    {"at": config.snapshot_at},
                )
                await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(snapshot_table))
                cur = await conn.execute(sql.SQL(_TOTALS).format(journal=journal_table))
                expected = {pid: int(total) for pid, total in await cur.fetchall()}
            print(
                f"  {events:,} events of {config.ids:,} ids, a snapshot of each at seq_nr "
                f"{config.snapshot_at} of {config.events_per_id}",
                flush=True,
            )
            times: dict[str, list[float]] = {FULL: [], SNAPSHOTS: []}
            shipped: dict[str, int] = {}
            async with Journal.connect(db.dsn, settings) as journal:
                for i in range(config.rounds):
                    order = [FULL, SNAPSHOTS] if i % 2 == 0 else [SNAPSHOTS, FULL]
                    for variant in order:
                        seconds, rows, totals = await catch_up(
                            journal, f"v{len(shipped)}-{i}-{variant[:4]}",
                            from_snapshots=variant == SNAPSHOTS,
                        )  # fmt: skip
                        if totals != expected:
                            wrong = sum(1 for p in expected if totals.get(p) != expected[p])
                            print(f"{variant}: {wrong} ids with a wrong total")
                            return 1
                        times[variant].append(seconds)
                        shipped[variant] = rows
                        print(f"  round {i + 1}  {variant:<15} {seconds:.2f} s  "
                              f"({rows:,} rows shipped)", flush=True)  # fmt: skip
        finally:
            await drop_schema(db.dsn, schema)
        full, snap = min(times[FULL]), min(times[SNAPSHOTS])
        print_table(
            ["variant", "best s", "rows shipped", "time / full", "rows / full"],
            [
                [FULL, f"{full:.2f}", f"{shipped[FULL]:,}", "1.00", "1.00"],
                [SNAPSHOTS, f"{snap:.2f}", f"{shipped[SNAPSHOTS]:,}", f"{snap / full:.2f}",
                 f"{shipped[SNAPSHOTS] / shipped[FULL]:.2f}"],
            ],
        )  # fmt: skip
        print("the two read models are equal, and equal to the totals of every event")
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_dsn_argument(parser)
    parser.add_argument("--ids", type=int, default=10_000, help="persistence ids (10000)")
    parser.add_argument("--events-per-id", type=int, default=40, help="events per id (40)")
    parser.add_argument("--snapshot-at", type=int, default=35, help="snapshot seq_nr (35)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant (3)")
    args = parser.parse_args(argv)
    per_id = max(1, args.events_per_id)
    return args, Config(
        max(1, args.ids), per_id, min(per_id, max(1, args.snapshot_at)), max(1, args.rounds)
    )


if __name__ == "__main__":
    sys.exit(run(parse_args(), main_async))

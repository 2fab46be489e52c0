"""A projection over one event type in ten, filtered by PostgreSQL, against an unfiltered one.

    .venv/bin/python benchmarks/filters.py [--dsn DSN] [--events 100000] [--rounds 3]

`--events` events (5,000 ids over all 1024 slices, JSON payloads) are inserted
set-based, each tagged with one of ten tags (`t0` .. `t9`, by seq_nr), then
`VACUUM ANALYZE`. Each round catches up a fresh projection (a new name, so no
stored offsets) over the whole journal with 4 grouped exactly-once instances
run until caught up, concurrently, with a handler that only counts:

- unfiltered: every event is read, shipped, decoded and handed to the handler;
- filtered: `EventFilter(tags=("t3",))`: PostgreSQL selects the other nine in ten
  as keys only (no payload, never decoded); their offsets are stored, the
  handler never sees them.

Variants alternate (the order flips each round); the best round of each is
compared. Printed: seconds to catch up, events handed to handlers, and the
filtered run's time as a share of the unfiltered one; the handler counts are
checked (filtered = the tag's events exactly).
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
    database,
    drop_schema,
    fresh_schema,
    insert_catch_up_events,
    print_environment,
    print_table,
    run,
)
from psycopg import sql

from journal import EventEnvelope, EventFilter, Journal, JournalSettings, slice_ranges
from projections import Projection, ProjectionSettings

ENTITY_TYPE = "Bench"
PIDS = 5_000
INSTANCES = 4
TAG = "t3"


@dataclass(frozen=True)
class Config:
    events: int
    rounds: int


async def catch_up(
    journal: Journal, name: str, event_filter: EventFilter | None
) -> tuple[float, int]:
    handled = 0

    async def handler(conn: Any, envs: list[EventEnvelope]) -> None:
        nonlocal handled
        handled += len(envs)

    projections = [
        Projection.grouped(
            journal, name=name, entity_type=ENTITY_TYPE, slice_range=r, handler=handler,
            settings=ProjectionSettings(group_after_envelopes=200), filter=event_filter,
        )
        for r in slice_ranges(INSTANCES)
    ]  # fmt: skip
    started = time.perf_counter()
    await asyncio.gather(*(p.run(until_caught_up=True) for p in projections))
    return time.perf_counter() - started, handled


async def main_async(config: Config, dsn_arg: str | None) -> int:
    with database(dsn_arg) as db:
        await print_environment(db)
        schema = fresh_schema("bench_filters")
        settings = JournalSettings(schema=schema)
        try:
            async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as conn:
                total = await insert_catch_up_events(
                    conn, settings, entity_type=ENTITY_TYPE, pids=PIDS, events=config.events,
                    span_seconds=240,
                )  # fmt: skip
                journal_table = sql.Identifier(schema, settings.journal_table)
                await conn.execute(
                    sql.SQL("UPDATE {} SET tags = ARRAY['t' || (seq_nr % 10)]").format(
                        journal_table
                    )
                )
                await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(journal_table))
                cur = await conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE tags && ARRAY[%s]").format(
                        journal_table
                    ),
                    (TAG,),
                )
                row = await cur.fetchone()
                tagged = int(row[0]) if row else 0
            times: dict[str, list[float]] = {"unfiltered": [], "filtered": []}
            async with Journal.connect(db.dsn, settings) as journal:
                for i in range(config.rounds):
                    order = ["unfiltered", "filtered"]
                    if i % 2:
                        order.reverse()
                    for variant in order:
                        event_filter = EventFilter(tags=(TAG,)) if variant == "filtered" else None
                        seconds, handled = await catch_up(journal, f"{variant}-{i}", event_filter)
                        expected = tagged if event_filter else total
                        if handled != expected:
                            print(f"{variant}: handled {handled}, expected {expected}")
                            return 1
                        times[variant].append(seconds)
                        print(f"  round {i + 1}  {variant:<10}  {seconds:.2f} s  "
                              f"({total / seconds:,.0f} events/s read, {handled:,} handled)",
                              flush=True)  # fmt: skip
        finally:
            await drop_schema(db.dsn, schema)
        # The fastest round of each: on a shared machine noise only slows a run down.
        unfiltered, filtered = min(times["unfiltered"]), min(times["filtered"])
        print_table(
            ["variant", "best s", "events/s (journal)", "handed to handler"],
            [
                ["unfiltered", f"{unfiltered:.2f}", f"{total / unfiltered:,.0f}", f"{total:,}"],
                ["filtered", f"{filtered:.2f}", f"{total / filtered:,.0f}", f"{tagged:,}"],
            ],
        )
        print(f"filtered / unfiltered time: {filtered / unfiltered:.2f} "
              f"(one tag in ten; the other nine read as keys only)")  # fmt: skip
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_dsn_argument(parser)
    parser.add_argument("--events", type=int, default=100_000, help="events (100000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant (3)")
    args = parser.parse_args(argv)
    return args, Config(max(PIDS, args.events), max(1, args.rounds))


if __name__ == "__main__":
    sys.exit(run(parse_args(), main_async))

"""Slice queries: catch-up throughput against raw psycopg, and live latency.

    .venv/bin/python benchmarks/query.py [--dsn DSN] [--events 200000] [--rounds 6]
                                         [--live-seconds 15] [--rate 200] [--quick]

Catch-up: `--events` events (5,000 persistence ids with random entity ids, so
spread over all 1024 slices; gap-free seq_nrs; payload `{"amount": n, "note":
"deposit"}` as JSON, serializer 31, manifest '') are inserted set-based with
db_timestamps spread evenly over the 5 minutes before now, then `VACUUM ANALYZE`.
The four ranges of `slice_ranges(4)` are read **one after the other** (sequentially)
by each variant, and the rate is all events / total time:

- raw: one psycopg `AsyncConnection` (autocommit, session time zone UTC), per range
  `SELECT <the journal's 13 envelope columns>, transaction_timestamp() FROM
  event_journal WHERE entity_type = .. AND slice BETWEEN .. ORDER BY db_timestamp,
  seq_nr`, every row fetched (`fetchall`); the payload is NOT decoded.
- raw+json: the same, plus `json.loads` of every payload.
- batched: psycopg used well, the floor of any reader of these rows: per range
  the same statement through a server-side cursor in a transaction,
  `fetchmany(2000)`, results in the binary format, `orjson.loads` of every
  payload.
- journal: `Journal.current_events_by_slices` with default `QuerySettings`
  (buffer_size 1000), every envelope consumed and its `event` (the decoded
  dict) read.

"us/event" is the cost of one event; journal - batched is what the library
itself spends per event over psycopg's batched fetch + decode of the same rows
(goal <= 1 us, i.e. journal/batched >= 0.65).

Variants are interleaved (the order rotates each round) because the 2-core
machine is shared and noisy; the best run of each is compared. Goal:
journal / raw >= 0.7.

Live: a writer appends single events to random ones of 1,000 ids at a steady
`--rate` for `--live-seconds`, while one `events_by_slices` stream over slices
0..1023 (default settings: horizon margin 5 ms, refresh_interval 3 s) runs
in the same process. Latency = monotonic time from `append` returning to the
envelope arriving from the stream, matched by (pid, seq_nr); backtracking
re-deliveries are ignored; the first second is warm-up. Four journals, each in a
fresh schema: notifications on (defaults), horizon off (the defaults without the
visibility horizon: Pekko's rule of staying behind_current_time behind the clock,
the baseline), query notifications off (`QuerySettings(notifications=False)`) and
`JournalSettings(notify=False)`. Goal: p99 <= 50 ms with notifications on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from _common import (
    Config,
    Live,
    best,
    checkpoint,
    database,
    drop_schema,
    format_ms,
    format_rate,
    format_ratio,
    fresh_schema,
    insert_catch_up_events,
    latency_cells,
    measure_live,
    parse_live_args,
    percentile,
    print_environment,
    print_table,
    run,
    slice_select,
    spread,
)

from journal import (
    HorizonSettings,
    Journal,
    JournalSettings,
    QuerySettings,
    SliceRange,
    slice_ranges,
)
from journal.tables import Tables

ENTITY_TYPE = "Bench"
PIDS = 5_000
SPAN_SECONDS = 300.0
RANGES = 4
PAYLOAD_COLUMN = 12  # event_payload in envelope_columns()
CATCH_UP_GOAL = 0.7
LIVE_PIDS = 1_000
LIVE_WARMUP = 1.0
LIVE_DRAIN = 8.0  # after the writer stops, wait this long at most for the last envelopes
LATENCY_GOAL = 0.050

RAW = "raw"
RAW_JSON = "raw+json"
BATCHED = "batched"
JOURNAL = "journal"
CATCH_UP_VARIANTS = (RAW, RAW_JSON, BATCHED, JOURNAL)
BATCH = 2000  # fetchmany size of the batched baseline
LIBRARY_COST_GOAL = 1.0  # us per event over the batched baseline


# -- catch-up ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    events: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.events / self.seconds


async def run_raw(
    conn: psycopg.AsyncConnection[Any], tables: Tables, ranges: list[SliceRange], *, decode: bool
) -> tuple[Run, list[int]]:
    statement = slice_select(tables)
    counts = []
    start = time.perf_counter()
    for r in ranges:
        cur = await conn.execute(statement, (ENTITY_TYPE, r.min_slice, r.max_slice))
        rows = await cur.fetchall()
        if decode:
            for row in rows:
                json.loads(row[PAYLOAD_COLUMN])
        counts.append(len(rows))
    return Run(sum(counts), time.perf_counter() - start), counts


async def run_batched(
    conn: psycopg.AsyncConnection[Any], tables: Tables, ranges: list[SliceRange]
) -> tuple[Run, list[int]]:
    """The floor: server-side cursor, fetchmany, binary results, orjson per payload."""
    statement = slice_select(tables)
    counts = []
    start = time.perf_counter()
    for r in ranges:
        n = 0
        async with conn.transaction(), conn.cursor(name="bench_batched", binary=True) as cur:
            await cur.execute(statement, (ENTITY_TYPE, r.min_slice, r.max_slice))
            while rows := await cur.fetchmany(BATCH):
                for row in rows:
                    orjson.loads(row[PAYLOAD_COLUMN])
                n += len(rows)
        counts.append(n)
    return Run(sum(counts), time.perf_counter() - start), counts


async def run_journal(journal: Journal, ranges: list[SliceRange]) -> tuple[Run, list[int]]:
    counts = []
    start = time.perf_counter()
    for r in ranges:
        n = 0
        async for env in journal.current_events_by_slices(ENTITY_TYPE, r.min_slice, r.max_slice):
            event = env.event  # what a consumer reads
            if n == 0 and not isinstance(event, dict):
                raise RuntimeError(f"payload not decoded: {env!r}")
            n += 1
        counts.append(n)
    return Run(sum(counts), time.perf_counter() - start), counts


async def catch_up(dsn: str, config: Config) -> dict[str, list[Run]]:
    schema = fresh_schema("bench_query")
    settings = JournalSettings(schema=schema)
    tables = Tables(settings)
    ranges = slice_ranges(RANGES)
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            # The baselines' session in UTC, as the journal's read sessions are: psycopg
            # converts each timestamptz it reads into the session's zone, which costs
            # about 0.3 us a value for a named zone (such as a server's 'Etc/UTC').
            await conn.execute("SET TimeZone TO 'UTC'")
            total = await insert_catch_up_events(
                conn,
                settings,
                entity_type=ENTITY_TYPE,
                pids=PIDS,
                events=config.events,
                span_seconds=SPAN_SECONDS,
            )
            # Warm the cache (and check the data) with one untimed raw pass.
            _, expected = await run_raw(conn, tables, ranges, decode=False)
            print(f"  events per range: {', '.join(f'{n:,}' for n in expected)}", flush=True)
            if sum(expected) != total:
                raise RuntimeError(f"{sum(expected)} rows in the ranges, {total} inserted")
            async with Journal.connect(dsn, settings) as journal:
                results: dict[str, list[Run]] = {v: [] for v in CATCH_UP_VARIANTS}
                for round_ in range(config.rounds):
                    shift = round_ % len(CATCH_UP_VARIANTS)
                    order = CATCH_UP_VARIANTS[shift:] + CATCH_UP_VARIANTS[:shift]
                    for variant in order:
                        await checkpoint(dsn)
                        if variant == JOURNAL:
                            run, counts = await run_journal(journal, ranges)
                        elif variant == BATCHED:
                            run, counts = await run_batched(conn, tables, ranges)
                        else:
                            run, counts = await run_raw(
                                conn, tables, ranges, decode=variant == RAW_JSON
                            )
                        if counts != expected:
                            raise RuntimeError(f"{variant}: read {counts}, expected {expected}")
                        results[variant].append(run)
                        print(
                            f"  round {round_ + 1}  {variant:<9}{format_rate(run.per_second):>10} "
                            f"events/s  ({run.seconds:.2f} s)",
                            flush=True,
                        )
        return results
    finally:
        await drop_schema(dsn, schema)


def print_catch_up(results: dict[str, list[Run]]) -> tuple[float, float]:
    """The table; returns journal/raw and the library's own us/event over batched."""
    rates = {v: [r.per_second for r in runs] for v, runs in results.items()}
    journal = best(rates[JOURNAL])
    rows = []
    for variant in CATCH_UP_VARIANTS:
        b = best(rates[variant])
        rows.append(
            [
                variant,
                format_rate(b),
                f"{1e6 / b:.1f}",
                format_ratio(journal / b),
                f"{spread(rates[variant]):.0%}",
            ]
        )
    print_table(["variant", "best events/s", "us/event", "journal/this", "spread"], rows)
    paired = [
        j.per_second / r.per_second for j, r in zip(results[JOURNAL], results[RAW], strict=True)
    ]
    print(f"per round journal/raw: {', '.join(map(format_ratio, paired))}")
    return journal / best(rates[RAW]), 1e6 / journal - 1e6 / best(rates[BATCHED])


# -- live latency ---------------------------------------------------------------------------


LIVE_VARIANTS: dict[str, Callable[[str], JournalSettings]] = {
    "notifications on": lambda schema: JournalSettings(schema=schema),
    # The same, staying behind_current_time behind the clock (Pekko's rule): the
    # baseline of the visibility horizon, measured in the same run.
    "horizon off": lambda schema: JournalSettings(
        schema=schema, query=QuerySettings(horizon=HorizonSettings(enabled=False))
    ),
    "query notifications off": lambda schema: JournalSettings(
        schema=schema, query=QuerySettings(notifications=False)
    ),
    "notify=False": lambda schema: JournalSettings(schema=schema, notify=False),
}


async def run_live(dsn: str, name: str, config: Config) -> Live:
    schema = fresh_schema("bench_live")
    settings = LIVE_VARIANTS[name](schema)
    try:
        async with Journal.connect(dsn, settings, create_schema=True) as journal:
            await checkpoint(dsn)
            live = await measure_live(
                journal,
                ENTITY_TYPE,
                rate=config.rate,
                seconds=config.live_seconds,
                pids=LIVE_PIDS,
                warmup=LIVE_WARMUP,
                drain=LIVE_DRAIN,
            )
        return live
    finally:
        await drop_schema(dsn, schema)


def live_row(name: str, live: Live) -> list[str]:
    lat = live.latencies()
    return [
        name,
        f"{len(live.appended):,}",
        f"{len(lat):,}",
        str(live.missing()),
        *latency_cells(lat),
        str(live.backtracking),
    ]


# -- driver ------------------------------------------------------------------------------------


async def main_async(config: Config, dsn_arg: str | None) -> int:
    started = time.perf_counter()
    with database(dsn_arg) as db:
        await print_environment(db)
        print()
        print(
            f"== catch-up: current_events_by_slices over slice_ranges({RANGES}), ranges read "
            f"sequentially; {config.rounds} interleaved round(s), best run shown",
            flush=True,
        )
        results = await catch_up(db.dsn, config)
        print()
        ratio, own = print_catch_up(results)
        print(
            f"raw: fetchall of the same 14 columns, payload not decoded; raw+json: plus "
            f"json.loads per row; batched: server-side cursor, fetchmany({BATCH}), binary, "
            f"orjson.loads per row.\ngoal journal/raw >= {CATCH_UP_GOAL}: "
            f"{'met' if ratio >= CATCH_UP_GOAL else 'NOT met'} ({format_ratio(ratio)})\n"
            f"library's own cost (journal - batched): {own:.2f} us/event, goal <= "
            f"{LIBRARY_COST_GOAL:g}: {'met' if own <= LIBRARY_COST_GOAL else 'NOT met'}"
        )
        print()
        print(
            f"== live: {config.rate:g} single-event appends/s to random ones of {LIVE_PIDS:,} "
            f"ids for {config.live_seconds:g} s, one events_by_slices(0..1023) stream; "
            f"latency = append returned -> envelope arrived (first {LIVE_WARMUP:g} s excluded)",
            flush=True,
        )
        lives = {}
        for name in LIVE_VARIANTS:
            lives[name] = await run_live(db.dsn, name, config)
            lat = lives[name].latencies()
            print(
                f"  {name:<24} p50 {format_ms(percentile(lat, 50))}, "
                f"p99 {format_ms(percentile(lat, 99))}",
                flush=True,
            )
    print()
    print_table(
        ["variant", "appended", "measured", "missing", "p50", "p90", "p99", "max", "backtrack"],
        [live_row(name, live) for name, live in lives.items()],
    )
    p99 = percentile(lives["notifications on"].latencies(), 99)
    print(
        "missing: appended events never delivered (should be 0); backtrack: backtracking "
        "envelopes ignored."
    )
    print(
        f"goal p99 <= {format_ms(LATENCY_GOAL)} with notifications on: "
        f"{'met' if p99 <= LATENCY_GOAL else 'NOT met'} ({format_ms(p99)}); "
        f"total time {time.perf_counter() - started:.0f} s"
    )
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    return parse_live_args(
        __doc__,
        events=200_000,
        rounds=6,
        live_seconds_help="writer duration per live variant (15)",
        quick_events=20_000,
        quick_help="smoke test: 20k events, 1 round, 4 s live runs",
        min_events=PIDS,
        live_warmup=LIVE_WARMUP,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(run(parse_args(), main_async))

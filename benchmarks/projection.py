"""Grouped exactly-once projections: catch-up throughput against raw psycopg, and live lag.

    .venv/bin/python benchmarks/projection.py [--dsn DSN] [--events 100000] [--rounds 3]
                                              [--live-seconds 15] [--rate 200] [--quick]

Catch-up: `--events` events (5,000 persistence ids with random entity ids, spread
over all 1024 slices; payload `{"amount": n, "note": "deposit"}` as JSON) are
inserted set-based with db_timestamps spread over the 4 minutes before now (less
than the offset store's 5-minute time window), then `VACUUM ANALYZE`. Both
variants write one row (pid, seq_nr, slice, db_timestamp, amount) per event into
a fresh table with PRIMARY KEY (pid, seq_nr), with a **single statement per
batch**: `INSERT ... SELECT * FROM unnest(<5 arrays>)`; `amount` comes from the
decoded payload.

- raw: for each of the 4 ranges of `slice_ranges(4)` concurrently (one event
  loop), a psycopg connection runs the ordered `SELECT <the journal's envelope
  columns> ... WHERE entity_type = .. AND slice BETWEEN .. ORDER BY db_timestamp,
  seq_nr` (fetchall), and a second one inserts the rows in batches of 20, one
  transaction (`conn.transaction()`) per batch, `json.loads` per payload.
- raw+offsets: raw, and in each batch's transaction a second INSERT of the batch's
  offset rows (one per event, into the offset table, as an exactly-once projection
  stores them): the floor of an exactly-once projection, psycopg alone.
- projection: a `ProjectionGroup` of 4 `Projection.grouped` instances
  (`group_after_envelopes=20`, other settings default) whose handler runs that
  INSERT in the runner's transaction (which also stores the offsets). Timed from
  `group.start()` until all rows are committed: the handlers' counter reaching
  the total, then `count(*)` of the table polled every 5 ms until it matches.

Variants are interleaved (raw, projection; then reversed), each run on a fresh
target table with the offset store truncated; the best run of each is compared.
Goal: projection / raw >= 0.5.

Live lag: the same projection group runs over an empty journal while a writer
appends single events to random ones of 1,000 ids at a steady `--rate` for
`--live-seconds` (same process). Per event, from `append` returning:
- handed: the handler received the batch holding the event;
- handled: the handler's INSERT returned (end of the handler);
- committed: the runner's transaction committed. The handler's last statement is
  `pg_notify(<channel>, <batch id>)`; PostgreSQL delivers it only at commit, so
  its arrival at a separate LISTEN connection is the commit time (an upper bound
  by the delivery time, well under a millisecond on a local server).
Read your writes, in the same run: a request loop beside the writer appends one
event to an id of its own, calls `ProjectionManagement.wait_for` for it and
records append -> wait_for returned, one request after another (woken by the
NOTIFY the instance sends after committing offsets).
The first second is warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from _common import (
    Config,
    best,
    checkpoint,
    count_rows,
    database,
    drop_schema,
    format_rate,
    format_ratio,
    fresh_schema,
    insert_catch_up_events,
    latency_cells,
    parse_live_args,
    print_environment,
    print_table,
    run,
    slice_select,
    spread,
    write_steadily,
)
from psycopg import AsyncConnection, sql

from journal import EventEnvelope, Journal, JournalSettings, SliceRange, slice_ranges
from journal.tables import Tables
from projections import Projection, ProjectionGroup, ProjectionManagement, ProjectionSettings
from projections.tables import ProjectionTables

ENTITY_TYPE = "Bench"
PIDS = 5_000
SPAN_SECONDS = 240.0
INSTANCES = 4
GROUP = 20
GOAL = 0.5
LIVE_PIDS = 1_000
LIVE_WARMUP = 1.0
LIVE_DRAIN = 10.0
POLL = 0.005
COLUMN = {"pid": 0, "slice": 2, "seq_nr": 3, "db_timestamp": 4, "ser_id": 7, "payload": 12}

RAW = "raw"
RAW_OFFSETS = "raw+offsets"
PROJECTION = "projection"
VARIANTS = (RAW, RAW_OFFSETS, PROJECTION)
OFFSETS_NAME = "bench-raw-offsets"  # the raw+offsets variant's rows in the offset table


@dataclass(frozen=True)
class Run:
    events: int
    seconds: float
    transactions: int
    duplicates: int = 0  # envelopes the offset store dropped (backtracking re-deliveries)

    @property
    def per_second(self) -> float:
        return self.events / self.seconds


# -- the read model ------------------------------------------------------------------------


async def create_target(dsn: str, table: sql.Identifier) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (pid text NOT NULL, seq_nr bigint NOT NULL, slice int NOT NULL, "
                "db_timestamp timestamptz NOT NULL, amount bigint NOT NULL, "
                "PRIMARY KEY (pid, seq_nr))"
            ).format(table)
        )


def insert_statement(table: sql.Identifier) -> sql.Composed:
    """One statement per batch: the rows travel as five arrays."""
    return sql.SQL(
        "INSERT INTO {} (pid, seq_nr, slice, db_timestamp, amount) "
        "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::int[], %s::timestamptz[], "
        "%s::bigint[])"
    ).format(table)


def envelope_params(envs: list[EventEnvelope]) -> tuple[list[Any], ...]:
    return (
        [e.persistence_id for e in envs],
        [e.seq_nr for e in envs],
        [e.slice for e in envs],
        [e.db_timestamp for e in envs],
        [e.event["amount"] for e in envs],
    )


def row_params(rows: list[Any]) -> tuple[list[Any], ...]:
    c = COLUMN
    return (
        [r[c["pid"]] for r in rows],
        [r[c["seq_nr"]] for r in rows],
        [r[c["slice"]] for r in rows],
        [r[c["db_timestamp"]] for r in rows],
        [json.loads(r[c["payload"]])["amount"] for r in rows],
    )


# -- catch-up: raw ---------------------------------------------------------------------------


def offsets_statement(table: sql.Identifier) -> sql.Composed:
    """The raw+offsets variant's second statement per batch: one offset row per event,
    as an exactly-once projection stores them (the offset table's columns and keys)."""
    return sql.SQL(
        "INSERT INTO {} (projection_name, projection_key, slice, persistence_id, seq_nr, "
        "timestamp_offset, timestamp_consumed) "
        "SELECT %s, %s, s, p, n, t, transaction_timestamp() "
        "FROM unnest(%s::int[], %s::text[], %s::bigint[], %s::timestamptz[]) AS u(s, p, n, t)"
    ).format(table)


async def run_raw(
    dsn: str, tables: Tables, target: sql.Identifier, expected: int, *, offsets: bool = False
) -> Run:
    """Read each range, insert its rows in batches of GROUP, a transaction each; with
    `offsets`, each transaction also inserts the batch's offset rows (the floor of an
    exactly-once projection: its two statements, without the library)."""
    select = slice_select(tables)
    insert = insert_statement(target)
    store = offsets_statement(ProjectionTables(tables).offset_store)
    ranges = slice_ranges(INSTANCES)
    readers = [await AsyncConnection.connect(dsn, autocommit=True) for _ in ranges]
    writers = [await AsyncConnection.connect(dsn, autocommit=True) for _ in ranges]
    transactions = 0

    async def one_range(r: SliceRange, reader: AsyncConnection[Any], writer: Any) -> int:
        nonlocal transactions
        cur = await reader.execute(select, (ENTITY_TYPE, r.min_slice, r.max_slice))
        rows = await cur.fetchall()
        for i in range(0, len(rows), GROUP):
            async with writer.transaction():
                params = row_params(rows[i : i + GROUP])
                await writer.execute(insert, params)
                if offsets:
                    key = f"{r.min_slice}-{r.max_slice}"
                    pids, seq_nrs, slices, stamps, _ = params
                    await writer.execute(store, (OFFSETS_NAME, key, slices, pids, seq_nrs, stamps))
            transactions += 1
        return len(rows)

    try:
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(one_range(r, rd, wr) for r, rd, wr in zip(ranges, readers, writers, strict=True))
        )
        seconds = time.perf_counter() - start
        stored = await count_rows(readers[0], target)
    finally:
        for conn in readers + writers:
            await conn.close()
    if sum(counts) != expected or stored != expected:
        raise RuntimeError(f"raw: read {sum(counts)}, stored {stored}, expected {expected}")
    return Run(expected, seconds, transactions)


# -- catch-up: projection ----------------------------------------------------------------------


class Applied:
    """Counts events the handlers were given; `all_handed` is set once every one was."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.handed = 0
        self.all_handed = asyncio.Event()

    def add(self, n: int) -> None:
        self.handed += n
        if self.handed >= self.expected:
            self.all_handed.set()


def grouped_factory(
    journal: Journal,
    name: str,
    handler: Callable[[AsyncConnection[Any], list[EventEnvelope]], Awaitable[None]],
) -> Callable[[SliceRange], Projection]:
    settings = ProjectionSettings(group_after_envelopes=GROUP)

    def factory(r: SliceRange) -> Projection:
        return Projection.grouped(
            journal,
            name=name,
            entity_type=ENTITY_TYPE,
            slice_range=r,
            handler=handler,
            settings=settings,
        )

    return factory


async def wait_or_fail(group: ProjectionGroup, event: asyncio.Event, within: float) -> None:
    """Wait for `event`, raising if an instance of `group` fails or `within` seconds pass."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not event.is_set():
        failure = group.failed()
        if failure is not None:
            raise failure
        if loop.time() > deadline:
            raise TimeoutError("the projection did not finish in time")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), 0.5)


async def run_projection(journal: Journal, name: str, target: sql.Identifier, expected: int) -> Run:
    insert = insert_statement(target)
    applied = Applied(expected)

    async def handler(conn: AsyncConnection[Any], envs: list[EventEnvelope]) -> None:
        await conn.execute(insert, envelope_params(envs))
        applied.add(len(envs))

    group = ProjectionGroup(grouped_factory(journal, name, handler), INSTANCES)
    async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as poller:
        start = time.perf_counter()
        await group.start()
        try:
            await wait_or_fail(group, applied.all_handed, within=600)
            while True:  # every event was handed over: wait for the last batches to commit
                if await count_rows(poller, target) >= expected:
                    break
                await asyncio.sleep(POLL)
            seconds = time.perf_counter() - start
        finally:
            await group.stop()
        stored = await count_rows(poller, target)
    stats = group.stats()
    accepted = sum(s.accepted for s in stats)
    if stored != expected or accepted != expected:
        raise RuntimeError(f"projection: accepted {accepted}, stored {stored}, expected {expected}")
    return Run(
        expected,
        seconds,
        sum(s.transactions for s in stats),
        sum(s.duplicates for s in stats),
    )


async def catch_up(dsn: str, config: Config) -> dict[str, list[Run]]:
    schema = fresh_schema("bench_proj")
    settings = JournalSettings(schema=schema)
    tables = Tables(settings)
    target = sql.Identifier(schema, "applied")
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            total = await insert_catch_up_events(
                conn,
                settings,
                entity_type=ENTITY_TYPE,
                pids=PIDS,
                events=config.events,
                span_seconds=SPAN_SECONDS,
            )
        results: dict[str, list[Run]] = {v: [] for v in VARIANTS}
        async with Journal.connect(dsn, settings) as journal:
            for round_ in range(config.rounds):
                order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    await create_target(dsn, target)
                    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                        offsets = ProjectionTables(tables).offset_store
                        await c.execute(sql.SQL("TRUNCATE {}").format(offsets))
                    await checkpoint(dsn)
                    if variant in (RAW, RAW_OFFSETS):
                        run = await run_raw(
                            dsn, tables, target, total, offsets=variant == RAW_OFFSETS
                        )
                    else:
                        name = f"bench-{round_}"
                        run = await run_projection(journal, name, target, total)
                    results[variant].append(run)
                    print(
                        f"  round {round_ + 1}  {variant:<11}{format_rate(run.per_second):>9} "
                        f"events/s  ({run.seconds:.2f} s, {run.transactions:,} transactions, "
                        f"{run.duplicates:,} duplicates dropped)",
                        flush=True,
                    )
        return results
    finally:
        await drop_schema(dsn, schema)


def print_catch_up(results: dict[str, list[Run]]) -> float:
    rates = {v: [r.per_second for r in runs] for v, runs in results.items()}
    raw = best(rates[RAW])
    rows = []
    for variant in VARIANTS:
        b = best(rates[variant])
        runs = results[variant]
        rows.append(
            [
                variant,
                format_rate(b),
                f"{1e6 / b:.0f}",
                format_ratio(b / raw),
                f"{max(r.transactions for r in runs):,}",
                f"{spread(rates[variant]):.0%}",
            ]
        )
    headers = ["variant", "best events/s", "us/event", "this/raw", "transactions", "spread"]
    print_table(headers, rows)
    paired = [
        p.per_second / r.per_second for p, r in zip(results[PROJECTION], results[RAW], strict=True)
    ]
    print(f"per round projection/raw: {', '.join(map(format_ratio, paired))}")
    floor = best(rates[RAW_OFFSETS])
    print(
        f"the exactly-once floor: raw+offsets/raw {format_ratio(floor / raw)}; "
        f"projection/(raw+offsets) {format_ratio(best(rates[PROJECTION]) / floor)}"
    )
    return best(rates[PROJECTION]) / raw


# -- live lag ------------------------------------------------------------------------------------


@dataclass
class Lag:
    appended: dict[tuple[str, int], float] = field(default_factory=dict)
    handed: dict[tuple[str, int], float] = field(default_factory=dict)
    handled: dict[tuple[str, int], float] = field(default_factory=dict)
    committed: dict[tuple[str, int], float] = field(default_factory=dict)
    batches: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    batch_sizes: list[int] = field(default_factory=list)
    # Read your writes: append -> `ProjectionManagement.wait_for` returned, per request.
    waited: list[float] = field(default_factory=list)
    measured_from: float = 0.0
    writer_done: bool = False
    complete: asyncio.Event = field(default_factory=asyncio.Event)

    def on_appended(self, key: tuple[str, int], now: float) -> None:
        self.appended[key] = now

    def on_commit(self, batch: str, now: float) -> None:
        for key in self.batches.pop(batch, ()):
            self.committed.setdefault(key, now)
        self.check_complete()

    def check_complete(self) -> None:
        if self.writer_done and all(k in self.committed for k in self.appended):
            self.complete.set()

    def since_append(self, times: dict[tuple[str, int], float]) -> list[float]:
        return [
            times[key] - t
            for key, t in self.appended.items()
            if t >= self.measured_from and key in times
        ]

    def missing(self) -> int:
        return sum(key not in self.committed for key in self.appended)


async def listen(dsn: str, channel: str, lag: Lag, ready: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        ready.set()
        async for notify in conn.notifies():
            lag.on_commit(notify.payload, loop.time())


async def run_live(dsn: str, config: Config) -> Lag:
    schema = fresh_schema("bench_lag")
    settings = JournalSettings(schema=schema)
    target = sql.Identifier(schema, "applied")
    channel = f"{schema}_commits"
    lag = Lag()
    loop = asyncio.get_running_loop()
    batch_ids = itertools.count()
    try:
        async with Journal.connect(dsn, settings, create_schema=True) as journal:
            await create_target(dsn, target)
            insert = insert_statement(target)

            async def handler(conn: AsyncConnection[Any], envs: list[EventEnvelope]) -> None:
                handed = loop.time()
                await conn.execute(insert, envelope_params(envs))
                handled = loop.time()
                batch = str(next(batch_ids))
                keys = [(e.persistence_id, e.seq_nr) for e in envs]
                lag.batches[batch] = keys
                lag.batch_sizes.append(len(envs))
                for key in keys:
                    lag.handed.setdefault(key, handed)
                    lag.handled.setdefault(key, handled)
                await conn.execute("SELECT pg_notify(%s, %s)", (channel, batch))

            ready = asyncio.Event()
            listener = asyncio.create_task(listen(dsn, channel, lag, ready), name="listener")
            await ready.wait()
            await checkpoint(dsn)
            group = ProjectionGroup(grouped_factory(journal, "bench-lag", handler), INSTANCES)
            await group.start()
            try:
                await asyncio.sleep(1.0)  # streams idle, notification listener connected
                requests = asyncio.create_task(read_your_writes(journal, lag), name="requests")
                await write_steadily(
                    journal,
                    lag,
                    config.rate,
                    config.live_seconds,
                    entity_type=ENTITY_TYPE,
                    pids=LIVE_PIDS,
                    warmup=LIVE_WARMUP,
                )
                await requests
                with contextlib.suppress(TimeoutError):
                    await wait_or_fail(group, lag.complete, within=LIVE_DRAIN)
            finally:
                await group.stop()
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
        return lag
    finally:
        await drop_schema(dsn, schema)


async def read_your_writes(journal: Journal, lag: Lag) -> None:
    """A web request's pattern beside the steady writer: append one event, then
    `wait_for` the projection to have handled it; one request after another."""
    management = ProjectionManagement(journal)
    loop = asyncio.get_running_loop()
    await asyncio.sleep(LIVE_WARMUP)
    seq = 0
    while not lag.writer_done:
        envelopes = await journal.append(
            f"{ENTITY_TYPE}|request", [{"amount": 1, "note": "request"}], expected_seq_nr=seq
        )
        seq += 1
        began = loop.time()
        await management.wait_for("bench-lag", envelopes, timeout=30)
        lag.waited.append(loop.time() - began)
        await asyncio.sleep(0.02)


def print_live(lag: Lag) -> None:
    rows = []
    for label, times in (
        ("handed to handler", lag.handed),
        ("handler done", lag.handled),
        ("committed", lag.committed),
    ):
        values = lag.since_append(times)
        rows.append([f"append -> {label}", f"{len(values):,}", *latency_cells(values)])
    waited = lag.waited
    rows.append(["append -> wait_for returned", f"{len(waited):,}", *latency_cells(waited)])
    print_table(["lag", "events", "p50", "p90", "p99", "max"], rows)
    sizes = lag.batch_sizes
    print(
        f"appended {len(lag.appended):,}, never committed {lag.missing()}; "
        f"{len(sizes):,} batches, mean size {sum(sizes) / max(1, len(sizes)):.1f}, "
        f"full ({GROUP}) {sum(s >= GROUP for s in sizes)}"
    )


# -- driver ------------------------------------------------------------------------------------


async def main_async(config: Config, dsn_arg: str | None) -> int:
    started = time.perf_counter()
    with database(dsn_arg) as db:
        await print_environment(db)
        print()
        print(
            f"== catch-up: {INSTANCES} grouped exactly-once instances (group_after_envelopes="
            f"{GROUP}) vs raw SELECT + INSERT in batches of {GROUP} per transaction, "
            f"{INSTANCES} ranges concurrently; {config.rounds} interleaved round(s), best shown",
            flush=True,
        )
        results = await catch_up(db.dsn, config)
        print()
        ratio = print_catch_up(results)
        print(
            f"all: one INSERT ... SELECT * FROM unnest(5 arrays) per batch of <= {GROUP} rows; "
            "raw+offsets and projection also one INSERT of the batch's offset rows.\n"
            f"goal projection/raw >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'} "
            f"({format_ratio(ratio)})"
        )
        print()
        print(
            f"== live lag: {config.rate:g} single-event appends/s to random ones of "
            f"{LIVE_PIDS:,} ids for {config.live_seconds:g} s while the {INSTANCES} grouped "
            f"instances run (default settings; first {LIVE_WARMUP:g} s excluded)",
            flush=True,
        )
        lag = await run_live(db.dsn, config)
    print()
    print_live(lag)
    print(f"total time {time.perf_counter() - started:.0f} s")
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    return parse_live_args(
        __doc__,
        events=100_000,
        rounds=3,
        live_seconds_help="writer duration of the live run (15)",
        quick_events=10_000,
        quick_help="smoke test: 10k events, 1 round, 4 s live run",
        min_events=PIDS,
        live_warmup=LIVE_WARMUP,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(run(parse_args(), main_async))

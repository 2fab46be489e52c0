"""Scale: append, catch-up and live latency stay flat as the journal grows (1M -> 10M events).

    .venv/bin/python benchmarks/scale.py [--dsn DSN] [--sizes 1000000,10000000] [--seconds 5]
                                         [--rounds 2] [--live-seconds 10] [--rate 200]
                                         [--projection-seconds 180] [--plans]
                                         [--plans-file /tmp/scale_plans.md] [--keep] [--quick]

One journal in a fresh schema (the library's DDL: the primary key on
(persistence_id, seq_nr) and the slice index on (slice, entity_type,
db_timestamp, seq_nr), nothing added) is filled with COPY (binary, in chunks of
500,000 rows, indexes in place) to the first of `--sizes`, measured, filled on
to the next size, measured again, and so on.

The fill is one history, continued by every size: 20 entity types (Order holds
half of the ids, the other 19 share the rest), events one every 250 ms (10M
events = 29 days, ending a minute before the run started), each going to a
random one of the first max(1,000, n / 20) ids (so new entities keep appearing
and ~20 events per id on average), random entity ids spread over all 1024
slices, gap-free seq_nrs per id in time order, payloads the library's JSON
serializer output for small dicts (`{"amount": .., "currency": "EUR", "note":
.., "ref": ..}`, serializer 31, manifest ''), tags NULL (as `append` stores
none), writer `bench-scale-fill`. After each fill: VACUUM ANALYZE, CHECKPOINT.

Measured at each size (all events written by a measurement are deleted again
before the next fill, so every size continues the same history):

- plans: `EXPLAIN (ANALYZE, BUFFERS)` of the statements the slice query runs,
  built by the library's own state machine and SQL builders (`BySliceQuery`,
  `journal.query.sql`): catch-up (bucket counts, then the first rows query) of
  the range below, the first bucket count of a catch-up of that range from the
  start, a live query at the tail of Account over slices 0..1023 (its bucket
  counts, then rows), and an `append` (rolled back). Statements the
  reader runs with `conn.execute` are prepared by psycopg after 5 runs and then
  usually planned generically by PostgreSQL, so their generic plans are shown
  too (`plan_cache_mode = force_generic_plan`); the live run reports how many
  generic and custom plans its read connection used. Written to `--plans-file`;
  `--plans` prints them too, a summary line each is always shown.
- catch-up: `current_events_by_slices` of one slice range (`slice_ranges(8)[0]`,
  one worker's share) of Order from the offset of its K-th newest event, every
  envelope decoded; K = 80% of that range's events at the first size (at most
  100,000), the same K at every size, so only the table around it grows.
  `--rounds` + 1 runs, best shown. Then once the whole range from the start
  (10x the events at 10M; shown for information, it has no goal).
- append: `Journal.append` of single events by 1 and by 8 concurrent writers
  (each rotating over 25 ids from the fill and 25 new ones), 1 s warm-up and
  `--seconds` measured, `--rounds` interleaved runs, best shown.
- live latency: a writer appends single events to random ones of 1,000 Account
  ids at `--rate` for `--live-seconds`, while one `events_by_slices(Account,
  0..1023)` stream, started at the database time, runs in the same process;
  latency = append returned -> envelope arrived (first second excluded), p50/p99.
- offset table: a `Projection.exactly_once` (slices 0..1023 of Cart, started at
  the database time with `ProjectionManagement.set_offset`, a handler that only
  counts) runs for `--projection-seconds` while Cart ids get `--rate` appends/s;
  the offset table's rows, `pg_total_relation_size`, dead tuples and autovacuum
  runs are sampled every 2 s. To see cleanup at work in a short run, its time
  window is 20 s (at most a third of the run; cleanup every quarter of that,
  backtracking window half of it), so rows are bounded by about rate x
  (time_window + cleanup_interval) plus a progress marker per slice; with the
  defaults (5 min, 30 s) the bound is rate x 330 s. The size also counts dead
  tuples until autovacuum (every minute at most) reclaims them.

Goal: value at the largest size / value at the smallest >= 0.9 for append and
catch-up throughput, and p99(smallest) / p99(largest) >= 0.9 for live latency.
`--quick`: sizes 20,000 and 200,000, short runs (under 2 minutes). The schema is
dropped at the end unless `--keep`. The machine is shared and noisy: repeated
runs and best-of are the defence; latency is the noisiest figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    Live,
    Operation,
    add_dsn_argument,
    best,
    checkpoint,
    command_line,
    database,
    drop_schema,
    format_ms,
    format_rate,
    format_ratio,
    fresh_schema,
    measure,
    measure_live,
    percentile,
    print_environment,
    print_table,
    race,
    run,
    write_steadily,
)
from psycopg import sql

from journal import (
    BacktrackingSettings,
    EventEnvelope,
    Journal,
    JournalSettings,
    QuerySettings,
    SerializedPayload,
    SerializerRegistry,
    SliceRange,
    TimestampOffset,
    slice_for,
    slice_ranges,
)
from journal.aio.migrate import migrate
from journal.query import sql as q
from journal.query.by_slice import BucketsQuery, BySliceQuery, HorizonQuery, RowsQuery
from journal.query.horizon import READER_APPLICATION, horizon_from_row
from journal.tables import Tables
from journal.writer import WriterSql, prepare_append
from projections import Projection, ProjectionManagement, ProjectionSettings
from projections.tables import ProjectionTables

ENTITY_TYPES = (
    "Order", "Account", "Cart", "Customer", "Invoice", "Payment", "Shipment", "Product",
    "Inventory", "Review", "Coupon", "Refund", "Session", "Ticket", "Subscription",
    "Wallet", "Transfer", "Device", "Message", "Booking",
)  # fmt: skip
MAIN_TYPE = ENTITY_TYPES[0]  # half of all ids; its catch-up is measured
LIVE_TYPE = ENTITY_TYPES[1]  # the live-latency stream's
PROJECTED_TYPE = ENTITY_TYPES[2]  # the offset-table projection's
MAIN_SHARE = 0.5
EVENTS_PER_ID = 20
MIN_IDS = 1_000
STEP_US = 250_000  # between consecutive fill events
END_MARGIN = timedelta(minutes=1)  # the largest fill ends this long before the run started
PAYLOADS = 1_000  # distinct payloads, used in turn
COPY_CHUNK = 500_000
FILL_WRITER = "bench-scale-fill"
MEASURE_WRITER = "bench-scale"
COPY_COLUMNS = (
    ("slice", "int4"),
    ("entity_type", "varchar"),
    ("persistence_id", "varchar"),
    ("seq_nr", "int8"),
    ("db_timestamp", "timestamptz"),
    ("writer", "varchar"),
    ("event_ser_id", "int4"),
    ("event_ser_manifest", "varchar"),
    ("event_payload", "bytea"),
    ("deleted", "bool"),
)
CATCH_UP_RANGE = slice_ranges(8)[0]
CATCH_UP_SHARE = 0.8
CATCH_UP_MAX = 100_000
WRITERS = (1, 8)
IDS_PER_WRITER = 50  # half from the fill, half new
LIVE_PIDS = 1_000
LIVE_WARMUP = 1.0
LIVE_DRAIN = 8.0  # after the writer stops, wait this long at most for the last envelopes
SAMPLE_EVERY = 2.0
PROJECTION = "scale-offsets"
PROJECTION_WINDOW = 20.0  # its offset store's time window (s), at most a third of the run
GOAL = 0.9
BYTES_RESERVE = 2 << 30  # WAL and slack on top of the estimated table growth


# -- the fill ----------------------------------------------------------------------------------


class History:
    """The fill's events in time order, continued by every size (see the module docstring)."""

    def __init__(self, first: datetime, serializers: SerializerRegistry) -> None:
        self.first = first  # db_timestamp of event 0
        self.events = 0  # events generated so far
        self._rng = random.Random(11)
        self.names: list[str] = []
        self.slices: list[int] = []
        self.seq_nrs: list[int] = []
        self.payloads = [_payload(serializers, n) for n in range(PAYLOADS)]

    def _add_ids(self, count: int) -> None:
        rng = self._rng
        for _ in range(count - len(self.names)):
            if rng.random() < MAIN_SHARE:
                entity_type = MAIN_TYPE
            else:
                entity_type = ENTITY_TYPES[1 + rng.randrange(len(ENTITY_TYPES) - 1)]
            name = f"{entity_type}|{rng.getrandbits(64):016x}"
            self.names.append(name)
            self.slices.append(slice_for(name))
            self.seq_nrs.append(0)

    def rows(self, count: int) -> Iterator[tuple[Any, ...]]:
        """The next `count` events as COPY rows (`COPY_COLUMNS` order)."""
        rng, names, slices, seq_nrs = self._rng, self.names, self.slices, self.seq_nrs
        payloads = self.payloads
        for i in range(self.events, self.events + count):
            ids = max(MIN_IDS, i // EVENTS_PER_ID + 1)
            if ids > len(names):
                self._add_ids(ids)
            k = rng.randrange(ids)
            seq_nrs[k] += 1
            name = names[k]
            payload = payloads[i % PAYLOADS]
            yield (
                slices[k],
                name[: name.index("|")],
                name,
                seq_nrs[k],
                self.first + timedelta(microseconds=i * STEP_US),
                FILL_WRITER,
                payload.serializer_id,
                payload.manifest,
                payload.payload,
                False,
            )
        self.events += count

    def existing_ids(self, count: int, seed: int) -> list[tuple[str, int]]:
        """`count` random ids of the fill with their highest seq_nr."""
        picks = random.Random(seed).sample(range(len(self.names)), count)
        return [(self.names[k], self.seq_nrs[k]) for k in picks]


def _payload(serializers: SerializerRegistry, n: int) -> SerializedPayload:
    rng = random.Random(n)
    event = {
        "amount": rng.randrange(1, 100_000),
        "currency": "EUR",
        "note": rng.choice(("deposit", "withdrawal", "transfer", "refund")),
        "ref": f"{rng.getrandbits(48):012x}",
    }
    return serializers.serialize(event)


@dataclass(frozen=True)
class Fill:
    events: int
    seconds: float
    vacuum_seconds: float


async def fill(
    conn: psycopg.AsyncConnection[Any], tables: Tables, history: History, size: int
) -> Fill:
    """COPY the history on to `size` events (chunks of COPY_CHUNK), then VACUUM ANALYZE."""
    added = size - history.events
    copy = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        tables.journal, sql.SQL(", ").join(sql.Identifier(c) for c, _ in COPY_COLUMNS)
    )
    types = [t for _, t in COPY_COLUMNS]
    started = time.perf_counter()
    reported = started
    while history.events < size:
        n = min(COPY_CHUNK, size - history.events)
        async with conn.cursor() as cur, cur.copy(copy) as writer:
            writer.set_types(types)
            for row in history.rows(n):
                await writer.write_row(row)
        if time.perf_counter() - reported >= 30 and history.events < size:
            reported = time.perf_counter()
            print(
                f"  copied {history.events:,} of {size:,} ({reported - started:.0f} s)",
                flush=True,
            )
    copied = time.perf_counter() - started
    await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(tables.journal))
    return Fill(added, copied, time.perf_counter() - started - copied)


@dataclass(frozen=True)
class Sizes:
    heap: int
    indexes: dict[str, int]
    total: int
    database: int


async def table_sizes(conn: psycopg.AsyncConnection[Any], tables: Tables) -> Sizes:
    name = tables.journal.as_string(conn)
    cur = await conn.execute(
        "SELECT pg_relation_size(%(t)s::regclass), pg_total_relation_size(%(t)s::regclass), "
        "pg_database_size(current_database())",
        {"t": name},
    )
    heap, total, db = await _one(cur)
    cur = await conn.execute(
        "SELECT c.relname, pg_relation_size(i.indexrelid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass ORDER BY 1",
        (name,),
    )
    return Sizes(heap, {str(n): int(s) for n, s in await cur.fetchall()}, total, db)


def format_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit in ("B", "kB") else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def sizes_line(s: Sizes) -> str:
    indexes = ", ".join(f"{n} {format_bytes(b)}" for n, b in s.indexes.items())
    return (
        f"table {format_bytes(s.heap)} + indexes ({indexes}) = {format_bytes(s.total)}; "
        f"database {format_bytes(s.database)}"
    )


def check_disk(db_embedded: bool, s: Sizes, events: int, target: int) -> None:
    """Refuse to grow an embedded server's journal past the free space of its disk."""
    need = s.total / events * (target - events) + BYTES_RESERVE
    where = tempfile.gettempdir()
    free = shutil.disk_usage(where).free
    print(
        f"  disk: {format_bytes(free)} free in {where}; {target:,} events need about "
        f"{format_bytes(need)} more (at {s.total / events:.0f} B/event, plus WAL)",
        flush=True,
    )
    if db_embedded and free < need:
        raise SystemExit(f"not enough disk space in {where} for {target:,} events")


async def remove_measurement_rows(conn: psycopg.AsyncConnection[Any], tables: Tables) -> int:
    """Delete every event the measurements wrote, and the projection's offsets."""
    cur = await conn.execute(
        sql.SQL("DELETE FROM {} WHERE writer <> %s").format(tables.journal), (FILL_WRITER,)
    )
    await conn.execute(sql.SQL("TRUNCATE {}").format(ProjectionTables(tables).offset_store))
    return cur.rowcount


# -- plans -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    title: str
    statement: str
    params: Any
    text: str

    def _first(self, pattern: str) -> str | None:
        m = re.search(pattern, self.text)
        return m.group(1) if m else None

    @property
    def execution_ms(self) -> float:
        return float(self._first(r"Execution Time: ([\d.]+) ms") or "nan")

    @property
    def buffers(self) -> int:
        """Shared buffers (hit + read) of the top node: the work done, cached or not."""
        line = self._first(r"(?m)^\s*Buffers: (.*)$") or ""
        shared = line.split(",")[0] if line.startswith("shared") else ""
        return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", shared))

    @property
    def index_searches(self) -> int:
        return sum(int(n) for n in re.findall(r"Index Searches: (\d+)", self.text))

    def summary(self) -> str:
        searches = self.index_searches
        return f"{self.execution_ms:8.1f} ms, {self.buffers:>7,} buffers" + (
            f", {searches:,} index searches" if searches else ""
        )


async def explain(
    conn: psycopg.AsyncConnection[Any], title: str, statement: sql.Composable | str, params: Any
) -> Plan:
    query = sql.SQL(statement) if isinstance(statement, str) else statement
    # A list of values goes with numbered placeholders (the append's `WriterSql`).
    cur = psycopg.AsyncRawCursor(conn) if isinstance(params, list) else conn.cursor()
    await cur.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + query, params)
    text = "\n".join(str(row[0]) for row in await cur.fetchall())
    return Plan(title, query.as_string(conn), params, text)


async def explain_generic(
    conn: psycopg.AsyncConnection[Any], title: str, statement: sql.Composed, params: dict[str, Any]
) -> Plan:
    """EXPLAIN the generic plan of `statement`, prepared by psycopg as the reader's are.

    psycopg prepares a statement on its fifth run on a connection, and PostgreSQL
    then switches to a generic plan (one for any parameter values) when it does
    not look costlier than the custom ones: what a long-running stream executes.
    """
    text = statement.as_string(conn)
    order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))  # psycopg's $1, $2, ...
    await conn.execute(statement, params, prepare=True)
    cur = await conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE NOT from_sql "
        "ORDER BY prepare_time DESC LIMIT 1"
    )
    name = (await _one(cur))[0]
    args = sql.SQL(", ").join(sql.Literal(params[k]) for k in order)
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        cur = await conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE {}({})").format(sql.Identifier(name), args)
        )
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
    finally:
        await conn.execute("RESET plan_cache_mode")
    return Plan(f"{title} (generic)", text, params, plan)


async def slice_plans(
    conn: psycopg.AsyncConnection[Any],
    tables: Tables,
    machine: BySliceQuery,
    entity_type: str,
    r: SliceRange,
    title: str,
) -> list[Plan]:
    """Drive `machine` as the reader would, EXPLAINing bucket counts and its first rows query."""
    settings = machine.settings
    loop = asyncio.get_running_loop()
    plans = []
    while True:
        request = machine.next_request(loop.time())
        if isinstance(request, HorizonQuery):
            statement, params = q.horizon(tables, READER_APPLICATION)
            cur = await conn.execute(statement, params)
            machine.on_horizon(horizon_from_row(await _one(cur)))
        elif isinstance(request, BucketsQuery):
            statement, params = q.slice_buckets(
                tables, entity_type, r.min_slice, r.max_slice, request, settings.behind_current_time
            )
            plans.append(await explain(conn, f"{title}: buckets", statement, params))
            plans.append(await explain_generic(conn, f"{title}: buckets", statement, params))
            cur = await conn.execute(statement, params)
            machine.on_buckets(await cur.fetchall())
        elif isinstance(request, RowsQuery):
            statement, params = q.slice_rows(tables, entity_type, r.min_slice, r.max_slice, request)
            kind = "chunk" if request.limit is None else "limit"
            plans.append(await explain(conn, f"{title}: rows {kind}", statement, params))
            if request.limit is not None:  # a bounded chunk runs in a named cursor: never prepared
                plans.append(
                    await explain_generic(conn, f"{title}: rows {kind}", statement, params)
                )
            return plans
        else:
            raise RuntimeError(f"unexpected request while explaining {title}: {request!r}")


async def all_plans(
    dsn: str, settings: JournalSettings, start: TimestampOffset, history: History
) -> list[Plan]:
    tables = Tables(settings)
    loop = asyncio.get_running_loop()
    query = settings.query
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        end = await _database_time(conn)
        catch_up = BySliceQuery(query, start, live=False, end=end, now=loop.time())
        title = f"catch-up {MAIN_TYPE} {CATCH_UP_RANGE.min_slice}-{CATCH_UP_RANGE.max_slice}"
        plans = await slice_plans(conn, tables, catch_up, MAIN_TYPE, CATCH_UP_RANGE, title)
        # Catching up the same range from the start of the journal: its first bucket count.
        from_start = BySliceQuery(query, None, live=False, end=end, now=loop.time())
        request = from_start.next_request(loop.time())
        if not isinstance(request, BucketsQuery):
            raise RuntimeError(f"a catch-up from the start began with {request!r}")
        statement, params = q.slice_buckets(
            tables,
            MAIN_TYPE,
            CATCH_UP_RANGE.min_slice,
            CATCH_UP_RANGE.max_slice,
            request,
            query.behind_current_time,
        )
        plans.append(await explain(conn, f"{title}, from the start: buckets", statement, params))
        live = BySliceQuery(query, TimestampOffset(end), live=True, now=loop.time())
        plans += await slice_plans(
            conn, tables, live, LIVE_TYPE, SliceRange(0, 1023), f"live {LIVE_TYPE} 0-1023"
        )
        pid, seq_nr = history.existing_ids(1, seed=99)[0]
        batch = prepare_append(
            SerializerRegistry(), pid, [{"amount": 1, "note": "deposit"}], seq_nr, (), None
        )
        append, values = WriterSql.of(tables).append_call(batch, MEASURE_WRITER)
        async with conn.transaction(force_rollback=True):
            plans.append(
                await explain(
                    conn, "append (1 event to an existing id, rolled back)", append.text, values
                )
            )
    return plans


def plans_markdown(size: int, sizes: Sizes, plans: Sequence[Plan]) -> str:
    out = [f"## {size:,} events\n", f"{sizes_line(sizes)}\n"]
    for p in plans:
        if isinstance(p.params, dict):
            params = ", ".join(f"{k}={_short(v)}" for k, v in p.params.items())
        else:
            params = ", ".join(f"${i}={_short(v)}" for i, v in enumerate(p.params, start=1))
        out += [
            f"### {p.title}\n",
            f"```sql\n{p.statement.strip()}\n-- {params}\n```\n",
            f"```\n{p.text}\n```\n",
        ]
    return "\n".join(out)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- catch-up ----------------------------------------------------------------------------------


async def catch_up_start(
    conn: psycopg.AsyncConnection[Any], tables: Tables, events: int
) -> TimestampOffset:
    """The offset of the range's `events`-th newest fill event (fill timestamps are distinct)."""
    cur = await conn.execute(
        sql.SQL(
            "SELECT db_timestamp FROM {} WHERE entity_type = %s AND slice BETWEEN %s AND %s "
            "ORDER BY db_timestamp DESC LIMIT 1 OFFSET %s"
        ).format(tables.journal),
        (MAIN_TYPE, CATCH_UP_RANGE.min_slice, CATCH_UP_RANGE.max_slice, events - 1),
    )
    ts: datetime = (await _one(cur))[0]
    return TimestampOffset(ts, ts, {})


async def range_events(conn: psycopg.AsyncConnection[Any], tables: Tables) -> int:
    cur = await conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {} WHERE entity_type = %s AND slice BETWEEN %s AND %s"
        ).format(tables.journal),
        (MAIN_TYPE, CATCH_UP_RANGE.min_slice, CATCH_UP_RANGE.max_slice),
    )
    count: int = (await _one(cur))[0]
    return count


async def catch_up(
    journal: Journal, start: TimestampOffset | None, expected: int, runs: int, what: str
) -> list[float]:
    """Events/s of each run of `current_events_by_slices` over the range from `start`."""
    rates = []
    for i in range(runs):
        await checkpoint(journal.dsn)
        n = 0
        began = time.perf_counter()
        async for env in journal.current_events_by_slices(
            MAIN_TYPE, CATCH_UP_RANGE.min_slice, CATCH_UP_RANGE.max_slice, start
        ):
            if n == 0 and not isinstance(env.event, dict):
                raise RuntimeError(f"payload not decoded: {env!r}")
            n += 1
        seconds = time.perf_counter() - began
        if n != expected:
            raise RuntimeError(f"catch-up read {n} events, expected {expected}")
        rates.append(n / seconds)
        print(
            f"  catch-up {what}, run {i + 1}: {n:,} events in {seconds:.2f} s, "
            f"{format_rate(n / seconds)} events/s",
            flush=True,
        )
    return rates


# -- append ------------------------------------------------------------------------------------


class Ids:
    """One writer's ids (fill ids and new ones), used in turn, each with its highest seq_nr."""

    def __init__(self, ids: list[tuple[str, int]]) -> None:
        self.names = [name for name, _ in ids]
        self.seq_nrs = [seq_nr for _, seq_nr in ids]
        self.turn = 0

    def next(self) -> int:
        index = self.turn
        self.turn = (index + 1) % len(self.names)
        return index


def writer_ids(history: History) -> dict[int, list[Ids]]:
    """Per case and writer: IDS_PER_WRITER / 2 random fill ids and as many new ones.

    No id is shared by two writers or two cases, so every append finds its expected seq_nr.
    """
    half = IDS_PER_WRITER // 2
    existing = iter(history.existing_ids(half * sum(WRITERS), seed=1))
    rng = random.Random(1000)
    out: dict[int, list[Ids]] = {}
    for writers in WRITERS:
        out[writers] = []
        for _ in range(writers):
            new = [
                (f"{ENTITY_TYPES[rng.randrange(len(ENTITY_TYPES))]}|{rng.getrandbits(64):016x}", 0)
                for _ in range(half)
            ]
            old = [next(existing) for _ in range(half)]
            out[writers].append(Ids([x for pair in zip(old, new, strict=True) for x in pair]))
    return out


def append_one(journal: Journal, ids: Ids) -> Operation:
    async def append() -> int:
        i = ids.next()
        event = {"amount": ids.seq_nrs[i] % 100, "currency": "EUR", "note": "deposit"}
        await journal.append(ids.names[i], [event], expected_seq_nr=ids.seq_nrs[i])
        ids.seq_nrs[i] += 1
        return 1

    return append


async def appends(
    dsn: str, settings: JournalSettings, history: History, config: Config
) -> dict[int, list[float]]:
    results: dict[int, list[float]] = {w: [] for w in WRITERS}
    ids = writer_ids(history)
    for round_ in range(config.rounds):
        order = WRITERS if round_ % 2 == 0 else tuple(reversed(WRITERS))
        for writers in order:
            pool = JournalSettings(
                schema=settings.schema, writer_id=MEASURE_WRITER, pool_max_size=writers + 2
            )
            async with Journal.connect(dsn, pool) as journal:
                await checkpoint(dsn)
                workers = [append_one(journal, i) for i in ids[writers]]
                rate = await measure(workers, warmup=config.warmup, seconds=config.seconds)
            results[writers].append(rate.per_second)
            print(
                f"  append round {round_ + 1}, {writers} writer{'s' if writers > 1 else ''}: "
                f"{format_rate(rate.per_second)} events/s",
                flush=True,
            )
    return results


# -- live latency ------------------------------------------------------------------------------


async def live_latency(dsn: str, settings: JournalSettings, config: Config) -> tuple[Live, str]:
    """The live run, and how the reader's prepared slice statements were planned."""
    async with Journal.connect(dsn, settings) as journal:
        await checkpoint(dsn)
        live = await measure_live(
            journal,
            LIVE_TYPE,
            rate=config.rate,
            seconds=config.live_seconds,
            pids=LIVE_PIDS,
            warmup=LIVE_WARMUP,
            drain=LIVE_DRAIN,
            start=TimestampOffset(await journal.database_time()),
        )
        plan_cache = await prepared_plans(journal)
    return live, plan_cache


async def prepared_plans(journal: Journal) -> str:
    """Generic vs custom plans of the slice rows statements on one read connection."""
    async with journal.read_pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*), coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0) "
            "FROM pg_prepared_statements WHERE statement LIKE '%ORDER BY db_timestamp, seq_nr%'"
        )
        statements, generic, custom = await _one(cur)
    return (
        f"{statements} prepared slice-rows statement(s) on a read connection: "
        f"{generic} generic, {custom} custom plans"
    )


# -- offset table ------------------------------------------------------------------------------


@dataclass
class Projected:
    """Appends (`write_steadily` reports to it) and the handler's calls, counted."""

    measured_from: float = 0.0
    writer_done: bool = False
    appended: int = 0
    handled: int = 0
    complete: asyncio.Event = field(default_factory=asyncio.Event)

    def on_appended(self, key: tuple[str, int], now: float) -> None:
        self.appended += 1

    def on_handled(self) -> None:
        self.handled += 1
        self.check_complete()

    def check_complete(self) -> None:
        if self.writer_done and self.handled >= self.appended:
            self.complete.set()


@dataclass(frozen=True)
class Sample:
    seconds: float
    rows: int
    markers: int
    bytes: int
    dead: int  # dead tuples (pg_stat_user_tables): what the next (auto)vacuum reclaims
    autovacuums: int


@dataclass(frozen=True)
class OffsetRun:
    samples: list[Sample]
    appended: int
    handled: int
    settings: ProjectionSettings

    @property
    def max_rows(self) -> int:
        return max((s.rows for s in self.samples), default=0)

    @property
    def max_bytes(self) -> int:
        return max((s.bytes for s in self.samples), default=0)


def projection_settings(seconds: float) -> tuple[ProjectionSettings, QuerySettings]:
    window = timedelta(seconds=min(PROJECTION_WINDOW, seconds / 3))
    return (
        ProjectionSettings(time_window=window, cleanup_interval=window / 4),
        QuerySettings(
            backtracking=BacktrackingSettings(window=window / 2, behind_current_time=window / 4)
        ),
    )


async def sample_offsets(dsn: str, tables: Tables, samples: list[Sample]) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        statement = sql.SQL(
            "SELECT count(*), count(*) FILTER (WHERE persistence_id = ''), "
            "pg_total_relation_size(%(t)s::regclass), "
            "(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %(t)s::regclass), "
            "(SELECT autovacuum_count FROM pg_stat_user_tables WHERE relid = %(t)s::regclass) "
            "FROM {}"
        ).format(ProjectionTables(tables).offset_store)
        name = ProjectionTables(tables).offset_store.as_string(conn)
        began = time.perf_counter()
        while True:
            row = await _one(await conn.execute(statement, {"t": name}))
            samples.append(Sample(time.perf_counter() - began, *(int(x or 0) for x in row)))
            await asyncio.sleep(SAMPLE_EVERY)


async def offset_table(dsn: str, settings: JournalSettings, config: Config) -> OffsetRun:
    projection_config, query_settings = projection_settings(config.projection_seconds)
    counts = Projected()

    async def handler(conn: psycopg.AsyncConnection[Any], env: EventEnvelope) -> None:
        counts.on_handled()

    samples: list[Sample] = []
    async with Journal.connect(dsn, settings) as journal:
        await ProjectionManagement(journal).set_offset(PROJECTION, await journal.database_time())
        projection = Projection.exactly_once(
            journal,
            name=PROJECTION,
            entity_type=PROJECTED_TYPE,
            slice_range=SliceRange(0, 1023),
            handler=handler,
            settings=projection_config,
            query_settings=query_settings,
        )
        await checkpoint(dsn)
        running = asyncio.create_task(projection.run(), name="projection")
        sampler = asyncio.create_task(sample_offsets(dsn, journal.tables, samples), name="sampler")
        try:
            writer = write_steadily(
                journal,
                counts,
                config.rate,
                config.projection_seconds,
                entity_type=PROJECTED_TYPE,
                pids=LIVE_PIDS,
                warmup=0.0,
            )
            await race(running, writer)
            with contextlib.suppress(TimeoutError):
                await race(running, asyncio.wait_for(counts.complete.wait(), LIVE_DRAIN))
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await projection.stop()
            await running
    return OffsetRun(samples, counts.appended, counts.handled, projection_config)


def print_offsets(run: OffsetRun, rate: float) -> None:
    s = run.settings
    window, cleanup = s.time_window.total_seconds(), s.cleanup_interval.total_seconds()
    cells = [f"{x.seconds:4.0f}s {x.rows:>6,} {format_bytes(x.bytes):>9}" for x in run.samples]
    print(
        f"  offset table (time, rows, size), time_window {window:g} s, cleanup every {cleanup:g} s:"
    )
    for i in range(0, len(cells), 5):
        print("    " + " | ".join(cells[i : i + 5]))
    last = run.samples[-1] if run.samples else Sample(0, 0, 0, 0, 0, 0)
    print(
        f"  max {run.max_rows:,} rows / {format_bytes(run.max_bytes)}; at the end {last.rows:,} "
        f"rows ({last.markers:,} markers, {last.dead:,} dead tuples, autovacuumed "
        f"{last.autovacuums} times); bound ~ rate x (window + cleanup) + markers = "
        f"{rate * (window + cleanup):,.0f} + markers; projected {run.handled:,} of "
        f"{run.appended:,} appended",
        flush=True,
    )


# -- one size ----------------------------------------------------------------------------------


@dataclass
class Result:
    size: int
    sizes: Sizes
    plans: list[Plan]
    catch_up: float = 0.0
    catch_up_all: float = 0.0  # the whole range from the start
    append: dict[int, float] = field(default_factory=dict)
    live: Live = field(default_factory=Live)
    plan_cache: str = ""
    offsets: OffsetRun | None = None


async def measure_size(
    dsn: str, settings: JournalSettings, history: History, config: Config, plans_file: Path
) -> Result:
    tables = Tables(settings)
    size = history.events
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        sizes = await table_sizes(conn, tables)
        in_range = await range_events(conn, tables)
        if config.catch_up_events == 0:
            config.catch_up_events = min(CATCH_UP_MAX, int(in_range * CATCH_UP_SHARE))
            print(
                f"  catch-up range {MAIN_TYPE} {CATCH_UP_RANGE}: {in_range:,} events at this "
                f"size; every size reads its newest {config.catch_up_events:,}",
                flush=True,
            )
        start = await catch_up_start(conn, tables, config.catch_up_events)
    print(f"  {sizes_line(sizes)}", flush=True)

    plans = await all_plans(dsn, settings, start, history)
    result = Result(size, sizes, plans)
    with plans_file.open("a") as f:
        f.write(plans_markdown(size, sizes, plans) + "\n")
    for p in plans:
        print(f"  plan {p.title:<58} {p.summary()}")
        if config.print_plans:
            print("\n".join("    " + line for line in p.text.splitlines()))
    sys.stdout.flush()

    async with Journal.connect(dsn, settings) as journal:
        result.catch_up = best(
            await catch_up(journal, start, config.catch_up_events, config.rounds + 1, "newest")
        )
        result.catch_up_all = best(await catch_up(journal, None, in_range, 1, "whole range"))
    result.append = {w: best(r) for w, r in (await appends(dsn, settings, history, config)).items()}
    result.live, result.plan_cache = await live_latency(dsn, settings, config)
    lat = result.live.latencies()
    print(
        f"  live: {len(result.live.appended):,} appended, {result.live.missing()} missing, "
        f"p50 {format_ms(percentile(lat, 50))}, p99 {format_ms(percentile(lat, 99))}; "
        f"{result.plan_cache}",
        flush=True,
    )
    with plans_file.open("a") as f:
        f.write(f"Live run at {size:,}: {result.plan_cache}.\n\n")
    result.offsets = await offset_table(dsn, settings, config)
    print_offsets(result.offsets, config.rate)
    return result


# -- summary -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    name: str
    values: list[float]
    fmt: Callable[[float], str]
    higher_is_better: bool = True
    goal: bool = True

    @property
    def ratio(self) -> float:
        first, last = self.values[0], self.values[-1]
        if self.higher_is_better:
            return last / first if first else float("nan")
        return first / last if last else float("nan")


def summary(results: list[Result]) -> list[Metric]:
    lat = [r.live.latencies() for r in results]
    metrics = [
        Metric("append, 1 writer (events/s)", [r.append[1] for r in results], format_rate),
        Metric("append, 8 writers (events/s)", [r.append[8] for r in results], format_rate),
        Metric("catch-up, one range (events/s)", [r.catch_up for r in results], format_rate),
        Metric(
            "  (whole range from the start)",
            [r.catch_up_all for r in results],
            format_rate,
            goal=False,
        ),
        Metric("live p50", [percentile(x, 50) for x in lat], format_ms, False, goal=False),
        Metric("live p99", [percentile(x, 99) for x in lat], format_ms, False),
    ]
    metrics.append(
        Metric(
            "offset table rows, max",
            [float(r.offsets.max_rows if r.offsets else 0) for r in results],
            lambda v: f"{v:,.0f}",
            False,
            goal=False,
        )
    )
    metrics.append(
        Metric(
            "offset table size, max",
            [float(r.offsets.max_bytes if r.offsets else 0) for r in results],
            format_bytes,
            False,
            goal=False,
        )
    )
    return metrics


def print_summary(results: list[Result]) -> tuple[int, int]:
    metrics = summary(results)
    rows = []
    for m in metrics:
        verdict = ("met" if m.ratio >= GOAL else "NOT met") if m.goal else "-"
        rows.append([m.name, *(m.fmt(v) for v in m.values), format_ratio(m.ratio), verdict])
    first, last = results[0].size, results[-1].size
    print_table(
        ["metric", *(f"{r.size:,}" for r in results), f"{last:,}/{first:,}", f">= {GOAL}"],
        rows,
    )
    goals = [m for m in metrics if m.goal]
    return sum(m.ratio >= GOAL for m in goals), len(goals)


def print_plan_summary(results: list[Result]) -> None:
    """Per plan and size: execution time and shared buffers (the work, cached or not)."""
    rows = []
    for i, plan in enumerate(results[0].plans):
        cells = []
        for r in results:
            p = r.plans[i]
            cells += [f"{p.execution_ms:.1f}", f"{p.buffers:,}", f"{p.index_searches:,}"]
        first, last = plan.buffers, results[-1].plans[i].buffers
        rows.append([plan.title, *cells, format_ratio(first / last if last else float("nan"))])
    headers = ["EXPLAIN (ANALYZE, BUFFERS)"]
    for r in results:
        headers += [f"ms {r.size:,}", "buffers", "searches"]
    print_table([*headers, "buffers ratio"], rows)


# -- driver ------------------------------------------------------------------------------------


@dataclass
class Config:
    sizes: tuple[int, ...]
    seconds: float
    warmup: float
    rounds: int
    live_seconds: float
    rate: float
    projection_seconds: float
    print_plans: bool
    plans_file: Path
    keep: bool
    catch_up_events: int = 0  # chosen at the first size


async def main_async(config: Config, dsn_arg: str | None) -> int:
    started = time.perf_counter()
    schema = fresh_schema("bench_scale")
    settings = JournalSettings(schema=schema, writer_id=MEASURE_WRITER)
    tables = Tables(settings)
    results: list[Result] = []
    config.plans_file.write_text(
        f"# Slice-query plans as the journal grows\n\n`$ {command_line()}`\n\n"
    )
    with database(dsn_arg) as db:
        await print_environment(db)
        print(
            f"fill:     {len(ENTITY_TYPES)} entity types ({MAIN_TYPE}: {MAIN_SHARE:.0%} of ids), "
            f"an event every {STEP_US / 1e6:g} s, ~{EVENTS_PER_ID} per id, COPY in chunks of "
            f"{COPY_CHUNK:,}; schema {schema}\n"
            f"runs:     append {config.warmup:g} s warm-up + {config.seconds:g} s x "
            f"{config.rounds} round(s); live {config.rate:g}/s for {config.live_seconds:g} s; "
            f"projection {config.rate:g}/s for {config.projection_seconds:g} s\n"
            f"plans:    {config.plans_file}",
            flush=True,
        )
        try:
            async with await psycopg.AsyncConnection.connect(db.dsn, autocommit=True) as conn:
                await migrate(conn, settings)
                now = await _database_time(conn)
                first = now - END_MARGIN - timedelta(microseconds=STEP_US * max(config.sizes))
                history = History(first, SerializerRegistry())
                for size in config.sizes:
                    print(f"\n== {size:,} events", flush=True)
                    if results:
                        removed = await remove_measurement_rows(conn, tables)
                        print(f"  removed the {removed:,} events the measurements wrote")
                        sizes = await table_sizes(conn, tables)
                        check_disk(db.embedded, sizes, history.events, size)
                    done = await fill(conn, tables, history, size)
                    await checkpoint(db.dsn)
                    print(
                        f"  filled {done.events:,} events by COPY in {done.seconds:.0f} s "
                        f"({format_rate(done.events / done.seconds)} events/s), VACUUM ANALYZE "
                        f"{done.vacuum_seconds:.0f} s; {len(history.names):,} ids; df: "
                        f"{format_bytes(shutil.disk_usage(tempfile.gettempdir()).free)} free",
                        flush=True,
                    )
                    if not results and len(config.sizes) > 1:
                        sizes = await table_sizes(conn, tables)
                        check_disk(db.embedded, sizes, history.events, max(config.sizes))
                    results.append(
                        await measure_size(db.dsn, settings, history, config, config.plans_file)
                    )
        finally:
            if config.keep:
                print(f"\nschema {schema} kept")
            else:
                await drop_schema(db.dsn, schema)
    print()
    met, goals = print_summary(results)
    print()
    print_plan_summary(results)
    print(
        "ratio: largest / smallest size for throughput, smallest / largest for latency, "
        "offset table and buffers (>= 1: no worse);\nplans in "
        f"{config.plans_file}; buffers: shared hit + read of the top node; searches: index "
        "descents (nbtree skip scan: one per slice in the range it reaches)."
    )
    print(
        f"goal ratio >= {GOAL}: met in {met} of {goals}; total time "
        f"{time.perf_counter() - started:.0f} s"
    )
    return 0


def parse_sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(s.replace("_", "")) for s in text.split(","))
    if not sizes or any(b <= a for a, b in itertools.pairwise(sizes)) or sizes[0] < 1:
        raise argparse.ArgumentTypeError("sizes must be increasing positive integers")
    return sizes


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_dsn_argument(parser)
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=(1_000_000, 10_000_000),
        help="journal sizes to measure at, increasing (default 1000000,10000000)",
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per append run (5)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="append rounds; catch-up runs rounds + 1 (2)"
    )
    parser.add_argument("--live-seconds", type=float, default=10.0, help="live writer (10)")
    parser.add_argument("--rate", type=float, default=200.0, help="live appends/s (200)")
    parser.add_argument(
        "--projection-seconds", type=float, default=180.0, help="offset-table run (180)"
    )
    parser.add_argument("--plans", action="store_true", help="print the plans too")
    parser.add_argument(
        "--plans-file", type=Path, default=Path("/tmp/scale_plans.md"), help="(/tmp/scale_plans.md)"
    )
    parser.add_argument("--keep", action="store_true", help="do not drop the schema at the end")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: sizes 20000,200000, short runs"
    )
    args = parser.parse_args(argv)
    if (
        args.seconds <= 0
        or args.rounds < 1
        or args.live_seconds <= LIVE_WARMUP
        or args.rate <= 0
        or args.projection_seconds < 3
    ):
        parser.error(
            f"--seconds > 0, --rounds >= 1, --live-seconds > {LIVE_WARMUP:g}, --rate > 0, "
            "--projection-seconds >= 3"
        )
    if args.quick:
        config = Config((20_000, 200_000), 1.0, 0.3, 1, 4.0, args.rate, 12.0, args.plans,
                        args.plans_file, args.keep)  # fmt: skip
    else:
        config = Config(
            args.sizes,
            args.seconds,
            1.0,
            args.rounds,
            args.live_seconds,
            args.rate,
            args.projection_seconds,
            args.plans,
            args.plans_file,
            args.keep,
        )
    return args, config


async def _database_time(conn: psycopg.AsyncConnection[Any]) -> datetime:
    now: datetime = (await _one(await conn.execute("SELECT transaction_timestamp()")))[0]
    return now


async def _one(cur: Any) -> Any:
    row = await cur.fetchone()
    if row is None:
        raise RuntimeError("the database returned no row")
    return row


if __name__ == "__main__":
    sys.exit(run(parse_args(), main_async))

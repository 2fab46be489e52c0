"""slicejournal against the Python `eventsourcing` library on PostgreSQL, plus raw psycopg.

    .venv/bin/python benchmarks/peers.py [--dsn DSN] [--seconds 5] [--rounds 2] [--quick]

Needs the optional peer, the `bench` extra (`.venv/bin/python -m pip install -e
'.[bench]'`, i.e. `eventsourcing[postgres]>=9.5,<10`; older releases pin psycopg
3.2); without it the script says so and exits with status 2.

Write side: new aggregates, each created by one atomic append of its first two
events (`{"amount": 42, "note": "deposit"}` twice, as compact JSON; a fresh
uuid4 id per append), by 1 and by 8 concurrent writers, each in a loop for a
warm-up second and then `--seconds` measured ones. Variants, each in a fresh
schema of the same server (same fsync, same synchronous_commit):

- raw: psycopg `AsyncConnection`s (autocommit, one per writer), one two-row
  `INSERT ... VALUES` per append with exactly the rows the journal stores.
- slicejournal: `Journal.append(pid, [e1, e2], expected_seq_nr=0)`, default
  settings (post-commit NOTIFY on), pool of writers + 2 connections.
- slicejournal sync: the same with the blocking `SyncJournal`, each writer a
  thread of its own, as the peer runs (one journal, pool of writers + 2).
- eventsourcing: its `PostgresApplicationRecorder` (what an `Application`
  stores into; the only recorder with the notification log the read side
  needs) from `PostgresFactory`, pool of exactly the writers
  (POSTGRES_POOL_SIZE, no overflow), one `insert_events([e1, e2])` (StoredEvent
  versions 1 and 2 of a new uuid4 id, the same JSON bytes as state) per append,
  each writer a thread (the library is synchronous). Its defaults: a pipelined
  transaction `LOCK TABLE ... IN EXCLUSIVE MODE; NOTIFY; INSERT ... RETURNING
  notification_id; COMMIT`.
- eventsourcing db-fn: the same with POSTGRES_ENABLE_DB_FUNCTIONS=y, the setting
  its own speed runs use: one `SELECT es_insert_events_uuid(...)` round trip
  (NOTIFY + INSERT in a PL/pgSQL function; it leaves out the table lock, so
  notification ids are no longer sure to commit in order).

Why the numbers differ: both peer paths commit one writer at a time. The
default one holds its EXCLUSIVE table lock (taken so that notification ids
commit in order) until the commit has been flushed; the db-function path skips
that lock, but its NOTIFY inside the transaction takes PostgreSQL's
database-wide notify lock at commit, also held until the flush (writers wait on
Lock:relation, resp. Lock:object, in pg_stat_activity). slicejournal's append
is one INSERT statement (row locks only; its NOTIFY is sent after the commit,
coalesced, from another connection), so concurrent appends commit in parallel
and share WAL flushes; readers get their order from db_timestamp plus the
visibility horizon instead.

Variants are interleaved (round 1: raw, slicejournal, slicejournal sync,
eventsourcing, eventsourcing db-fn; round 2 reversed, ...) because the machine
is shared and noisy; each variant's best run counts. In the summary each
library is its faster way of the case: "slicejournal" the faster of its two
flavours (both rows are printed above it), "peer" the faster eventsourcing
configuration. Goals: below.

Read side: a full catch-up read of what the last 8-writer run of slicejournal
and of eventsourcing (defaults) wrote (their own stores; the event counts
differ, so compare rates), after `VACUUM ANALYZE` and one untimed pass of each
reader, in 3 x `--rounds` interleaved passes, best shown. Every reader decodes
every payload (`json.loads`), as a consumer has to:

- raw: one psycopg `SELECT` (session time zone UTC) of the journal's envelope columns over slices
  0..1023 `ORDER BY db_timestamp, seq_nr`, `fetchall`, from slicejournal's table.
- slicejournal: `Journal.current_events_by_slices(entity_type, 0, 1023)`,
  default `QuerySettings` (buffer_size 1000), every envelope consumed.
- eventsourcing: `select_notifications(start, limit=500,
  inclusive_of_start=False)` page after page until a short page, as its
  `ListenNotifySubscription` (used by its projection runners) catches up.

Goals (slicejournal / peer): writes >= 1.0 with 1 writer and >= 1.5 with 8; the
catch-up read >= 1.3 (the least the project aims for; 1.5 is its target).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from _common import (
    Operation,
    Rate,
    Timing,
    best,
    checkpoint,
    count_rows,
    database,
    drop_schema,
    format_rate,
    format_ratio,
    fresh_schema,
    measure,
    parse_timed_args,
    print_environment,
    print_table,
    run,
    slice_select,
    spread,
)
from append import (
    check_row_count,
    measure_on_connections,
    raw_insert_sql,
    raw_params,
    serialize,
)
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from journal import NUMBER_OF_SLICES, Journal, JournalSettings, SyncJournal, slice_for
from journal.tables import Tables

try:  # the peer is optional: main() explains how to install it
    from eventsourcing.persistence import ApplicationRecorder, StoredEvent  # type: ignore[import-not-found, unused-ignore]
    from eventsourcing.postgres import PostgresFactory  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    PEER_INSTALLED = False
else:
    PEER_INSTALLED = True

PEER_REQUIREMENT = "eventsourcing[postgres]>=9.5,<10"

EVENT: dict[str, Any] = {"amount": 42, "note": "deposit"}
EVENTS_PER_APPEND = 2
ENTITY_TYPE = "Account"
WRITER_ID = "bench-peers"  # the `writer` column, identical for raw and journal rows
PEER_TOPIC = "bench.bank:Account.Deposited"  # eventsourcing stores a topic per event
PEER_TABLE = "stored_events"  # what PostgresFactory.application_recorder() creates
PEER_PAGE = 500  # ListenNotifySubscription's select limit
PAYLOAD_COLUMN = 12  # event_payload in envelope_columns()
GOALS = {1: 1.0, 8: 1.5}  # slicejournal / peer, by writers
READ_GOAL = 1.3  # slicejournal / peer, the catch-up read
WRITERS = tuple(GOALS)
READ_PASSES_PER_ROUND = 3

RAW = "raw"
JOURNAL = "slicejournal"
JOURNAL_SYNC = "slicejournal sync"
PEER = "eventsourcing"
PEER_FN = "eventsourcing db-fn"
VARIANTS = (RAW, JOURNAL, JOURNAL_SYNC, PEER, PEER_FN)
JOURNALS = (JOURNAL, JOURNAL_SYNC)
PEERS = (PEER, PEER_FN)
READERS = (RAW, JOURNAL, PEER)
SCHEMA_PREFIXES = {
    RAW: "raw",
    JOURNAL: "journal",
    JOURNAL_SYNC: "jsync",
    PEER: "es",
    PEER_FN: "esfn",
}

SyncOperation = Callable[[], int]
"""One unit of work of a thread worker; returns how many events it wrote."""


@dataclass(frozen=True)
class PeerConnection:
    """The five connection parameters eventsourcing's PostgresFactory takes."""

    dbname: str
    host: str
    port: str
    user: str
    password: str
    ignored: tuple[str, ...]  # further DSN parameters the peer cannot be given


async def peer_connection(dsn: str) -> PeerConnection:
    """The DSN as the peer's POSTGRES_* settings, with libpq's defaults resolved.

    The host may be a unix socket directory (the embedded server's): libpq takes
    a host starting with "/" as one, and the peer passes it to psycopg as is.
    """
    given = conninfo_to_dict(dsn)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        info = conn.info  # what libpq connected with: defaults and PG* variables applied
        return PeerConnection(
            dbname=info.dbname,
            host=info.host,
            port=str(info.port),
            user=info.user,
            password=info.password or "",
            ignored=tuple(sorted(set(given) - {"dbname", "host", "port", "user", "password"})),
        )


def peer_env(
    peer: PeerConnection,
    schema: str,
    *,
    pool_size: int,
    db_functions: bool = False,
    create_table: bool = True,
) -> dict[str, str]:
    """PostgresFactory's environment: the server, a schema of our own, a pool for the writers."""
    return {
        "POSTGRES_DBNAME": peer.dbname,
        "POSTGRES_HOST": peer.host,
        "POSTGRES_PORT": peer.port,
        "POSTGRES_USER": peer.user,
        "POSTGRES_PASSWORD": peer.password,
        "POSTGRES_SCHEMA": schema,
        "POSTGRES_POOL_SIZE": str(pool_size),
        "POSTGRES_MAX_OVERFLOW": "0",
        "POSTGRES_ENABLE_DB_FUNCTIONS": "y" if db_functions else "n",
        "CREATE_TABLE": "y" if create_table else "n",
    }


@contextmanager
def peer_recorder(env: dict[str, str]) -> Iterator[ApplicationRecorder]:
    """The application recorder an eventsourcing `Application` would store into."""
    factory = PostgresFactory(env)
    try:
        yield factory.application_recorder()
    finally:
        factory.close()


def new_pid() -> str:
    return f"{ENTITY_TYPE}|{uuid.uuid4()}"


@dataclass
class Kept:
    """The stores the read side reads: the last 8-writer run's schemas."""

    journal: str | None = None
    peer: str | None = None

    def keep(self, variant: str, schema: str) -> None:
        if variant == JOURNAL:
            self.journal = schema
        elif variant == PEER:
            self.peer = schema

    def schemas(self) -> list[str]:
        return [s for s in (self.journal, self.peer) if s is not None]


# -- write side -----------------------------------------------------------------------


async def run_variant(
    variant: str, dsn: str, peer: PeerConnection, writers: int, timing: Timing, *, keep: bool
) -> tuple[Rate, str | None]:
    """One measured run in a fresh schema: the rate, and the schema if it is kept.

    With `keep`, slicejournal's and the default peer's schemas stay for the read
    side (the caller drops them); every other schema is dropped here.
    """
    schema = fresh_schema(f"bench_peers_{SCHEMA_PREFIXES[variant]}")
    kept = False
    try:
        if variant == RAW:
            rate = await run_raw(dsn, schema, writers, timing)
        elif variant == JOURNAL:
            rate = await run_journal(dsn, schema, writers, timing)
        elif variant == JOURNAL_SYNC:
            rate = await run_journal_sync(dsn, schema, writers, timing)
        else:
            rate = await run_peer(
                dsn, schema, peer, writers, timing, db_functions=variant == PEER_FN
            )
        kept = keep and variant in (JOURNAL, PEER)
        return rate, schema if kept else None
    finally:
        if not kept:
            await drop_schema(dsn, schema)


async def run_raw(dsn: str, schema: str, writers: int, timing: Timing) -> Rate:
    return await measure_on_connections(dsn, schema, writers, timing, raw_writer)


def raw_writer(conn: psycopg.AsyncConnection[Any], tables: Tables, _index: int) -> Operation:
    insert = raw_insert_sql(tables.journal, EVENTS_PER_APPEND)
    cursor = psycopg.AsyncRawCursor(conn)
    events = [EVENT] * EVENTS_PER_APPEND

    async def append() -> int:
        pid = new_pid()
        await cursor.execute(insert, raw_params(pid, slice_for(pid), 0, events))
        return EVENTS_PER_APPEND

    return append


async def run_journal(dsn: str, schema: str, writers: int, timing: Timing) -> Rate:
    settings = JournalSettings(schema=schema, pool_max_size=writers + 2, writer_id=WRITER_ID)
    async with Journal.connect(dsn, settings, create_schema=True) as journal:
        workers = [journal_writer(journal) for _ in range(writers)]
        await checkpoint(dsn)
        rate = await measure(workers, warmup=timing.warmup, seconds=timing.seconds)
    await check_row_count(dsn, Tables(settings).journal, rate)
    return rate


def journal_writer(journal: Journal) -> Operation:
    events = [EVENT] * EVENTS_PER_APPEND

    async def append() -> int:
        await journal.append(new_pid(), events, expected_seq_nr=0)
        return EVENTS_PER_APPEND

    return append


async def run_journal_sync(dsn: str, schema: str, writers: int, timing: Timing) -> Rate:
    """The blocking flavour, as the peer runs: one thread per writer, one shared journal."""
    settings = JournalSettings(schema=schema, pool_max_size=writers + 2, writer_id=WRITER_ID)
    with SyncJournal.connect(dsn, settings, create_schema=True) as journal:
        workers = [sync_journal_writer(journal) for _ in range(writers)]
        await checkpoint(dsn)
        rate = await measure_threads(workers, warmup=timing.warmup, seconds=timing.seconds)
    await check_row_count(dsn, Tables(settings).journal, rate)
    return rate


def sync_journal_writer(journal: SyncJournal) -> SyncOperation:
    events = [EVENT] * EVENTS_PER_APPEND

    def append() -> int:
        journal.append(new_pid(), events, expected_seq_nr=0)
        return EVENTS_PER_APPEND

    return append


async def run_peer(
    dsn: str, schema: str, peer: PeerConnection, writers: int, timing: Timing, *, db_functions: bool
) -> Rate:
    await create_schema(dsn, schema)
    env = peer_env(peer, schema, pool_size=writers, db_functions=db_functions)
    with peer_recorder(env) as recorder:
        workers = [peer_writer(recorder) for _ in range(writers)]
        await checkpoint(dsn)
        rate = await measure_threads(workers, warmup=timing.warmup, seconds=timing.seconds)
    await check_row_count(dsn, sql.Identifier(schema, PEER_TABLE), rate)
    return rate


async def create_schema(dsn: str, schema: str) -> None:
    """The peer creates its table, type and function, but not the schema it is given."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))


def peer_writer(recorder: ApplicationRecorder) -> SyncOperation:
    def append() -> int:
        aggregate_id = uuid.uuid4()
        recorder.insert_events(
            [
                StoredEvent(aggregate_id, version, PEER_TOPIC, serialize(EVENT))
                for version in range(1, EVENTS_PER_APPEND + 1)
            ]
        )
        return EVENTS_PER_APPEND

    return append


async def measure_threads(
    workers: Sequence[SyncOperation], *, warmup: float, seconds: float
) -> Rate:
    """`measure` for a synchronous library: every worker loops in a thread of its own.

    Same protocol: `warmup` seconds, then `seconds` timed ones; afterwards each
    thread finishes the operation it is in and stops. A failing worker fails the
    measurement at once. The event loop only waits meanwhile.
    """
    counts = [0] * len(workers)  # one slot per thread: no lost updates
    stopping = threading.Event()
    errors: list[BaseException] = []

    def loop(slot: int, operation: SyncOperation) -> None:
        try:
            while not stopping.is_set():
                counts[slot] += operation()
        except BaseException as e:
            errors.append(e)
            stopping.set()

    def join_all() -> None:
        for thread in threads:
            thread.join()

    threads = [
        threading.Thread(target=loop, args=(i, op), name=f"peer-writer-{i}", daemon=True)
        for i, op in enumerate(workers)
    ]
    for thread in threads:
        thread.start()
    try:
        await _wait_unless_failed(stopping, errors, warmup)
        start_items, start = sum(counts), time.perf_counter()
        await _wait_unless_failed(stopping, errors, seconds)
        end_items, end = sum(counts), time.perf_counter()
    finally:
        stopping.set()
        await asyncio.to_thread(join_all)
    return Rate(end_items - start_items, end - start, sum(counts))


async def _wait_unless_failed(
    stopping: threading.Event, errors: list[BaseException], seconds: float
) -> None:
    if await asyncio.to_thread(stopping.wait, seconds):
        if errors:
            raise errors[0]
        raise RuntimeError("a benchmark worker stopped on its own")


def case_name(writers: int) -> str:
    return f"{writers} writer{'s' if writers > 1 else ''}"


async def write_case(
    dsn: str, peer: PeerConnection, writers: int, timing: Timing, kept: Kept | None
) -> dict[str, list[float]]:
    """Every variant `timing.rounds` times, interleaved; with `kept`, the last round's
    slicejournal and default-peer schemas are kept there for the read side."""
    results: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_ in range(timing.rounds):
        order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            keep = kept is not None and round_ == timing.rounds - 1
            rate, schema = await run_variant(variant, dsn, peer, writers, timing, keep=keep)
            if kept is not None and schema is not None:
                kept.keep(variant, schema)
            results[variant].append(rate.per_second)
            print(
                f"  {case_name(writers):<10} round {round_ + 1}  {variant:<20}"
                f"{format_rate(rate.per_second):>10} events/s",
                flush=True,
            )
    return results


# -- read side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pass:
    events: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


async def read_raw(conn: psycopg.AsyncConnection[Any], tables: Tables) -> int:
    cur = await conn.execute(slice_select(tables), (ENTITY_TYPE, 0, NUMBER_OF_SLICES - 1))
    rows = await cur.fetchall()
    for row in rows:
        json.loads(row[PAYLOAD_COLUMN])
    return len(rows)


async def read_journal(journal: Journal) -> int:
    n = 0
    async for env in journal.current_events_by_slices(ENTITY_TYPE, 0, NUMBER_OF_SLICES - 1):
        if n == 0 and not isinstance(env.event, dict):
            raise RuntimeError(f"payload not decoded: {env!r}")
        n += 1
    return n


def read_peer(recorder: ApplicationRecorder) -> int:
    """Page through the notification log as the peer's ListenNotifySubscription does."""
    n = 0
    last = 0
    while True:
        page = recorder.select_notifications(start=last, limit=PEER_PAGE, inclusive_of_start=False)
        for notification in page:
            json.loads(notification.state)
        n += len(page)
        if len(page) < PEER_PAGE:
            return n
        last = page[-1].id


async def read_side(
    dsn: str, peer: PeerConnection, kept: Kept, passes: int
) -> tuple[dict[str, list[Pass]], dict[str, int]]:
    """`passes` timed full reads per reader, interleaved; and the events each reads."""
    if kept.journal is None or kept.peer is None:
        raise RuntimeError("the write side kept no stores to read")
    settings = JournalSettings(schema=kept.journal)
    tables = Tables(settings)
    peer_table = sql.Identifier(kept.peer, PEER_TABLE)
    env = peer_env(peer, kept.peer, pool_size=1, create_table=False)
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        Journal.connect(dsn, settings) as journal,
    ):
        # UTC, as the journal's read sessions: psycopg converts each timestamptz into the
        # session's zone, which costs ~0.3 us a value for a named zone.
        await conn.execute("SET TimeZone TO 'UTC'")
        for table in (tables.journal, peer_table):
            await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
        expected = {
            RAW: await count_rows(conn, tables.journal),
            JOURNAL: await count_rows(conn, tables.journal),
            PEER: await count_rows(conn, peer_table),
        }
        print(
            f"  stores: slicejournal {expected[JOURNAL]:,} events, "
            f"eventsourcing {expected[PEER]:,} events",
            flush=True,
        )
        with peer_recorder(env) as recorder:
            readers: dict[str, Callable[[], Any]] = {
                RAW: lambda: read_raw(conn, tables),
                JOURNAL: lambda: read_journal(journal),
                PEER: lambda: asyncio.to_thread(read_peer, recorder),
            }
            for reader, read in readers.items():  # untimed: warm caches, check counts
                if (n := await read()) != expected[reader]:
                    raise RuntimeError(f"{reader}: read {n} events, expected {expected[reader]}")
            results: dict[str, list[Pass]] = {reader: [] for reader in READERS}
            for i in range(passes):
                shift = i % len(READERS)
                for reader in READERS[shift:] + READERS[:shift]:
                    await checkpoint(dsn)
                    start = time.perf_counter()
                    n = await readers[reader]()
                    result = Pass(n, time.perf_counter() - start)
                    if n != expected[reader]:
                        raise RuntimeError(
                            f"{reader}: read {n} events, expected {expected[reader]}"
                        )
                    results[reader].append(result)
                    print(
                        f"  pass {i + 1}  {reader:<14}{format_rate(result.per_second):>10} "
                        f"events/s  ({result.seconds:.2f} s)",
                        flush=True,
                    )
    return results, expected


# -- driver ---------------------------------------------------------------------------


def write_rows(writes: dict[int, dict[str, list[float]]]) -> list[list[str]]:
    rows = []
    for writers, runs in writes.items():
        rows.append(
            [
                case_name(writers),
                *(format_rate(best(runs[v])) for v in VARIANTS),
                f"{max(spread(runs[v]) for v in VARIANTS):.0%}" if len(runs[RAW]) > 1 else "-",
            ]
        )
    return rows


def read_rows(reads: dict[str, list[Pass]], events: dict[str, int]) -> list[list[str]]:
    rows = []
    for reader in READERS:
        rates = [p.per_second for p in reads[reader]]
        rows.append(
            [
                reader,
                f"{events[reader]:,}",
                format_rate(best(rates)),
                f"{1e6 / best(rates):.1f}",
                f"{spread(rates):.0%}",
            ]
        )
    return rows


def summary_row(
    name: str, raw: float, journal: float, peer: float, goal: float | None
) -> list[str]:
    ratio = journal / peer
    if goal is None:
        goal_cells = ["-", "no goal"]
    else:
        goal_cells = [f">= {goal:g}", "met" if ratio >= goal else "NOT met"]
    return [
        name,
        format_rate(raw),
        format_rate(journal),
        format_rate(peer),
        format_ratio(ratio),
        format_ratio(journal / raw),
        *goal_cells,
    ]


async def main_async(timing: Timing, dsn_arg: str | None) -> int:
    started = time.perf_counter()
    with database(dsn_arg) as db:
        await print_environment(db)
        peer = await peer_connection(db.dsn)
        print(
            f"peer:     eventsourcing {importlib.metadata.version('eventsourcing')}, "
            f"PostgresApplicationRecorder from PostgresFactory (host {peer.host}, "
            f"port {peer.port}, database {peer.dbname})"
        )
        if peer.ignored:
            print(f"          (the peer takes no other DSN parameters: {', '.join(peer.ignored)})")
        print(
            f"timing:   {timing.warmup:g} s warm-up + {timing.seconds:g} s measured per run, "
            f"{timing.rounds} round(s) of {', '.join(VARIANTS)} per case, best run shown"
        )
        print(
            f"workload: new aggregates, {EVENTS_PER_APPEND} events per atomic append "
            f"(a new uuid4 id each), event {json.dumps(EVENT)}"
        )
        print(flush=True)
        kept = Kept()
        try:
            print("== write side", flush=True)
            writes = {}
            for writers in WRITERS:
                last = writers == WRITERS[-1]
                writes[writers] = await write_case(
                    db.dsn, peer, writers, timing, kept if last else None
                )
            print()
            print(
                f"== read side: full catch-up of the last {case_name(WRITERS[-1])} run's stores",
                flush=True,
            )
            reads, events = await read_side(
                db.dsn, peer, kept, READ_PASSES_PER_ROUND * timing.rounds
            )
        finally:
            for schema in kept.schemas():
                await drop_schema(db.dsn, schema)
    print()
    print_table(
        ["case", *(f"{v} ev/s" for v in VARIANTS), "spread"],
        write_rows(writes),
    )
    print(
        "events/s: best run of each variant (appends/s = events/s / 2); spread: the largest "
        "(max - min) / median\nover the runs of one variant in the case."
    )
    print()
    print_table(
        ["reader", "events", "best events/s", "us/event", "spread"],
        read_rows(reads, events),
    )
    print(
        "raw and slicejournal read slicejournal's table, eventsourcing its own; every reader "
        "decodes every payload."
    )
    print()
    rows = []
    met = []
    for writers, runs in writes.items():
        journal = max(best(runs[j]) for j in JOURNALS)
        peer_best = max(best(runs[p]) for p in PEERS)
        rows.append(
            summary_row(
                f"write, {case_name(writers)}",
                best(runs[RAW]),
                journal,
                peer_best,
                GOALS[writers],
            )
        )
        met.append(journal / peer_best >= GOALS[writers])
    rates = {reader: best([p.per_second for p in reads[reader]]) for reader in READERS}
    rows.append(summary_row("catch-up read", rates[RAW], rates[JOURNAL], rates[PEER], READ_GOAL))
    met.append(rates[JOURNAL] / rates[PEER] >= READ_GOAL)
    print_table(
        [
            "case",
            "raw /s",
            "slicejournal /s",
            "peer /s",
            "slicejournal/peer",
            "slicejournal/raw",
            "goal",
            "result",
        ],
        rows,
    )
    print(
        "for writes, each library's faster way in the case: slicejournal's asyncio `Journal` or "
        "its "
        "blocking `SyncJournal`\n(one thread per writer), eventsourcing's two configurations; "
        "goal: slicejournal/peer."
    )
    print(
        f"goals met in {sum(met)} of {len(met)} cases; "
        f"total time {time.perf_counter() - started:.0f} s"
    )
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Timing]:
    return parse_timed_args(
        __doc__,
        seconds_help="measured seconds per write run (default 5)",
        rounds_help=(
            "interleaved write runs of each variant (default 2); the read side makes "
            f"{READ_PASSES_PER_ROUND} passes per round"
        ),
        argv=argv,
    )


def main() -> int:
    parsed = parse_args()
    if not PEER_INSTALLED:
        print(
            "benchmarks/peers.py compares slicejournal with the eventsourcing library, which "
            "is not installed.\nInstall the benchmark extra: .venv/bin/python -m pip install "
            f"-e '.[bench]'\n(or only the peer: pip install '{PEER_REQUIREMENT}')",
            file=sys.stderr,
        )
        return 2
    return run(parsed, main_async)


if __name__ == "__main__":
    sys.exit(main())

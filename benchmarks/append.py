"""Throughput of `Journal.append` against raw psycopg inserting the same rows.

    .venv/bin/python benchmarks/append.py [--dsn DSN] [--seconds 5] [--rounds 2] [--quick]
        [--cases 1x1,8x1,4x8x1]

Four cases: 1 and 8 concurrent writers x batches of 1 and 100 events. Each
writer appends to its own 50 persistence ids in rotation, tracking
`expected_seq_nr`; every event is `{"amount": 42, "note": "deposit"}`.

Per case four variants are measured, each run in a fresh schema:

- raw: psycopg `AsyncConnection`s (autocommit, one per writer) running one
  multi-row `INSERT ... VALUES` per batch with the very rows the journal would
  store (same columns and values, `db_timestamp = transaction_timestamp()`).
- journal SQL: the same connections running the journal's own append
  statement (previous-row lookup, `expected_seq_nr` check, insert, the stored
  timestamp fetched back) the way the journal runs it (prepared, through
  libpq's own calls, for up to 10 events; a raw cursor for more), with no
  library code around it: no pool, no validation, no envelopes. It is the
  ceiling for the journal: what the statement itself costs over a bare INSERT.
- journal: `Journal.append` with default settings (post-commit NOTIFY on),
  pool of writers + 2 connections.
- journal, ungrouped: the same with `JournalSettings(append_statements=None)`:
  every append its own statement (no group commit), as before 0.3.

Variants are interleaved (round 1: raw, journal SQL, journal, ungrouped; round 2 reversed,
...) because the machine is shared and noisy; the table shows each variant's
best run. Each run also measures the client's CPU time (`time.process_time()`,
this process: event loop, psycopg, the library) over its timed window, shown
as microseconds per append (one `append` call / one statement, whatever the
batch); a second table shows those figures (median over the rounds) for
raw, the journal's SQL and the journal, and the journal's excess over its SQL.
`--cases 1x1,8x1` runs only those WRITERSxBATCH cases; `PROCESSESxWRITERSxBATCH`
(`4x8x1`) runs every variant in that many processes at once, each with its own
writers and persistence ids over the same fresh schema (started together, their
timed windows aligned to the same wall-clock second): the events/s are the sum
of the processes', the client CPU per append their CPU summed. One process's
appends are bound by its one core (the GIL); this shows what several processes
of a service, or a fleet, add up to on a machine with more cores.

The goal is journal/raw >= 0.8 in every case with NOTIFY on; journal/SQL shows
how much of the gap is the library rather than the statement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

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
    spread,
)
from psycopg import sql

from journal import Journal, JournalSettings, slice_for
from journal.aio import prepared as prepared_statements
from journal.aio.migrate import migrate
from journal.model import SerializedPayload
from journal.serialization import JSON_SERIALIZER_ID
from journal.tables import Tables
from journal.writer import PreparedAppend, WriterSql

EVENT: dict[str, Any] = {"amount": 42, "note": "deposit"}
ENTITY_TYPE = "Account"
PIDS_PER_WRITER = 50
WRITER_ID = "bench-append"  # the `writer` column, identical for raw and journal rows
GOAL = 0.8

RAW = "raw"
SQL_ONLY = "journal SQL"
JOURNAL = "journal"
UNGROUPED = "journal ungrouped"
VARIANTS = (RAW, SQL_ONLY, JOURNAL, UNGROUPED)


@dataclass(frozen=True)
class Case:
    writers: int
    batch: int
    processes: int = 1  # > 1: every variant runs in that many processes at once

    @property
    def name(self) -> str:
        writers = f"{self.writers} writer{'s' if self.writers > 1 else ''} x batch {self.batch}"
        return writers if self.processes == 1 else f"{self.processes} procs x {writers}"


CASES = (Case(1, 1), Case(1, 100), Case(8, 1), Case(8, 100))


class PidRotation:
    """One writer's persistence ids, used in turn, each with its highest seq_nr."""

    def __init__(self, writer: int) -> None:
        self.pids = [f"{ENTITY_TYPE}|w{writer}-{i}" for i in range(PIDS_PER_WRITER)]
        self.slices = [slice_for(pid) for pid in self.pids]
        self.seq_nrs = [0] * PIDS_PER_WRITER
        self.turn = 0

    def next(self) -> int:
        """The index of the id to write next."""
        index = self.turn
        self.turn = (index + 1) % PIDS_PER_WRITER
        return index


def serialize(event: dict[str, Any]) -> bytes:
    """What `JsonSerializer` stores for a plain dict (same bytes, byte for byte)."""
    return json.dumps(event, separators=(",", ":"), allow_nan=False).encode("utf-8")


# -- variants -------------------------------------------------------------------------


Writer = Callable[[psycopg.AsyncConnection[Any], Tables, PidRotation, int], Operation]
Worker = Callable[[psycopg.AsyncConnection[Any], Tables, int], Operation]


async def run_raw(dsn: str, case: Case, timing: Timing, writer: Writer) -> Measured:
    """`writer` over one dedicated connection per writer (no pool, no journal)."""
    schema = fresh_schema("bench_raw")
    try:
        return await measure_on_connections(
            dsn,
            schema,
            case.writers,
            timing,
            lambda conn, tables, w: writer(conn, tables, PidRotation(w), case.batch),
        )
    finally:
        await drop_schema(dsn, schema)


async def measure_on_connections(
    dsn: str, schema: str, writers: int, timing: Timing, worker: Worker
) -> Measured:
    """The journal's tables created in `schema`, then `worker(conn, tables, index)` over
    one dedicated autocommit connection each; the stored rows are checked against the rate."""
    settings = JournalSettings(schema=schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate(conn, settings)
    tables = Tables(settings)
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(writers)]
    try:
        workers = [worker(conn, tables, w) for w, conn in enumerate(conns)]
        rate = await measure_after_checkpoint(dsn, workers, timing)
    finally:
        for conn in conns:
            await conn.close()
    await check_row_count(dsn, tables.journal, rate)
    return rate


def raw_insert_sql(table: sql.Composable, batch: int) -> str:
    """One multi-row INSERT ... VALUES for `batch` rows, with native `$n` placeholders.

    Native placeholders (run by `AsyncRawCursor`) because psycopg parses
    `%s`-style queries in Python and caches the result only for statements of
    at most 4096 bytes and 50 parameters: a 100-row VALUES list would be
    re-parsed on every call, making the baseline slower than it needs to be.
    """
    rows = []
    for r in range(batch):
        p = [f"${8 * r + k}" for k in range(1, 9)]
        rows.append(
            f"({p[0]}, {p[1]}, {p[2]}, {p[3]}, transaction_timestamp(), {p[4]}, {p[5]}, "
            f"{p[6]}, {p[7]}, NULL, NULL, NULL, NULL, false)"
        )
    return sql.SQL(
        "INSERT INTO {table} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
        "writer, event_ser_id, event_ser_manifest, event_payload, tags, "
        "meta_ser_id, meta_ser_manifest, meta_payload, deleted) VALUES "
    ).format(table=table).as_string() + ", ".join(rows)


def raw_params(pid: str, slice_: int, after_seq_nr: int, events: list[Any]) -> list[Any]:
    """The parameters of `raw_insert_sql` for `events` stored as seq_nr `after_seq_nr + 1 ..`."""
    params: list[Any] = []
    for n, event in enumerate(events, start=1):
        params += (
            slice_,
            ENTITY_TYPE,
            pid,
            after_seq_nr + n,
            WRITER_ID,
            JSON_SERIALIZER_ID,
            "",
            serialize(event),
        )
    return params


def raw_writer(
    conn: psycopg.AsyncConnection[Any], tables: Tables, pids: PidRotation, batch: int
) -> Operation:
    events = [EVENT] * batch
    insert = raw_insert_sql(tables.journal, batch)
    cursor = psycopg.AsyncRawCursor(conn)

    async def append() -> int:
        i = pids.next()
        pid, slice_, seq_nr = pids.pids[i], pids.slices[i], pids.seq_nrs[i]
        await cursor.execute(insert, raw_params(pid, slice_, seq_nr, events))
        pids.seq_nrs[i] = seq_nr + batch
        return batch

    return append


def statement_writer(
    conn: psycopg.AsyncConnection[Any], tables: Tables, pids: PidRotation, batch: int
) -> Operation:
    """The journal's append statement and its parameters, run as the journal runs it
    (prepared, through libpq, up to `MAX_VALUES_EVENTS` events; else a raw cursor)."""
    statements = WriterSql.of(tables)
    events = (EVENT,) * batch

    async def append() -> int:
        i = pids.next()
        pid, seq_nr = pids.pids[i], pids.seq_nrs[i]
        payloads = tuple(SerializedPayload(JSON_SERIALIZER_ID, "", serialize(e)) for e in events)
        prepared = PreparedAppend(
            pid, ENTITY_TYPE, pids.slices[i], seq_nr, events, payloads, (), None, None
        )
        statement, values = statements.append_call(prepared, WRITER_ID)
        if await prepared_statements.first_row(conn, statement, values, prepared=True) is None:
            raise RuntimeError(f"{pid}: expected_seq_nr {seq_nr} was not current")
        pids.seq_nrs[i] = seq_nr + batch
        return batch

    return append


async def run_journal(
    dsn: str, case: Case, timing: Timing, *, statements: int | Literal["auto"] | None
) -> Measured:
    """`Journal.append` from `case.writers` writers (pool `writers + 2`) at the given
    `append_statements`; the stored rows are checked against the rate."""
    schema = fresh_schema("bench_journal")
    settings = JournalSettings(
        schema=schema,
        pool_max_size=case.writers + 2,
        writer_id=WRITER_ID,
        append_statements=statements,
    )
    try:
        async with Journal.connect(dsn, settings, create_schema=True) as journal:
            workers = [
                journal_writer(journal, PidRotation(w), case.batch) for w in range(case.writers)
            ]
            rate = await measure_after_checkpoint(dsn, workers, timing)
        await check_row_count(dsn, Tables(settings).journal, rate)
        return rate
    finally:
        await drop_schema(dsn, schema)


def journal_writer(journal: Journal, pids: PidRotation, batch: int) -> Operation:
    events = [EVENT] * batch

    async def append() -> int:
        i = pids.next()
        await journal.append(pids.pids[i], events, expected_seq_nr=pids.seq_nrs[i])
        pids.seq_nrs[i] += batch
        return batch

    return append


@dataclass(frozen=True)
class Measured(Rate):
    """A `Rate` with the client CPU time (`time.process_time`) spent in its timed window."""

    cpu_seconds: float = 0.0

    def cpu_us_per_op(self, batch: int) -> float:
        """Client CPU microseconds per operation (`batch` items each)."""
        ops = self.items / batch
        return 1e6 * self.cpu_seconds / ops if ops else 0.0


async def measure_after_checkpoint(dsn: str, workers: list[Operation], timing: Timing) -> Measured:
    """`measure_with_cpu` after a checkpoint."""
    await checkpoint(dsn)
    return await measure_with_cpu(workers, timing)


async def measure_with_cpu(workers: list[Operation], timing: Timing) -> Measured:
    """`measure`, plus this process's CPU time over (very nearly) the same timed window:
    a sampler sleeps through the same warm-up and window beside the workers."""
    cpu: list[float] = []

    async def sample() -> None:
        await asyncio.sleep(timing.warmup)
        cpu.append(time.process_time())
        await asyncio.sleep(timing.seconds)
        cpu.append(time.process_time())

    sampler = asyncio.create_task(sample())
    try:
        rate = await measure(workers, warmup=timing.warmup, seconds=timing.seconds)
    finally:
        await asyncio.wait([sampler], timeout=timing.seconds + timing.warmup)
        sampler.cancel()
    used = cpu[1] - cpu[0] if len(cpu) == 2 else float("nan")
    return Measured(rate.items, rate.seconds, rate.total, used)


async def check_row_count(dsn: str, table: sql.Composable, rate: Rate) -> None:
    """The table must hold exactly the events the workers reported (warm-up included)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        stored = await count_rows(conn, table)
    if stored != rate.total:
        raise RuntimeError(f"{table!r}: {stored} rows stored, {rate.total} events reported")


# -- driver ---------------------------------------------------------------------------


async def run_variant(variant: str, dsn: str, case: Case, timing: Timing) -> Measured:
    if case.processes > 1:
        return await run_in_processes(variant, dsn, case, timing)
    if variant == RAW:
        return await run_raw(dsn, case, timing, raw_writer)
    if variant == SQL_ONLY:
        return await run_raw(dsn, case, timing, statement_writer)
    return await run_journal(dsn, case, timing, statements="auto" if variant == JOURNAL else None)


# -- several processes at once ------------------------------------------------------------

CHILD = "--child"  # argv[1] of a writer process; argv[2] is its `ChildSpec` as JSON
START_DELAY = 3.0  # seconds from spawning the processes to their common start (imports, pools)


@dataclass(frozen=True)
class ChildSpec:
    variant: str
    dsn: str
    schema: str
    writers: int
    batch: int
    first_writer: int  # its writers' indexes (and so persistence ids) start here
    warmup: float
    seconds: float
    start_at: float  # time.time() at which every process starts its warm-up


async def run_in_processes(variant: str, dsn: str, case: Case, timing: Timing) -> Measured:
    """`variant` in `case.processes` processes over one fresh schema; the sum of their rates."""
    schema = fresh_schema("bench_procs")
    settings = JournalSettings(schema=schema)
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await migrate(conn, settings)
        await checkpoint(dsn)
        start_at = time.time() + START_DELAY
        specs = [
            ChildSpec(variant, dsn, schema, case.writers, case.batch, p * case.writers,
                      timing.warmup, timing.seconds, start_at)
            for p in range(case.processes)
        ]  # fmt: skip
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable, __file__, CHILD, json.dumps(spec.__dict__),
                stdout=asyncio.subprocess.PIPE,
            )
            for spec in specs
        ]  # fmt: skip
        outputs = await asyncio.gather(*(child.communicate() for child in children))
        if any(child.returncode for child in children):
            codes = [child.returncode for child in children]
            raise RuntimeError(f"{variant}: writer process exit codes {codes}")
        runs = [json.loads(out.decode().splitlines()[-1]) for out, _ in outputs]
        seconds = statistics.mean(r["seconds"] for r in runs)
        rate = Measured(
            # Each process's rate over its own window (the windows start together).
            items=round(sum(r["items"] / r["seconds"] for r in runs) * seconds),
            seconds=seconds,
            total=sum(r["total"] for r in runs),
            cpu_seconds=sum(r["cpu_seconds"] for r in runs),
        )
        await check_row_count(dsn, Tables(settings).journal, rate)
        return rate
    finally:
        await drop_schema(dsn, schema)


async def run_child(spec: ChildSpec) -> None:
    """A writer process: `spec.writers` writers of `spec.variant`, timed from `start_at`;
    prints its `Measured` as JSON on the last line."""
    timing = Timing(warmup=spec.warmup, seconds=spec.seconds, rounds=1)
    indexes = range(spec.first_writer, spec.first_writer + spec.writers)
    async with contextlib.AsyncExitStack() as stack:
        if spec.variant in (RAW, SQL_ONLY):
            writer = raw_writer if spec.variant == RAW else statement_writer
            tables = Tables(JournalSettings(schema=spec.schema))
            workers = []
            for w in indexes:
                conn = await psycopg.AsyncConnection.connect(spec.dsn, autocommit=True)
                stack.push_async_callback(conn.close)
                workers.append(writer(conn, tables, PidRotation(w), spec.batch))
        else:
            settings = JournalSettings(
                schema=spec.schema, pool_max_size=spec.writers + 2, writer_id=WRITER_ID,
                append_statements=(
                    "auto" if spec.variant == JOURNAL else None
                ),
            )  # fmt: skip
            journal = await stack.enter_async_context(Journal.connect(spec.dsn, settings))
            workers = [journal_writer(journal, PidRotation(w), spec.batch) for w in indexes]
        await asyncio.sleep(max(0.0, spec.start_at - time.time()))
        rate = await measure_with_cpu(workers, timing)
    print(json.dumps(rate.__dict__), flush=True)


@dataclass
class CaseResults:
    """Per variant, each round's events/s and client CPU us per append."""

    rates: dict[str, list[float]]
    cpu: dict[str, list[float]]


async def run_case(dsn: str, case: Case, timing: Timing) -> CaseResults:
    results = CaseResults({v: [] for v in VARIANTS}, {v: [] for v in VARIANTS})
    for round_ in range(timing.rounds):
        order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            rate = await run_variant(variant, dsn, case, timing)
            results.rates[variant].append(rate.per_second)
            results.cpu[variant].append(rate.cpu_us_per_op(case.batch))
            print(
                f"  {case.name:<22} round {round_ + 1}  {variant:<19}"
                f"{format_rate(rate.per_second):>10} events/s"
                f"{rate.cpu_us_per_op(case.batch):>9.1f} us CPU/append",
                flush=True,
            )
    rates = results.rates
    if timing.rounds > 1:
        paired = [j / r for j, r in zip(rates[JOURNAL], rates[RAW], strict=True)]
        own = [j / q for j, q in zip(rates[JOURNAL], rates[SQL_ONLY], strict=True)]
        ceiling = [q / r for q, r in zip(rates[SQL_ONLY], rates[RAW], strict=True)]
        grouping = [j / q for j, q in zip(rates[JOURNAL], rates[UNGROUPED], strict=True)]
        print(
            f"  {case.name:<22} per round: journal/raw "
            f"{', '.join(map(format_ratio, paired))}; journal/SQL "
            f"{', '.join(map(format_ratio, own))}; SQL/raw "
            f"{', '.join(map(format_ratio, ceiling))}; grouped/ungrouped "
            f"{', '.join(map(format_ratio, grouping))}",
            flush=True,
        )
    return results


def cpu_rows(results: dict[Case, CaseResults]) -> list[list[str]]:
    rows = []
    for case, runs in results.items():
        raw, statement, journal, quiet = (statistics.median(runs.cpu[v]) for v in VARIANTS)
        rows.append(
            [
                case.name,
                f"{raw:.1f}",
                f"{statement:.1f}",
                f"{journal:.1f}",
                f"{quiet:.1f}",
                f"{journal - statement:.1f}",
                format_ratio(journal / raw) if raw else "-",
            ]
        )
    return rows


def summary_rows(results: dict[Case, CaseResults]) -> list[list[str]]:
    rows = []
    for case, case_runs in results.items():
        runs = case_runs.rates
        raw, statement, journal, quiet = (best(runs[v]) for v in VARIANTS)
        rows.append(
            [
                case.name,
                format_rate(raw),
                format_rate(statement),
                format_ratio(statement / raw),
                format_rate(journal),
                format_ratio(journal / raw),
                format_ratio(journal / statement),
                format_ratio(quiet / raw),
                format_ratio(journal / quiet),
                f"{max(spread(runs[v]) for v in VARIANTS):.0%}" if len(runs[RAW]) > 1 else "-",
                "yes" if journal / raw >= GOAL else "NO",
            ]
        )
    return rows


async def main_async(timing: Timing, dsn_arg: str | None) -> int:
    return await run_cases(CASES, timing, dsn_arg)


async def run_cases(cases: tuple[Case, ...], timing: Timing, dsn_arg: str | None) -> int:
    started = time.perf_counter()
    with database(dsn_arg) as db:
        await print_environment(db)
        print(
            f"timing:   {timing.warmup:g} s warm-up + {timing.seconds:g} s measured per run, "
            f"{timing.rounds} round(s) of {', '.join(VARIANTS)} per case, best run shown"
        )
        print(f"workload: {PIDS_PER_WRITER} persistence ids per writer, event {json.dumps(EVENT)}")
        print(flush=True)
        results = {case: await run_case(db.dsn, case, timing) for case in cases}
    print()
    print_table(
        [
            "case",
            "raw ev/s",
            "SQL ev/s",
            "SQL/raw",
            "journal ev/s",
            "journal/raw",
            "journal/SQL",
            "ungrouped/raw",
            "grouped/ungrouped",
            "spread",
            f">= {GOAL}",
        ],
        summary_rows(results),
    )
    print()
    print_table(
        [
            "case",
            "raw us/append",
            "SQL us/append",
            "journal us/append",
            "ungrouped us/append",
            "journal - SQL",
            "journal/raw CPU",
        ],
        cpu_rows(results),
    )
    print(
        "us/append: client CPU (time.process_time of this process) per append call or "
        "statement over the timed window, median of the rounds;\njournal - SQL: the "
        "library's own CPU per append beyond issuing its statement."
    )
    ratios = [best(r.rates[JOURNAL]) / best(r.rates[RAW]) for r in results.values()]
    met = sum(ratio >= GOAL for ratio in ratios)
    print()
    print(
        "events/s: best run of each variant; the ratios are of those bests. SQL: the journal's "
        "append statement alone, on dedicated connections (the ceiling for journal/raw);\n"
        "grouped/ungrouped: journal / journal with append_statements=None (no group commit);\n"
        "spread: the largest (max - min) / median over the runs of one variant in the case "
        "(high = noisy machine, read with care)."
    )
    print(
        f"goal journal/raw >= {GOAL} with NOTIFY on: met in {met} of {len(ratios)} cases; "
        f"total time {time.perf_counter() - started:.0f} s"
    )
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Timing]:
    return parse_timed_args(
        __doc__,
        seconds_help="measured seconds per run (default 5)",
        rounds_help="interleaved runs of each variant (default 2)",
        argv=argv,
    )


def parse_cases(argv: list[str]) -> tuple[tuple[Case, ...], list[str]]:
    """`--cases WxB,...` (default: every case) and the remaining arguments."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cases", default="")
    known, rest = parser.parse_known_args(argv)
    if not known.cases:
        return CASES, rest
    cases = []
    for spec in known.cases.split(","):
        parts = spec.split("x")
        if len(parts) == 2:
            parts.insert(0, "1")
        if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            sys.exit(f"--cases: {spec!r} is not [PROCESSESx]WRITERSxBATCH (e.g. 8x1, 4x8x1)")
        processes, writers, batch = map(int, parts)
        cases.append(Case(writers, batch, processes))
    return tuple(cases), rest


def main() -> int:
    if sys.argv[1:2] == [CHILD]:
        asyncio.run(run_child(ChildSpec(**json.loads(sys.argv[2]))))
        return 0
    cases, rest = parse_cases(sys.argv[1:])
    return run(parse_args(rest), lambda timing, dsn: run_cases(cases, timing, dsn))


if __name__ == "__main__":
    sys.exit(main())

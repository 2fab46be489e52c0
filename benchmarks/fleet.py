"""The projection fleet: failover after SIGKILL, pause during a rescale, catch-up throughput.

    .venv/bin/python benchmarks/fleet.py [--dsn DSN] [--lease-ttl 2] [--kills 5] [--rate 200]
                                         [--events 100000] [--rounds 2] [--quick]
                                         [--throughput-only [--instances 4] [--workers 1,2,4]]

Workers are real `python -m slicejournal.cli worker fleet:projection` processes
(cwd `benchmarks/`, so this file is the factory module they import; the
environment variable SLICEJOURNAL_BENCH_FLEET_RUN tells them which projection
and read-model table of the run to use). The projection is grouped exactly-once
(`group_after_envelopes=20`, `group_after_duration=100 ms`,
`management_poll_interval=100 ms`, other settings default); its handler inserts
one row per event with one `INSERT ... SELECT * FROM unnest(<5 arrays>)` per
batch into a table with PRIMARY KEY (pid, seq_nr) (an event applied twice fails
its transaction) and a column `applied_at DEFAULT clock_timestamp()`. Every
time compared with a database timestamp is the database's clock.

Failover and rescale run in one fresh schema: a writer in this process appends
single events `{"amount": n, "note": "deposit"}` to random ones of 1,000 ids at
a steady `--rate`, while 3 workers (lease TTL T = `--lease-ttl`) run the
projection over 4 ranges.

- failover, `--kills` times: the worker owning the most ranges (2 of 4) is
  SIGKILLed. Measured from the kill, by polling every 20 ms: "taken over" =
  every range it owned has a live lease (unexpired, its owner a live worker) of
  another worker with `running` true; "processing" (the failover time) = that,
  and in every such range an event appended after the kill (db_timestamp later
  than the database clock read once the killed process was reaped, so only the
  new owner can have applied it) has been applied. That includes the normal
  pipeline (behind_current_time 100 ms, a batch of up to 100 ms; see the
  steady-state apply lag). Then a replacement worker starts and the fleet
  converges again (balanced 2/1/1) before the next kill. Goal: failover
  <= 2.0 x T (p50 and max).
- rescale: the same 3 workers, `FleetControl.scale` 4 -> 8, wait until
  converged, then 8 -> 4. The lease table is sampled every 20 ms (one
  statement, database clock) from 0.5 s before the scale until 0.5 s after
  convergence. A slice is covered when a live lease row (owner set, unexpired)
  with `running` true contains it; its gap is its longest stretch from the
  first sample that saw it uncovered to the next sample that saw it covered
  again (so a gap shorter than a sample interval may go unseen). p50/p99/max
  over the 1024 slices; goal: p99 <= one lease poll interval (min(1 s, T/4)) +
  one batch (100 ms). The lease table cannot show the time an instance that
  moves takes to stop (finish its batch, save offsets): its row keeps `running`
  true until the claim that replaces it, so the apply lag (append -> row
  inserted) of the events appended during the rescale is shown as well, with
  the steady state's for comparison.

Throughput, in a second fresh schema: `--events` events (5,000 ids spread over
all slices, db_timestamps over the last 4 minutes) are bulk-inserted once. Each
run uses a new projection name and a new table; the projection is paused first
(`ProjectionManagement.pause`), then started: either an in-process
`ProjectionGroup` of 4 instances (the baseline, pool_max_size 20 as a worker's
journal) or 1, 2 or 4 worker processes (`--instances 4`), which are timed until
converged and balanced ("startup"). After 1 s more (every instance has read
ahead as far as its buffers allow: its queue of 1,000 envelopes and part of the
query's current chunk, the same for every variant; in `--quick` runs that is
most of the 10k events), the projection is resumed; the run lasts from the resume until the
last row was inserted (max(applied_at); its batch commits milliseconds later).
Variants are interleaved (reversed every other round); the best of `--rounds`
is shown. No goal is set for throughput: the ratios are informational.
`--throughput-only` skips failover and rescale; with it, `--instances` and
`--workers` set the number of ranges (for the group too) and the worker counts
compared (on a machine with more cores: `--instances 8 --workers 1,2,4,8`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    add_dsn_argument,
    best,
    bulk_pids,
    checkpoint,
    count_rows,
    database,
    drop_schema,
    format_ms,
    format_rate,
    format_ratio,
    fresh_schema,
    insert_catch_up_events,
    percentile,
    print_environment,
    print_table,
    run,
    spread,
)
from psycopg import AsyncConnection, sql

from journal import EventEnvelope, Journal, JournalSettings, SliceRange
from journal.tables import Tables
from projections import Projection, ProjectionGroup, ProjectionSettings, UnknownProjection
from projections.aio.fleet_control import FleetControl
from projections.aio.management import ProjectionManagement
from projections.fleet.status import FleetStatus
from projections.tables import ProjectionTables
from slicejournal.examples.worker_processes import WorkerProcesses

BENCH_DIR = Path(__file__).resolve().parent
FACTORY = "fleet:projection"  # this module, imported by the workers from BENCH_DIR
RUN_ENV = "SLICEJOURNAL_BENCH_FLEET_RUN"
LIVE = "live"

ENTITY_TYPE = "FleetBench"
INSTANCES = 4
GROUP = 20
BATCH = 0.1  # group_after_duration, seconds
SETTINGS = ProjectionSettings(
    group_after_envelopes=GROUP,
    group_after_duration=timedelta(seconds=BATCH),
    management_poll_interval=timedelta(milliseconds=100),
)
LIVE_PIDS = 1_000
PIDS = 5_000
SPAN_SECONDS = 240.0
SAMPLE = 0.02  # seconds between lease-table samples / failover polls
SETTLE = 1.0
FAILOVER_GOAL = 2.0  # x T
WORKER_COUNTS = (1, 2, 4)
BASELINE = "group"


# -- the projection the workers run --------------------------------------------------------


def projection_name(run_tag: str) -> str:
    return f"bench-fleet-{run_tag}"


def applied_table(schema: str, run_tag: str) -> sql.Identifier:
    return sql.Identifier(schema, f"applied_{run_tag}")


def make_projection(journal: Journal, slice_range: SliceRange, run_tag: str) -> Projection:
    """The grouped exactly-once projection of run `run_tag`: one row per event."""
    insert = sql.SQL(
        "INSERT INTO {} (pid, seq_nr, slice, db_timestamp, amount) "
        "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::int[], %s::timestamptz[], "
        "%s::bigint[])"
    ).format(applied_table(journal.settings.schema, run_tag))

    async def handler(conn: AsyncConnection[Any], envs: list[EventEnvelope]) -> None:
        await conn.execute(
            insert,
            (
                [e.persistence_id for e in envs],
                [e.seq_nr for e in envs],
                [e.slice for e in envs],
                [e.db_timestamp for e in envs],
                [e.event["amount"] for e in envs],
            ),
        )

    return Projection.grouped(
        journal,
        name=projection_name(run_tag),
        entity_type=ENTITY_TYPE,
        slice_range=slice_range,
        handler=handler,
        settings=SETTINGS,
    )


def projection(journal: Journal, slice_range: SliceRange) -> Projection:
    """The factory of `slicejournal worker fleet:projection` (run tag from the environment)."""
    run_tag = os.environ.get(RUN_ENV)
    if not run_tag:
        raise RuntimeError(f"${RUN_ENV} is not set: workers are started by benchmarks/fleet.py")
    return make_projection(journal, slice_range, run_tag)


async def create_applied(dsn: str, schema: str, run_tag: str, *, by_time: bool = False) -> None:
    """The read model of one run; `by_time` adds an index for the failover polls."""
    table = applied_table(schema, run_tag)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (pid text NOT NULL, seq_nr bigint NOT NULL, slice int NOT NULL, "
                "db_timestamp timestamptz NOT NULL, amount bigint NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
                "PRIMARY KEY (pid, seq_nr))"
            ).format(table)
        )
        if by_time:
            await conn.execute(sql.SQL("CREATE INDEX ON {} (db_timestamp)").format(table))


# -- worker processes -------------------------------------------------------------------------


def worker_processes(
    dsn: str, schema: str, run_tag: str, ttl: float, logs: Path, instances: int = INSTANCES
) -> WorkerProcesses:
    """The worker subprocesses of one run, by worker id; logs in `logs/`. They run this
    module's `projection` (cwd `BENCH_DIR`) and die with the benchmark."""
    return WorkerProcesses(
        FACTORY,
        dsn=dsn,
        schema=schema,
        lease_ttl=ttl,
        logs=logs,
        log_prefix=f"{run_tag}-",
        cwd=BENCH_DIR,
        env={**os.environ, RUN_ENV: run_tag},
        tied=True,
        instances=instances,
    )


def balanced(status: FleetStatus, workers: int, instances: int, without: str | None = None) -> bool:
    """Converged on `instances` ranges over exactly `workers` live workers, 1 apart at most."""
    owners = [r.owner for r in status.ranges]
    counts = [owners.count(w) for w in status.workers]
    return (
        status.converged
        and status.instances == instances
        and len(status.workers) == workers
        and without not in status.workers
        and all(owner in status.workers for owner in owners)
        and max(counts) - min(counts) <= 1
    )


def describe(status: FleetStatus | None) -> str:
    if status is None:
        return "not registered"
    ranges = ", ".join(
        f"{r.slice_range}: {r.owner or '-'}{'' if r.running else ' (not running)'}"
        for r in status.ranges
    )
    return f"{status.instances} ranges, workers {list(status.workers)}; {ranges}"


async def wait_balanced(
    control: FleetControl,
    fleet: WorkerProcesses,
    name: str,
    *,
    workers: int,
    instances: int = INSTANCES,
    without: str | None = None,
    within: float = 90.0,
) -> FleetStatus:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    status: FleetStatus | None = None
    while True:
        fleet.check()
        with contextlib.suppress(UnknownProjection):
            status = await control.status(name)
            if balanced(status, workers, instances, without):
                return status
        if loop.time() > deadline:
            raise RuntimeError(
                f"{name} did not converge on {instances} ranges over {workers} workers "
                f"within {within:g} s: {describe(status)}"
            )
        await asyncio.sleep(0.1)


# -- database clock, writer, apply lag --------------------------------------------------------


async def db_now(conn: AsyncConnection[Any]) -> datetime:
    cur = await conn.execute("SELECT clock_timestamp()")
    row = await cur.fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


class SteadyWriter:
    """Appends one event every 1/rate s (absolute schedule) to random ones of 1,000 ids."""

    def __init__(self, journal: Journal, rate: float) -> None:
        self.journal, self.rate = journal, rate
        self.appended = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0
        self._stopped = 0.0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="writer")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(7)
        names = bulk_pids(ENTITY_TYPE, LIVE_PIDS, seed=7)
        seq = dict.fromkeys(names, 0)
        self._started = loop.time()
        i = 0
        while not self._stop.is_set():
            delay = self._started + i / self.rate - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                continue
            pid = rng.choice(names)
            await self.journal.append(
                pid, [{"amount": i % 100, "note": "deposit"}], expected_seq_nr=seq[pid]
            )
            seq[pid] += 1
            self.appended += 1
            i += 1
        self._stopped = loop.time()

    def check(self) -> None:
        if self._task is not None and self._task.done():
            self._task.result()
            raise RuntimeError("the writer stopped on its own")

    async def stop(self) -> float:
        """Stop; the achieved rate (appends/s)."""
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.appended / max(1e-9, self._stopped - self._started)


@dataclass(frozen=True)
class Lag:
    events: int
    p50: float
    p99: float
    max: float


async def apply_lag(
    conn: AsyncConnection[Any], tables: Tables, applied: sql.Identifier, since: float, until: float
) -> Lag:
    """Append -> row inserted, of the events appended in [since, until] (database epoch
    seconds), once all of them are applied (at most 30 s of waiting)."""
    window = (since, until)
    count = sql.SQL(
        "SELECT count(*) FROM {} WHERE entity_type = %s "
        "AND db_timestamp BETWEEN to_timestamp(%s) AND to_timestamp(%s)"
    ).format(tables.journal)
    lags = sql.SQL(
        "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), "
        "percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), max(lag) FROM ("
        "SELECT extract(epoch FROM applied_at - db_timestamp)::float8 AS lag FROM {} "
        "WHERE db_timestamp BETWEEN to_timestamp(%s) AND to_timestamp(%s)) s"
    ).format(applied)
    deadline = time.monotonic() + 30
    while True:
        cur = await conn.execute(count, (ENTITY_TYPE, *window))
        expected = (await cur.fetchone() or (0,))[0]
        cur = await conn.execute(lags, window)
        row = await cur.fetchone()
        assert row is not None
        if row[0] >= expected or time.monotonic() > deadline:
            if row[0] < expected:
                raise RuntimeError(f"only {row[0]} of {expected} events were applied in 30 s")
            nan = float("nan")
            return Lag(row[0], row[1] or nan, row[2] or nan, row[3] or nan)
        await asyncio.sleep(0.2)


# -- (a) failover -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Failover:
    victim: str
    ranges: int
    taken_over: float  # seconds from SIGKILL
    processing: float


class LiveFleet:
    """What the failover and rescale measurements share."""

    def __init__(self, journal: Journal, fleet: WorkerProcesses, ttl: float) -> None:
        self.journal, self.fleet, self.ttl = journal, fleet, ttl
        self.control = FleetControl(journal)
        self.name = projection_name(LIVE)
        self.tables = journal.tables
        self.applied = applied_table(journal.settings.schema, LIVE)
        self.next_worker = 1

    async def add_worker(self) -> str:
        worker_id = f"w{self.next_worker}"
        self.next_worker += 1
        self.fleet.start(worker_id)
        return worker_id

    async def converge(self, instances: int = INSTANCES, without: str | None = None) -> FleetStatus:
        return await wait_balanced(
            self.control, self.fleet, self.name, workers=3, instances=instances, without=without
        )


async def failover_once(live: LiveFleet, conn: AsyncConnection[Any], number: int) -> Failover:
    status = await live.control.status(live.name)
    owned = Counter(r.owner for r in status.ranges if r.owner is not None)
    victim = max(sorted(owned), key=lambda w: owned[w])
    ranges = {r.slice_range for r in status.ranges if r.owner == victim}
    poll = sql.SQL(
        "SELECT l.min_slice, l.max_slice, "
        "l.owner IS NOT NULL AND l.owner <> %(victim)s AND l.running "
        "AND l.expires_at > clock_timestamp() AND EXISTS (SELECT 1 FROM {w} w "
        "WHERE w.projection_name = l.projection_name AND w.worker_id = l.owner "
        "AND w.expires_at > clock_timestamp()), "
        "EXISTS (SELECT 1 FROM {a} a WHERE a.db_timestamp > %(killed)s "
        "AND a.slice BETWEEN l.min_slice AND l.max_slice) "
        "FROM {l} l WHERE l.projection_name = %(name)s"
    ).format(
        w=ProjectionTables(live.tables).fleet_worker,
        a=live.applied,
        l=ProjectionTables(live.tables).lease,
    )

    started = time.perf_counter()
    live.fleet.kill(victim)
    killed = await db_now(conn)  # reaped: nothing appended after this can be its work
    taken: dict[SliceRange, float] = {}
    done: dict[SliceRange, float] = {}
    limit = 10 * live.ttl + 30
    params = {"victim": victim, "killed": killed, "name": live.name}
    while len(done) < len(ranges):
        cur = await conn.execute(poll, params)
        rows = await cur.fetchall()
        now = time.perf_counter() - started
        for lo, hi, owned_by_other, fresh in rows:
            r = SliceRange(lo, hi)
            if r in ranges and owned_by_other:
                taken.setdefault(r, now)
                if fresh:
                    done.setdefault(r, now)
        if now > limit:
            raise RuntimeError(
                f"kill {number}: the ranges of {victim} were not processed again within "
                f"{limit:g} s: {describe(await live.control.status(live.name))}"
            )
        live.fleet.check()
        await asyncio.sleep(SAMPLE)
    return Failover(victim, len(ranges), max(taken.values()), max(done.values()))


async def measure_failovers(live: LiveFleet, kills: int) -> list[Failover]:
    results = []
    async with await psycopg.AsyncConnection.connect(live.journal.dsn, autocommit=True) as conn:
        for number in range(1, kills + 1):
            failover = await failover_once(live, conn, number)
            results.append(failover)
            print(
                f"  kill {number}: {failover.victim} (owned {failover.ranges} of {INSTANCES} "
                f"ranges): taken over after {failover.taken_over:.2f} s, processing after "
                f"{failover.processing:.2f} s = {failover.processing / live.ttl:.2f} x T",
                flush=True,
            )
            replacement = await live.add_worker()
            await live.converge(without=failover.victim)
            print(f"          {replacement} started, converged again", flush=True)
            await asyncio.sleep(SETTLE)
    return results


# -- (b) rescale ------------------------------------------------------------------------------


@dataclass
class LeaseSampler:
    """Samples, every SAMPLE s, the slice ranges with a live, running lease."""

    dsn: str
    tables: Tables
    name: str
    samples: list[tuple[float, list[tuple[int, int]]]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        query = sql.SQL(
            "SELECT extract(epoch FROM clock_timestamp())::float8, "
            "coalesce(array_agg(min_slice), '{{}}'), coalesce(array_agg(max_slice), '{{}}') "
            "FROM {} WHERE projection_name = %s AND owner IS NOT NULL AND running "
            "AND expires_at > clock_timestamp()"
        ).format(ProjectionTables(self.tables).lease)
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                cur = await conn.execute(query, (self.name,))
                row = await cur.fetchone()
                assert row is not None
                self.samples.append((row[0], list(zip(row[1], row[2], strict=True))))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), SAMPLE)


def slice_gaps(samples: Sequence[tuple[float, list[tuple[int, int]]]]) -> tuple[list[float], int]:
    """Per slice, its longest stretch without a running owner (see the docstring); and how
    many slices were still uncovered at the last sample."""
    gaps = [0.0] * 1024
    since: list[float | None] = [None] * 1024
    for t, ranges in samples:
        covered = bytearray(1024)
        for lo, hi in ranges:
            covered[lo : hi + 1] = b"\x01" * (hi - lo + 1)
        for s in range(1024):
            start = since[s]
            if covered[s]:
                if start is not None:
                    gaps[s] = max(gaps[s], t - start)
                    since[s] = None
            elif start is None:
                since[s] = t
    end = samples[-1][0] if samples else 0.0
    open_gaps = 0
    for s, start in enumerate(since):
        if start is not None:
            gaps[s] = max(gaps[s], end - start)
            open_gaps += 1
    return gaps, open_gaps


@dataclass(frozen=True)
class Rescale:
    label: str
    seconds: float  # scale() -> converged and balanced
    gaps: list[float]
    open_gaps: int
    samples: int
    mean_interval: float
    lag: Lag


async def rescale(live: LiveFleet, before: int, after: int) -> Rescale:
    sampler = LeaseSampler(live.journal.dsn, live.tables, live.name)
    task = asyncio.create_task(sampler.run(), name="lease sampler")
    try:
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        await live.control.scale(live.name, after)
        await live.converge(instances=after)
        seconds = time.perf_counter() - started
        await asyncio.sleep(0.5)
    finally:
        sampler.stop.set()
        await task
    samples = sampler.samples
    gaps, open_gaps = slice_gaps(samples)
    first, last = samples[0][0], samples[-1][0]
    async with await psycopg.AsyncConnection.connect(live.journal.dsn, autocommit=True) as conn:
        lag = await apply_lag(conn, live.tables, live.applied, first, last)
    return Rescale(
        f"{before} -> {after}",
        seconds,
        gaps,
        open_gaps,
        len(samples),
        (last - first) / max(1, len(samples) - 1),
        lag,
    )


# -- (a) + (b) --------------------------------------------------------------------------------


@dataclass
class LiveResults:
    steady: Lag
    failovers: list[Failover]
    rescales: list[Rescale]
    written: float  # achieved appends/s
    checks: list[str]


async def run_live(dsn: str, config: Config, logs: Path) -> LiveResults:
    schema = fresh_schema("bench_fleet")
    settings = JournalSettings(schema=schema, pool_max_size=20)
    fleet = worker_processes(dsn, schema, LIVE, config.ttl, logs)
    try:
        async with Journal.connect(dsn, settings, create_schema=True) as journal:
            await create_applied(dsn, schema, LIVE, by_time=True)
            live = LiveFleet(journal, fleet, config.ttl)
            writer = SteadyWriter(journal, config.rate)
            writer.start()
            try:
                for _ in range(3):
                    await live.add_worker()
                started = time.perf_counter()
                await live.converge()
                print(
                    f"  3 workers converged on {INSTANCES} ranges "
                    f"{time.perf_counter() - started:.1f} s after they were started",
                    flush=True,
                )
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    since = (await db_now(conn)).timestamp()
                    await asyncio.sleep(2 * SETTLE)
                    until = (await db_now(conn)).timestamp()
                    steady = await apply_lag(conn, live.tables, live.applied, since, until)
                print(
                    f"  steady state: apply lag (append -> row inserted) p50 "
                    f"{format_ms(steady.p50)}, p99 {format_ms(steady.p99)} ({steady.events} "
                    "events)",
                    flush=True,
                )
                failovers = await measure_failovers(live, config.kills)
                writer.check()
                print()
                print("== (b) rescale with 3 workers: 4 -> 8, then 8 -> 4", flush=True)
                rescales = []
                for before, after in ((4, 8), (8, 4)):
                    result = await rescale(live, before, after)
                    rescales.append(result)
                    print(
                        f"  {result.label}: converged after {result.seconds:.2f} s; per-slice "
                        f"gap p99 {format_ms(percentile(result.gaps, 99))}, "
                        f"{sum(g > 0 for g in result.gaps)} of 1024 slices had one",
                        flush=True,
                    )
                    await asyncio.sleep(SETTLE)
                writer.check()
            finally:
                written = await writer.stop()
            checks = await live_checks(live, writer.appended)
            codes = await asyncio.to_thread(fleet.stop_all)
            bad = {w: c for w, c in codes.items() if c != (-9 if w in fleet.killed else 0)}
            if bad:
                checks.append(f"unexpected worker exit codes: {bad}")
            return LiveResults(steady, failovers, rescales, written, checks)
    finally:
        fleet.kill_all()
        await drop_schema(dsn, schema)


async def live_checks(live: LiveFleet, appended: int) -> list[str]:
    """Every appended event applied exactly once; no instance restarted or logged an error."""
    problems = []
    status = await live.control.status(live.name)
    restarts = sum(r.restarts for r in status.ranges)
    if restarts:
        problems.append(f"live: {restarts} instance restart(s): {describe(status)}")
    async with await psycopg.AsyncConnection.connect(live.journal.dsn, autocommit=True) as conn:
        stored = 0
        for _ in range(150):
            stored = await count_rows(conn, live.applied)
            if stored >= appended:
                break
            await asyncio.sleep(0.2)
    if stored != appended:
        problems.append(f"live: {appended} events appended, {stored} applied")
    errors = live.fleet.count("ERROR")
    if errors:
        problems.append(f"live: {errors} ERROR line(s) in the worker logs")
    print(f"  worker logs: {live.fleet.count('WARNING')} WARNING, {errors} ERROR line(s)")
    return problems


# -- (c) throughput ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TpRun:
    events: int
    seconds: float  # resume -> last row inserted
    startup: float  # start -> every range running (and balanced)

    @property
    def per_second(self) -> float:
        return self.events / self.seconds


async def timed_apply(
    journal: Journal, run_tag: str, total: int, check: Callable[[], None]
) -> float:
    """Resume the paused projection; seconds until its last row was inserted."""
    name = projection_name(run_tag)
    table = applied_table(journal.settings.schema, run_tag)
    await asyncio.sleep(SETTLE)
    async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
        resumed = await db_now(conn)
        await ProjectionManagement(journal).resume(name)
        deadline = time.monotonic() + 900
        query = sql.SQL("SELECT count(*), min(applied_at), max(applied_at) FROM {}").format(table)
        while True:
            cur = await conn.execute(query)
            count, first, last = await cur.fetchone() or (0, None, None)
            if count >= total:
                break
            check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {count} of {total} events applied after 900 s")
            await asyncio.sleep(0.1)
    if count != total:
        raise RuntimeError(f"{name}: {count} rows for {total} events")
    if first < resumed:
        raise RuntimeError(f"{name}: a row was inserted before the projection was resumed")
    seconds: float = (last - resumed).total_seconds()
    return seconds


async def run_group(journal: Journal, run_tag: str, total: int, instances: int) -> TpRun:
    await ProjectionManagement(journal).pause(projection_name(run_tag))
    started = time.perf_counter()
    group = ProjectionGroup(lambda r: make_projection(journal, r, run_tag), instances)
    await group.start()

    def check() -> None:
        failure = group.failed()
        if failure is not None:
            raise failure

    try:
        while not all(p.running for p in group.projections):
            check()
            await asyncio.sleep(0.01)
        startup = time.perf_counter() - started
        seconds = await timed_apply(journal, run_tag, total, check)
    finally:
        await group.stop()
    return TpRun(total, seconds, startup)


async def run_workers(
    journal: Journal, run_tag: str, total: int, workers: int, config: Config, logs: Path
) -> tuple[TpRun, list[str]]:
    name = projection_name(run_tag)
    control = FleetControl(journal)
    fleet = worker_processes(
        journal.dsn, journal.settings.schema, run_tag, config.ttl, logs, config.instances
    )
    await ProjectionManagement(journal).pause(name)
    started = time.perf_counter()
    problems = []
    try:
        for i in range(workers):
            fleet.start(f"w{i + 1}")
        await wait_balanced(control, fleet, name, workers=workers, instances=config.instances)
        startup = time.perf_counter() - started
        seconds = await timed_apply(journal, run_tag, total, fleet.check)
        status = await control.status(name)
        restarts = sum(r.restarts for r in status.ranges)
        if restarts:
            problems.append(f"{run_tag}: {restarts} instance restart(s)")
        codes = await asyncio.to_thread(fleet.stop_all)
        if any(code != 0 for code in codes.values()):
            problems.append(f"{run_tag}: worker exit codes {codes}")
        errors = fleet.count("ERROR")
        if errors:
            problems.append(f"{run_tag}: {errors} ERROR line(s) in the worker logs")
    finally:
        fleet.kill_all()
    return TpRun(total, seconds, startup), problems


def variant_label(variant: int) -> str:
    return f"{BASELINE} (in-process)" if variant == 0 else f"{variant} worker(s)"


async def run_throughput(
    dsn: str, config: Config, logs: Path
) -> tuple[dict[int, list[TpRun]], list[str]]:
    schema = fresh_schema("bench_fleet_tp")
    settings = JournalSettings(schema=schema, pool_max_size=20)
    variants = (0, *config.workers)  # 0: the in-process group
    results: dict[int, list[TpRun]] = {v: [] for v in variants}
    problems: list[str] = []
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
        async with Journal.connect(dsn, settings) as journal:
            for round_ in range(config.rounds):
                order = variants if round_ % 2 == 0 else tuple(reversed(variants))
                for variant in order:
                    tag = f"r{round_ + 1}_" + (BASELINE if variant == 0 else f"w{variant}")
                    await create_applied(dsn, schema, tag)
                    await checkpoint(dsn)
                    if variant == 0:
                        result = await run_group(journal, tag, total, config.instances)
                    else:
                        result, found = await run_workers(
                            journal, tag, total, variant, config, logs
                        )
                        problems += found
                    results[variant].append(result)
                    print(
                        f"  round {round_ + 1}  {variant_label(variant):<20}"
                        f"{format_rate(result.per_second):>9} events/s  ({result.seconds:.2f} s; "
                        f"startup {result.startup:.2f} s)",
                        flush=True,
                    )
        return results, problems
    finally:
        await drop_schema(dsn, schema)


# -- report -----------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_failovers(failovers: list[Failover], ttl: float) -> list[list[str]]:
    summary = []
    rows = []
    for label, values in (
        ("taken over", [f.taken_over for f in failovers]),
        ("processing (failover)", [f.processing for f in failovers]),
    ):
        p50, worst = percentile(values, 50), max(values)
        rows.append(
            [label, f"{p50:.2f} s", f"{p50 / ttl:.2f}", f"{worst:.2f} s", f"{worst / ttl:.2f}"]
        )
    print_table(["since SIGKILL", "p50", "p50 / T", "max", "max / T"], rows)
    values = [f.processing for f in failovers]
    for label, value in (("p50", percentile(values, 50)), ("max", max(values))):
        ratio = value / ttl
        summary.append(
            [f"failover {label} / T", format_ratio(ratio), f"<= {FAILOVER_GOAL:g}",
             verdict(ratio <= FAILOVER_GOAL)]
        )  # fmt: skip
    return summary


def print_rescales(rescales: list[Rescale], steady: Lag, ttl: float) -> list[list[str]]:
    poll = min(1.0, ttl / 4)
    goal = poll + BATCH
    rows = []
    summary = []
    for r in rescales:
        p99 = percentile(r.gaps, 99)
        rows.append(
            [r.label, f"{r.seconds:.2f} s", format_ms(percentile(r.gaps, 50)), format_ms(p99),
             format_ms(max(r.gaps)), f"{sum(g > 0 for g in r.gaps)}",
             f"{r.samples} / {r.mean_interval * 1000:.0f} ms", format_ms(r.lag.p99),
             format_ms(r.lag.max), verdict(p99 <= goal and not r.open_gaps)]
        )  # fmt: skip
        summary.append(
            [f"rescale {r.label}: slice gap p99", format_ms(p99), f"<= {format_ms(goal)}",
             verdict(p99 <= goal and not r.open_gaps)]
        )  # fmt: skip
    headers = ["rescale", "converged", "gap p50", "gap p99", "gap max", "slices w/ gap",
               "samples / every", "lag p99", "lag max", "goal"]  # fmt: skip
    print_table(headers, rows)
    print(
        f"gap: per slice, longest time without a live running lease (1024 slices). lag: append "
        f"-> applied of the events appended meanwhile; steady state p99 {format_ms(steady.p99)}, "
        f"max {format_ms(steady.max)}.\ngoal p99 gap <= lease poll interval "
        f"({format_ms(poll)}) + one batch ({format_ms(BATCH)}) = {format_ms(goal)}"
    )
    for r in rescales:
        if r.open_gaps:
            print(f"  {r.label}: {r.open_gaps} slice(s) still uncovered at the last sample")
    return summary


def print_throughput(results: dict[int, list[TpRun]]) -> list[list[str]]:
    rates = {v: [r.per_second for r in runs] for v, runs in results.items()}
    baseline = best(rates[0])
    rows = []
    summary = []
    for variant, runs in results.items():
        rate = best(rates[variant])
        rows.append(
            [variant_label(variant), format_rate(rate), format_ratio(rate / baseline),
             f"{min(r.startup for r in runs):.2f} s", f"{spread(rates[variant]):.0%}"]
        )  # fmt: skip
        if variant:
            summary.append(
                [f"throughput {variant} worker(s) / group", format_ratio(rate / baseline),
                 "(none set)", "-"]
            )  # fmt: skip
    print_table(["variant", "best events/s", "this/group", "startup", "spread"], rows)
    print(
        "startup: start -> every range running (workers: processes spawned -> converged and "
        "balanced); not timed in events/s."
    )
    return summary


# -- driver -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    ttl: float
    kills: int
    rate: float
    events: int
    rounds: int
    throughput_only: bool = False
    instances: int = INSTANCES  # ranges in the throughput runs
    workers: tuple[int, ...] = WORKER_COUNTS  # worker counts in the throughput runs


async def main_async(config: Config, dsn_arg: str | None) -> int:
    started = time.perf_counter()
    logs = Path(tempfile.mkdtemp(prefix="slicejournal-bench-fleet-"))
    ok = False
    try:
        with database(dsn_arg) as db:
            await print_environment(db)
            poll = min(1.0, config.ttl / 4)
            print(
                f"fleet:    lease TTL T = {config.ttl:g} s (renewed every T/3, rebalanced every "
                f"{format_ms(poll)}), {config.instances} ranges, group_after_envelopes={GROUP}, "
                f"group_after_duration={format_ms(BATCH)}; worker logs in {logs}"
            )
            print()
            if config.throughput_only:
                code = await throughput_only(db.dsn, config, logs, started)
                ok = code == 0
                return code
            print(
                f"== (a) failover: 3 workers, a writer appending {config.rate:g} events/s; "
                f"{config.kills} x SIGKILL of the worker owning the most ranges",
                flush=True,
            )
            live = await run_live(db.dsn, config, logs)
            print()
            print(
                f"== (c) throughput: {config.events:,} events, a fresh projection per run, "
                f"in-process group of {INSTANCES} vs {', '.join(map(str, config.workers))} "
                f"worker process(es); {config.rounds} interleaved round(s), best shown",
                flush=True,
            )
            throughput, problems = await run_throughput(db.dsn, config, logs)
        print()
        print(f"== (a) failover ({len(live.failovers)} kills, T = {config.ttl:g} s)")
        summary = print_failovers(live.failovers, config.ttl)
        print()
        print("== (b) rescale pause")
        summary += print_rescales(live.rescales, live.steady, config.ttl)
        print()
        print("== (c) throughput")
        summary += print_throughput(throughput)
        print()
        print("== summary")
        print_table(["measure", "value", "goal", "result"], summary)
        print(f"writer: {live.written:,.0f} appends/s achieved (asked {config.rate:g})")
        checks = live.checks + problems
        print("checks: " + ("every event applied once, no restarts, no errors" if not checks
                            else "; ".join(checks)))  # fmt: skip
        print(f"total time {time.perf_counter() - started:.0f} s")
        ok = not checks
        return 0 if ok else 1
    finally:
        if ok:
            shutil.rmtree(logs, ignore_errors=True)
        else:
            print(f"worker logs kept in {logs}", file=sys.stderr)


async def throughput_only(dsn: str, config: Config, logs: Path, started: float) -> int:
    """`--throughput-only`: part (c) alone."""
    print(
        f"== (c) throughput: {config.events:,} events, a fresh projection per run, "
        f"in-process group of {config.instances} vs {', '.join(map(str, config.workers))} "
        f"worker process(es) over {config.instances} ranges; {config.rounds} interleaved "
        "round(s), best shown",
        flush=True,
    )
    throughput, problems = await run_throughput(dsn, config, logs)
    print()
    print_throughput(throughput)
    print("checks: " + ("every event applied once, no restarts, no errors" if not problems
                        else "; ".join(problems)))  # fmt: skip
    print(f"total time {time.perf_counter() - started:.0f} s")
    return 0 if not problems else 1


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_dsn_argument(parser)
    parser.add_argument("--lease-ttl", type=float, default=2.0, help="lease TTL T, s (2)")
    parser.add_argument("--kills", type=int, default=5, help="failovers measured (5)")
    parser.add_argument("--rate", type=float, default=200.0, help="live appends/s (200)")
    parser.add_argument("--events", type=int, default=100_000, help="throughput events (100000)")
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds (2)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 2 kills, 10k events, 1 round"
    )
    parser.add_argument(
        "--throughput-only", action="store_true", help="only part (c), the throughput runs"
    )
    parser.add_argument(
        "--instances", type=int, default=INSTANCES,
        help=f"ranges in the throughput runs ({INSTANCES}; with --throughput-only)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", default=",".join(map(str, WORKER_COUNTS)),
        help="worker process counts compared in the throughput runs (1,2,4; with "
        "--throughput-only)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.lease_ttl <= 0 or args.kills < 1 or args.rate <= 0 or args.rounds < 1:
        parser.error("--lease-ttl > 0, --kills >= 1, --rate > 0, --rounds >= 1")
    workers = tuple(int(w) for w in args.workers.split(",") if w.strip().isdigit())
    if not workers or min(workers) < 1 or args.instances < 1:
        parser.error("--workers: counts >= 1, comma-separated; --instances >= 1")
    if (args.instances, workers) != (INSTANCES, WORKER_COUNTS) and not args.throughput_only:
        parser.error("--instances and --workers go with --throughput-only")
    if args.events < PIDS:
        parser.error(f"--events >= {PIDS}")
    events, rounds = (10_000, 1) if args.quick else (args.events, args.rounds)
    kills = 2 if args.quick else args.kills
    config = Config(
        args.lease_ttl, kills, args.rate, events, rounds,
        args.throughput_only, args.instances, workers,
    )  # fmt: skip
    return args, config


if __name__ == "__main__":
    sys.exit(run(parse_args(), main_async))

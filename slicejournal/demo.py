"""`slicejournal demo`: the whole pipeline on a real (embedded) PostgreSQL.

Concurrent bank-account aggregates persist deposits and withdrawals with
optimistic concurrency and snapshots, while a fleet of three `slicejournal
worker` processes runs a grouped exactly-once projection into a balances
table: 4 slice ranges, rescaled to 8 and then to 2 while the writers run, and
then one worker is killed with SIGKILL and its ranges fail over. At the end
the read model is checked against the aggregates, against a replay of the
journal by slice and event by event (`applied` has no key, so an event
applied twice would be a second row).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import psycopg
from psycopg import AsyncConnection, sql

from journal.aio.aggregate import AggregateRepository
from journal.aio.journal import Journal
from journal.dsn import display_dsn
from journal.errors import JournalError, UnknownProjection
from journal.model import EventEnvelope
from journal.serialization import SerializerRegistry
from journal.settings import JournalSettings
from journal.slices import PersistenceId, SliceRange, slice_ranges
from projections.aio.fleet_control import FleetControl
from projections.aio.runner import Projection
from projections.fleet.status import FleetStatus
from projections.fleet.worker import WorkerApp
from projections.settings import ProjectionSettings
from slicejournal.demo_schema import claim_demo_schema
from slicejournal.fleet_cli import aligned, owner_cell, worker_argv

ENTITY_TYPE = "Account"
READ_MODEL_TABLE = "balances"
APPLIED_TABLE = "applied"
PROJECTION = "balances"


@attrs.frozen
class Deposited:
    amount: int


@attrs.frozen
class Withdrawn:
    amount: int


@attrs.frozen
class Account:
    balance: int = 0


def evolve(state: Account, event: Any) -> Account:
    if isinstance(event, Deposited):
        return Account(state.balance + event.amount)
    if isinstance(event, Withdrawn):
        return Account(state.balance - event.amount)
    raise TypeError(f"unknown event {event!r}")


def bank_serializers() -> SerializerRegistry:
    registry = SerializerRegistry()
    registry.register(Deposited, "bank.Deposited")
    registry.register(Withdrawn, "bank.Withdrawn")
    registry.register(Account, "bank.Account")
    return registry


def decide(rng: random.Random) -> Any:
    def command(state: Account) -> list[Any]:
        amount = rng.randint(1, 100)
        if state.balance >= amount and rng.random() < 0.4:
            return [Withdrawn(amount)]
        return [Deposited(amount)]

    return command


class BalancesReadModel:
    """The projection's target: a row per account, and a row per applied event."""

    def __init__(self, schema: str | None) -> None:
        # schema None: unqualified names, resolved by search_path (what a rebuild needs).
        qualify = (schema,) if schema is not None else ()
        self.balances_table = sql.Identifier(*qualify, READ_MODEL_TABLE)
        self.applied_table = sql.Identifier(*qualify, APPLIED_TABLE)
        self.upsert = sql.SQL(
            "INSERT INTO {t} (account, balance) VALUES (%s, %s) ON CONFLICT (account) "
            "DO UPDATE SET balance = {t}.balance + excluded.balance"
        ).format(t=self.balances_table)
        self.insert_applied = sql.SQL(
            "INSERT INTO {} (pid, seq_nr, db_timestamp) VALUES (%s, %s, %s)"
        ).format(self.applied_table)

    async def create(self, conn: AsyncConnection[Any]) -> None:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {b} "
                "(account text PRIMARY KEY, balance bigint NOT NULL);"
                "CREATE TABLE IF NOT EXISTS {a} (pid text NOT NULL, seq_nr bigint NOT NULL, "
                "db_timestamp timestamptz NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(b=self.balances_table, a=self.applied_table)
        )

    def rows(self, envelopes: list[EventEnvelope]) -> tuple[list[Any], list[Any]]:
        """The parameters of `upsert` (one delta per account) and `insert_applied`."""
        deltas: dict[str, int] = {}
        for env in envelopes:
            event = env.event
            delta = event.amount if isinstance(event, Deposited) else -event.amount
            deltas[env.persistence_id] = deltas.get(env.persistence_id, 0) + delta
        applied = [(e.persistence_id, e.seq_nr, e.db_timestamp) for e in envelopes]
        return list(deltas.items()), applied

    async def handle(self, conn: AsyncConnection[Any], envelopes: list[EventEnvelope]) -> None:
        """A batch of events, in the transaction that also stores their offsets."""
        upserts, applied = self.rows(envelopes)
        async with conn.cursor() as cur:
            await cur.executemany(self.upsert, upserts)
            await cur.executemany(self.insert_applied, applied)

    def handle_sync(self, conn: psycopg.Connection[Any], envelopes: list[EventEnvelope]) -> None:
        """`handle` for a synchronous connection (the Spark executors)."""
        upserts, applied = self.rows(envelopes)
        with conn.cursor() as cur:
            cur.executemany(self.upsert, upserts)
            cur.executemany(self.insert_applied, applied)

    async def balances(self, conn: AsyncConnection[Any]) -> dict[str, int]:
        cur = await conn.execute(
            sql.SQL("SELECT account, balance FROM {}").format(self.balances_table)
        )
        return {a: b for a, b in await cur.fetchall()}

    async def applied(self, conn: AsyncConnection[Any]) -> tuple[int, int]:
        """(rows, distinct events) in the applied table."""
        cur = await conn.execute(
            sql.SQL("SELECT count(*), count(DISTINCT (pid, seq_nr)) FROM {}").format(
                self.applied_table
            )
        )
        rows, distinct = await cur.fetchone() or (0, 0)
        return int(rows), int(distinct)

    async def missing(self, conn: AsyncConnection[Any], journal: sql.Identifier) -> int:
        """Journal events of the demo's entity type that were never applied."""
        cur = await conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {j} e WHERE e.entity_type = %s AND NOT e.deleted "
                "AND NOT EXISTS (SELECT 1 FROM {a} a WHERE a.pid = e.persistence_id "
                "AND a.seq_nr = e.seq_nr)"
            ).format(j=journal, a=self.applied_table),
            (ENTITY_TYPE,),
        )
        return int((await cur.fetchone() or (0,))[0])

    async def lag_ms(self, conn: AsyncConnection[Any]) -> tuple[float, float]:
        """p50 and p99 of applied_at - db_timestamp, in milliseconds."""
        cur = await conn.execute(
            sql.SQL(
                "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY "
                "extract(epoch FROM applied_at - db_timestamp) * 1000) FROM {}"
            ).format(self.applied_table)
        )
        row = await cur.fetchone()
        values = row[0] if row and row[0] else [0.0, 0.0]
        return float(values[0]), float(values[1])


def balances_projection(journal: Journal, slice_range: SliceRange) -> Projection:
    """The factory every demo worker runs: grouped exactly-once into the read model."""
    model = BalancesReadModel(journal.settings.schema)
    return Projection.grouped(
        journal,
        name=PROJECTION,
        entity_type=ENTITY_TYPE,
        slice_range=slice_range,
        handler=model.handle,
        settings=ProjectionSettings(
            group_after_duration=timedelta(milliseconds=100),
            management_poll_interval=timedelta(seconds=1),
        ),
    )


# What each worker runs: `slicejournal worker slicejournal.demo:worker_app`.
worker_app = WorkerApp(balances_projection, serializers=bank_serializers())


# A demo that stalls says so instead of hanging (every step normally takes seconds).
STALL_LIMIT = 60.0
LEASE_TTL = 3.0
WORKERS = 3


@contextlib.asynccontextmanager
async def demo_journal(
    dsn: str | None, settings: JournalSettings
) -> AsyncIterator[tuple[Journal, BalancesReadModel]]:
    """The demo's journal in the schema it claimed (checked before anything is written),
    with the read model's tables created."""
    async with Journal.connect(
        dsn, settings, serializers=bank_serializers(), create_schema=False, check_schema=False
    ) as journal:
        print(f"journal  PostgreSQL at {display_dsn(journal.dsn)}, schema {settings.schema!r}")
        async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
            await claim_demo_schema(conn, settings, (READ_MODEL_TABLE, APPLIED_TABLE))
        await journal.create_schema()
        model = BalancesReadModel(settings.schema)
        async with journal.pool.connection() as conn:
            await model.create(conn)
        yield journal, model


@attrs.frozen
class Verification:
    """The read model checked against the aggregates and a replay of the journal."""

    missing: int
    mismatches: int
    replay_events: int
    replay_seconds: float


class BankWorkload:
    """Concurrent bank-account aggregates and the balances they say they hold."""

    def __init__(self, journal: Journal, accounts: int) -> None:
        self.repo: AggregateRepository[Account, Any] = AggregateRepository(
            journal, initial=Account, evolve=evolve, snapshot_every=20
        )
        self.pids = [PersistenceId.of(ENTITY_TYPE, f"acc-{i}").id for i in range(accounts)]
        self.expected: dict[str, int] = {}
        self.written = 0

    async def write(
        self,
        count: int,
        writers: int,
        *,
        seed: int = 0,
        on_write: Callable[[int], None] | None = None,
    ) -> None:
        """`count` commands spread over `writers` concurrent writers; `on_write(written)`
        after each."""

        async def writer(rng: random.Random, n: int) -> None:
            for _ in range(n):
                pid = rng.choice(self.pids)
                loaded = await self.repo.update(pid, decide(rng))
                self.expected[pid] = loaded.state.balance
                self.written += 1
                if on_write is not None:
                    on_write(self.written)

        shares = split_evenly(count, writers)
        await asyncio.gather(*(writer(random.Random(seed + i), n) for i, n in enumerate(shares)))

    async def verify(self, journal: Journal, model: BalancesReadModel) -> Verification:
        async with journal.pool.connection() as conn:
            balances = await model.balances(conn)
            missing = await model.missing(conn, journal.tables.journal)
        replayed, replay_events, replay_s = await _replay(journal)
        mismatches = sum(
            1
            for pid, balance in self.expected.items()
            if balances.get(pid) != balance or replayed.get(pid) != balance
        )
        return Verification(missing, mismatches, replay_events, replay_s)


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` as `parts` counts that differ by at most one."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class DemoFleet:
    """The demo's worker processes, their logs in a directory of their own."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.logs = Path(tempfile.mkdtemp(prefix="slicejournal-demo-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, worker_id: str) -> None:
        log = (self.logs / f"{worker_id}.log").open("wb")
        self.procs[worker_id] = subprocess.Popen(
            worker_argv(
                "slicejournal.demo:worker_app",
                dsn=self.dsn,
                schema=self.schema,
                worker_id=worker_id,
                lease_ttl=LEASE_TTL,
                log_level="info",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def kill(self, worker_id: str) -> None:
        self.procs[worker_id].send_signal(signal.SIGKILL)
        self.procs[worker_id].wait()

    def stop(self) -> dict[str, int | None]:
        """SIGTERM: each worker finishes its batches, saves offsets and releases its leases."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        codes: dict[str, int | None] = {}
        for worker_id, p in self.procs.items():
            try:
                codes[worker_id] = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes[worker_id] = None
        return codes

    def tail(self, worker_id: str, lines: int = 15) -> str:
        text = (self.logs / f"{worker_id}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def _table(status: FleetStatus) -> str:
    rows = [("range", "owner", "epoch", "lag")]
    for r in status.ranges:
        lag = "-" if r.lag is None else f"{r.lag.total_seconds() * 1000:.0f} ms"
        rows.append((str(r.slice_range), owner_cell(r), str(r.epoch or "-"), lag))
    return "\n".join(aligned(rows, indent=" " * 9))


async def run_demo(dsn: str | None, settings: JournalSettings, args: argparse.Namespace) -> int:
    async with demo_journal(dsn, settings) as (journal, model):
        fleet = DemoFleet(journal.dsn, settings.schema)
        try:
            ok = await _run(journal, model, fleet, args)
        except BaseException:
            fleet.stop()
            for worker_id in fleet.procs:
                print(f"--- last lines of {worker_id} ({fleet.logs}):\n{fleet.tail(worker_id)}")
            raise
        codes = fleet.stop()
        bad = {w: c for w, c in codes.items() if c not in (0, -signal.SIGKILL)}
        if bad:
            print(f"workers that did not stop cleanly: {bad}; logs in {fleet.logs}")
            return 1
        shutil.rmtree(fleet.logs, ignore_errors=True)
        return 0 if ok else 1


async def _run(
    journal: Journal, model: BalancesReadModel, fleet: DemoFleet, args: argparse.Namespace
) -> bool:
    control = FleetControl(journal)
    bank = BankWorkload(journal, args.accounts)
    total = args.events
    # At a quarter of the events: 4 -> 8 ranges; at half: 8 -> 2; at three quarters
    # a worker is killed.
    milestones = [(total * k // 4, asyncio.Event()) for k in (1, 2, 3)]

    def mark(written: int) -> None:
        for threshold, reached in milestones:
            if written >= threshold:
                reached.set()

    workers = [f"demo-w{i}" for i in range(1, WORKERS + 1)]
    for worker_id in workers:
        fleet.start(worker_id)
    print(f"fleet    {WORKERS} `slicejournal worker` processes, lease TTL {LEASE_TTL:g} s: "
          f"{' '.join(workers)} (logs in {fleet.logs})")  # fmt: skip
    started = time.perf_counter()
    status = await _converged(control, lambda s: len(s.workers) == WORKERS)
    print(f"start    4 ranges on {WORKERS} workers, balanced\n{_table(status)}")
    live = asyncio.create_task(_live_table(control, started))
    writers = asyncio.ensure_future(bank.write(total, args.writers, on_write=mark))
    failover = 0.0
    try:
        for (_, milestone), action in zip(milestones, (8, 2, "kill"), strict=True):
            reached: asyncio.Future[Any] = asyncio.ensure_future(milestone.wait())
            await asyncio.wait([reached, writers], return_when=asyncio.FIRST_COMPLETED)
            reached.cancel()
            if writers.done() and writers.exception() is not None:
                await writers  # raises the writer's error
            at, before = bank.written, time.perf_counter()
            if action == "kill":
                victim = status.ranges[0].owner or workers[0]
                owned = [str(r.slice_range) for r in status.ranges if r.owner == victim]
                fleet.kill(victim)
                status = await _converged(control, partial(_without, worker=victim))
                failover = time.perf_counter() - before
                print(f"kill     at {at} events written: SIGKILL {victim} (owned "
                      f"{', '.join(owned)}); its ranges run again after {failover:.1f} s "
                      f"({failover / LEASE_TTL:.1f} x TTL)\n{_table(status)}")  # fmt: skip
                continue
            assert isinstance(action, int)
            await control.scale(PROJECTION, action)
            status = await _converged(control, partial(_has_split, instances=action))
            print(f"rescale  at {at} events written: {4 if action == 8 else 8}"
                  f" -> {action} ranges, converged in {time.perf_counter() - before:.1f} s\n"
                  f"{_table(status)}")  # fmt: skip
        await writers
        write_s = time.perf_counter() - started
        rows, distinct = await _wait_projected(journal, model, bank.written)
        project_s = time.perf_counter() - started
    finally:
        live.cancel()
        if not writers.done():
            writers.cancel()
    async with journal.pool.connection() as conn:
        p50, p99 = await model.lag_ms(conn)
    checked = await bank.verify(journal, model)
    written, replay_events, replay_s = bank.written, checked.replay_events, checked.replay_seconds
    missing, mismatches = checked.missing, checked.mismatches
    print(f"write    {written} events, {len(bank.expected)} accounts, {args.writers} writers: "
          f"{written / write_s:.0f} events/s, {bank.repo.snapshots_saved} snapshots")  # fmt: skip
    print(f"project  grouped exactly-once on {WORKERS} worker processes, 4 -> 8 -> 2 ranges and "
          f"a failover: {distinct / project_s:.0f} events/s, lag p50 {p50:.0f} ms, "
          f"p99 {p99:.0f} ms")  # fmt: skip
    print(f"replay   {replay_events} events by slice (4 ranges): "
          f"{replay_events / max(replay_s, 1e-9):.0f} events/s")  # fmt: skip
    print(f"verify   events written={written} projected={distinct} "
          f"applied twice={rows - distinct} missing={missing} mismatches={mismatches} "
          f"failover={failover:.1f}s")  # fmt: skip
    ok = mismatches == 0 and missing == 0 and rows == distinct == written == replay_events
    print("OK" if ok else "FAILED")
    return ok


def _has_split(status: FleetStatus, *, instances: int) -> bool:
    return status.instances == instances


def _without(status: FleetStatus, *, worker: str) -> bool:
    return worker not in status.workers and worker not in {r.owner for r in status.ranges}


async def _converged(control: FleetControl, also: Callable[[FleetStatus], bool]) -> FleetStatus:
    """Wait (at most STALL_LIMIT) until every range runs and `also` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STALL_LIMIT
    while True:
        try:
            status = await control.status(PROJECTION)
        except UnknownProjection:  # no worker registered yet
            status = None
        if status is not None and status.converged and _balanced(status) and also(status):
            return status
        if loop.time() > deadline:
            raise JournalError(
                f"the fleet did not converge within {STALL_LIMIT:.0f} s"
                + ("" if status is None else f":\n{_table(status)}")
            )
        await asyncio.sleep(0.1)


def _balanced(status: FleetStatus) -> bool:
    owners = [r.owner for r in status.ranges]
    counts = [owners.count(w) for w in status.workers]
    return not counts or max(counts) - min(counts) <= 1


async def _live_table(control: FleetControl, started: float) -> None:
    """The ranges, their owners and lag, every two seconds while the demo runs."""
    while True:
        await asyncio.sleep(2)
        with contextlib.suppress(JournalError, psycopg.Error):
            status = await control.status(PROJECTION)
            print(f"live     t={time.perf_counter() - started:.0f}s, "
                  f"{len(status.workers)} live workers\n{_table(status)}")  # fmt: skip


async def _wait_projected(
    journal: Journal, model: BalancesReadModel, written: int
) -> tuple[int, int]:
    """Wait until every written event is applied; an error if nothing moves for STALL_LIMIT."""
    distinct, progressed_at = -1, time.monotonic()
    while True:
        async with journal.pool.connection() as conn:
            rows, now_distinct = await model.applied(conn)
        if now_distinct >= written:
            return rows, now_distinct
        if now_distinct > distinct:
            distinct, progressed_at = now_distinct, time.monotonic()
        elif time.monotonic() - progressed_at > STALL_LIMIT:
            raise JournalError(
                f"the projection made no progress for {STALL_LIMIT:.0f} s "
                f"({distinct} of {written} events projected)"
            )
        await asyncio.sleep(0.1)


async def _replay(journal: Journal) -> tuple[dict[str, int], int, float]:
    replayed: dict[str, int] = {}
    started = time.perf_counter()
    events = 0
    for r in slice_ranges(4):
        async for env in journal.current_events_by_slices(ENTITY_TYPE, r.min_slice, r.max_slice):
            replayed[env.persistence_id] = evolve(
                Account(replayed.get(env.persistence_id, 0)), env.event
            ).balance
            events += 1
    return replayed, events, time.perf_counter() - started

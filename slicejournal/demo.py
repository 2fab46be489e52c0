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
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from journal.aio.journal import Journal
from journal.dsn import display_dsn
from journal.errors import JournalError
from journal.settings import JournalSettings
from journal.slices import SliceRange
from projections.aio.fleet_control import FleetControl
from projections.aio.runner import Projection
from projections.errors import UnknownProjection
from projections.fleet.status import FleetStatus
from projections.fleet.worker import WorkerApp
from projections.settings import ProjectionSettings
from slicejournal.demo_schema import claim_demo_schema
from slicejournal.examples.bank import (
    APPLIED_TABLE,
    BALANCES_TABLE,
    ENTITY_TYPE,
    BalancesReadModel,
    BankWorkload,
    bank_serializers,
)
from slicejournal.examples.worker_processes import WorkerProcesses
from slicejournal.fleet_cli import aligned, owner_cell

PROJECTION = "balances"


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
            await claim_demo_schema(conn, settings, (BALANCES_TABLE, APPLIED_TABLE))
        await journal.create_schema()
        model = BalancesReadModel(settings.schema)
        async with journal.pool.connection() as conn:
            await model.create(conn)
        yield journal, model


def demo_fleet(dsn: str, schema: str) -> WorkerProcesses:
    """The demo's worker processes, their logs in a directory of their own."""
    logs = Path(tempfile.mkdtemp(prefix="slicejournal-demo-"))
    return WorkerProcesses(
        "slicejournal.demo:worker_app", dsn=dsn, schema=schema, lease_ttl=LEASE_TTL, logs=logs
    )


def _table(status: FleetStatus) -> str:
    rows = [("range", "owner", "epoch", "lag")]
    for r in status.ranges:
        lag = "-" if r.lag is None else f"{r.lag.total_seconds() * 1000:.0f} ms"
        rows.append((str(r.slice_range), owner_cell(r), str(r.epoch or "-"), lag))
    return "\n".join(aligned(rows, indent=" " * 9))


async def run_demo(dsn: str | None, settings: JournalSettings, args: argparse.Namespace) -> int:
    async with demo_journal(dsn, settings) as (journal, model):
        fleet = demo_fleet(journal.dsn, settings.schema)
        try:
            ok = await _run(journal, model, fleet, args)
        except BaseException:
            fleet.stop_all()
            for worker_id in fleet.procs:
                print(f"--- last lines of {worker_id} ({fleet.logs}):\n{fleet.tail(worker_id)}")
            raise
        codes = fleet.stop_all()
        bad = {w: c for w, c in codes.items() if c not in (0, -signal.SIGKILL)}
        if bad:
            print(f"workers that did not stop cleanly: {bad}; logs in {fleet.logs}")
            return 1
        shutil.rmtree(fleet.logs, ignore_errors=True)
        return 0 if ok else 1


async def _run(
    journal: Journal, model: BalancesReadModel, fleet: WorkerProcesses, args: argparse.Namespace
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
            # Mid-rescale or failover the new ranges have no owner yet: say so.
            moving = "" if status.converged else ", ranges being handed over"
            print(f"live     t={time.perf_counter() - started:.0f}s, "
                  f"{len(status.workers)} live workers{moving}\n{_table(status)}")  # fmt: skip


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

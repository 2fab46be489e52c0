"""The projection fleet end to end: real `slicejournal worker` processes, really killed.

Writers keep appending (some transactions held open 1-5 s) while the fleet is
rescaled 4 -> 8 -> 2 -> 4, one worker is SIGKILLed, another SIGSTOPped for
3 x TTL and resumed, and a fourth joins. The read model's `applied` table has
no key here, so an event applied twice would show as a second row, not as a
failed transaction that a restart hides. Also: two overlapping instances
without leases, and a fenced instance whose lease is taken over mid-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import PipelineStatus

from journal import Journal, SliceRange
from projections import (
    LeaseLost,
    OffsetConflict,
    Projection,
    ProjectionError,
    ProjectionSettings,
    ProjectionStats,
    RecoveryStrategy,
)
from projections.aio import runner
from projections.aio.fleet_control import FleetControl
from projections.aio.runner import run_fenced
from projections.fencing import Fence
from projections.fleet.status import FleetStatus
from projections.tables import ProjectionTables
from tests.support import ROOT, bank
from tests.support.fleet import NAME, TTL, Fleet, claim
from tests.support.pg import fast_query_settings, fetch


@pytest.fixture
def fleet(pg_dsn: str, schema: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(pg_dsn, schema, tmp_path)
    try:
        yield f
    finally:
        f.kill_all()


async def cli(*args: str, dsn: str, schema: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "slicejournal.cli", *args, "--dsn", dsn, "--schema", schema,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def owners(control: FleetControl) -> FleetStatus:
    return await control.status(NAME)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_fleet_rescales_loses_workers_and_applies_every_event_once(
    journal: Journal, fleet: Fleet, pg_dsn: str, schema: str
) -> None:
    await bank.create_read_model(journal, with_primary_key=False)
    control = FleetControl(journal)
    writers = bank.Writers(journal, 300, late_fraction=0.1, seed=7)
    for worker_id in ("w1", "w2", "w3"):
        fleet.start(worker_id)

    async def converge(without: str | None = None, workers: int | None = None) -> FleetStatus:
        """Converged and balanced over the live workers (`workers` of them), and (after a
        kill or a freeze) with `without` owning nothing."""
        for _ in range(300):
            status = await control.wait_converged(NAME, timeout=60, interval=0.2)
            owners = [r.owner for r in status.ranges]
            counts = [owners.count(w) for w in status.workers]
            if (
                without not in owners
                and (workers is None or len(status.workers) == workers)
                and max(counts) - min(counts) <= 1
            ):
                return status
            await asyncio.sleep(0.2)
        raise AssertionError(f"not converged and balanced: {status}")

    async def scale(n: int) -> None:
        code, out = await cli("scale", NAME, str(n), "--timeout", "60",
                              dsn=pg_dsn, schema=schema)  # fmt: skip
        assert code == 0, out
        assert f"converged on {n} ranges" in out

    async def registered() -> None:
        while True:
            with contextlib.suppress(Exception):
                await control.status(NAME)
                return
            await asyncio.sleep(0.2)

    await asyncio.wait_for(registered(), 30)
    writers.start(writers=6)
    try:
        status = await converge(workers=3)
        assert status.instances == 4
        assert len({r.owner for r in status.ranges}) == 3  # 2/1/1
        await scale(8)
        await scale(2)
        victim = (await owners(control)).ranges[0].owner
        assert victim is not None
        fleet.signal(victim, signal.SIGKILL)
        status = await converge(without=victim)
        frozen = next(r.owner for r in status.ranges if r.owner)
        assert frozen is not None
        fleet.signal(frozen, signal.SIGSTOP)
        await asyncio.sleep(3 * TTL)
        status = await converge(without=frozen)  # taken over while it is frozen
        fleet.signal(frozen, signal.SIGCONT)
        fleet.start("w4")
        await scale(4)
        await asyncio.sleep(2)
    finally:
        await writers.stop()
    status = await converge(workers=3)  # w2, w3 (resumed) and w4; the killed one is gone
    assert len({r.owner for r in status.ranges}) == 3  # 2/1/1 over the survivors

    assert writers.late > 0
    await bank.assert_applied_exactly_once(journal)

    codes = fleet.stop_all()
    assert codes[victim] == -signal.SIGKILL
    assert all(code == 0 for w, code in codes.items() if w != victim), codes
    frozen_log = fleet.log(frozen)
    assert "lost range" in frozen_log, frozen_log[-3000:]


# -- without the fleet: the offset rows themselves refuse a second application ---------


@pytest.mark.timeout(60)
async def test_overlapping_instances_without_leases_never_apply_an_event_twice(
    journal: Journal,
) -> None:
    await bank.create_read_model(journal, with_primary_key=False)

    def instance(r: SliceRange) -> Projection:
        return Projection.exactly_once(
            journal,
            name="balances",
            entity_type=bank.ENTITY,
            slice_range=r,
            handler=bank.make_handler(journal),
            query_settings=fast_query_settings(),
        )

    wide, narrow = instance(SliceRange(0, 1023)), instance(SliceRange(0, 511))
    tasks = [asyncio.create_task(p.run()) for p in (wide, narrow)]
    writers = bank.Writers(journal, 100, late_fraction=0.0)
    writers.start(writers=4, max_batches=40)
    await writers.wait()
    await asyncio.wait(tasks, timeout=30, return_when=asyncio.FIRST_EXCEPTION)
    for p in (wide, narrow):
        await p.stop()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    conflicts = [r for r in results if isinstance(r, OffsetConflict)]
    assert conflicts, f"two overlapping instances both ran to the end: {results}"
    # Each instance either ran to its stop (returning its counters) or hit the conflict.
    assert all(isinstance(r, ProjectionStats | OffsetConflict) for r in results), results

    _, applied, distinct = await bank.projected(journal)
    assert applied == distinct, f"{applied - distinct} event(s) applied twice"


# -- fencing: a lease taken over mid-run ends the instance, its batch rolled back --------


async def fetch_offsets(journal: Journal) -> int:
    query = sql.SQL("SELECT count(*) FROM {} WHERE persistence_id <> ''")
    rows = await fetch(journal.dsn, query.format(ProjectionTables(journal.tables).offset_store))
    return int(rows[0][0])


async def _claimed_fence(journal: Journal, ttl_ms: int = 60_000) -> Fence:
    """Claim the whole range of `balances` as "me", the way a worker does, and return the
    fence its batches run under."""
    everything = SliceRange(0, 1023)
    return Fence("balances", everything, "me", await claim(journal, everything, "me"), ttl_ms)


def whole_grouped(
    journal: Journal, handler: Any, *, group_after: int, recovery: RecoveryStrategy | None = None
) -> Projection:
    """A grouped instance over every slice of the bank entity, batches of `group_after`."""
    return Projection.grouped(
        journal,
        name="balances",
        entity_type=bank.ENTITY,
        slice_range=SliceRange(0, 1023),
        handler=handler,
        settings=ProjectionSettings(group_after_envelopes=group_after, group_after_duration=0.05),
        query_settings=fast_query_settings(),
        recovery=recovery,
    )


@pytest.mark.timeout(60)
async def test_a_fenced_instance_commits_nothing_after_its_lease_is_taken_over(
    journal: Journal,
) -> None:
    await bank.create_read_model(journal, with_primary_key=False)
    everything = SliceRange(0, 1023)
    gate, in_flight = asyncio.Event(), asyncio.Event()
    inner = bank.make_grouped_handler(journal)

    async def slow_handler(conn: psycopg.AsyncConnection[Any], envs: list[Any]) -> None:
        await inner(conn, envs)
        in_flight.set()
        await gate.wait()  # the batch is in flight, its transaction open

    projection = whole_grouped(journal, slow_handler, group_after=5)
    run = asyncio.create_task(run_fenced(projection, await _claimed_fence(journal)))
    await journal.append(f"{bank.ENTITY}|a", [{"amount": 5}] * 5, expected_seq_nr=0)
    await asyncio.wait_for(in_flight.wait(), 20)
    # The instance is "frozen" with a batch in flight, its writes made but not
    # committed; meanwhile another worker takes the range over.
    await claim(journal, everything, "someone-else")
    gate.set()
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(run, 20)
    _, applied, distinct = await bank.projected(journal)
    assert (applied, distinct) == (0, 0), "the frozen instance's batch was committed"
    rows = await fetch_offsets(journal)
    assert rows == 0, "offsets of the rolled-back batch were stored"


@pytest.mark.timeout(60)
async def test_run_with_a_fence_is_deprecated_and_still_fenced(journal: Journal) -> None:
    await bank.create_read_model(journal, with_primary_key=False)
    everything = SliceRange(0, 1023)
    projection = whole_grouped(journal, bank.make_grouped_handler(journal), group_after=1)
    stale = await _claimed_fence(journal)
    await claim(journal, everything, "someone-else")  # the lease moved on before the run
    await journal.append(f"{bank.ENTITY}|a", [{"amount": 5}], expected_seq_nr=0)
    with pytest.warns(DeprecationWarning, match="fence"), pytest.raises(LeaseLost):
        await asyncio.wait_for(projection.run(fence=stale), 20)
    _, applied, _ = await bank.projected(journal)
    assert applied == 0


@pytest.mark.timeout(60)
async def test_a_fenced_instance_frozen_mid_batch_holds_its_locks_at_most_the_ttl(
    journal: Journal,
) -> None:
    """A worker frozen with a batch in flight (SIGSTOP, a VM paused) must not hold the
    read-model rows it wrote, nor its lease row, for longer than the lease TTL: the
    server ends its transaction. Here the "frozen" handler has written a balance row and
    never returns; another transaction must get that row's lock soon after the TTL."""
    await bank.create_read_model(journal, with_primary_key=False)
    in_flight = asyncio.Event()
    inner = bank.make_grouped_handler(journal)

    async def frozen_handler(conn: psycopg.AsyncConnection[Any], envs: list[Any]) -> None:
        await inner(conn, envs)
        in_flight.set()
        await asyncio.Event().wait()  # never resumes

    projection = whole_grouped(journal, frozen_handler, group_after=1)
    run = asyncio.create_task(run_fenced(projection, await _claimed_fence(journal, 1_000)))
    balances = bank.table(journal, "balances")
    pid = f"{bank.ENTITY}|a"
    async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
        # An existing row, so that the handler's upsert locks it.
        await conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, 0)").format(balances), (pid,))
    try:
        await journal.append(pid, [{"amount": 5}], expected_seq_nr=0)
        await asyncio.wait_for(in_flight.wait(), 20)
        started = asyncio.get_running_loop().time()
        lock = sql.SQL("SELECT balance FROM {} WHERE pid = %s FOR UPDATE").format(balances)
        async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
            # Bounded well under the test's limit: a lock held forever fails here, not by hanging.
            await conn.execute("SET lock_timeout = '10s'")
            await conn.execute(lock, (pid,))
        waited = asyncio.get_running_loop().time() - started
        assert waited < 10, waited
    finally:
        run.cancel()
        with contextlib.suppress(BaseException):
            await run
    _, applied, _ = await bank.projected(journal)
    assert applied == 0, "the frozen batch was committed"


@pytest.mark.timeout(60)
async def test_a_fenced_handler_that_commits_itself_fails_its_batch(journal: Journal) -> None:
    """The runner commits a batch's writes with its offsets, after the fence. A handler
    that commits the transaction itself would leave the fence and the offsets to run
    outside it: the batch fails instead (a handler error) and stores no offset."""
    await bank.create_read_model(journal, with_primary_key=False)
    inner = bank.make_grouped_handler(journal)

    async def committing_handler(conn: psycopg.AsyncConnection[Any], envs: list[Any]) -> None:
        await inner(conn, envs)
        await conn.commit()

    projection = whole_grouped(journal, committing_handler, group_after=1)
    fence = await _claimed_fence(journal)
    await journal.append(f"{bank.ENTITY}|a", [{"amount": 5}], expected_seq_nr=0)
    with pytest.raises(ProjectionError) as failed:
        await asyncio.wait_for(run_fenced(projection, fence), 30)
    assert "ended the batch's transaction itself" in f"{failed.value} {failed.value.__cause__}"
    assert await fetch_offsets(journal) == 0, "offsets stored outside the handler's transaction"


async def _until_gone(journal: Journal, backend_pid: int, *, within: float) -> None:
    """Wait until the server has no session `backend_pid` (or fail after `within` s)."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
    async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
        for _ in range(int(within / 0.05)):
            if (await (await conn.execute(query, (backend_pid,))).fetchone()) == (0,):
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the server did not end session {backend_pid} within {within} s")


async def _server_version(journal: Journal) -> int:
    async with journal.pool.connection() as conn:
        return conn.info.server_version


async def _run_until_applied(
    journal: Journal, projection: Projection, fence: Fence | None, appends: int
) -> None:
    """Run the instance (under `fence` if given) while `appends` single events are
    appended one after another, each applied before the next; then stop it and check
    each applied once."""
    run = asyncio.create_task(projection.run() if fence is None else run_fenced(projection, fence))
    try:
        for n in range(appends):
            await journal.append(f"{bank.ENTITY}|a", [{"amount": 5}], expected_seq_nr=n)
            await asyncio.wait_for(bank.wait_until_projected(journal), 30)
    finally:
        run.cancel()
        with contextlib.suppress(BaseException):
            await run
    await bank.assert_applied_exactly_once(journal)
    assert await fetch_offsets(journal) == appends


@pytest.mark.timeout(60)
async def test_fenced_batches_are_pipelined_where_the_server_bounds_whole_transactions(
    journal: Journal,
) -> None:
    """On PostgreSQL 17 and later (`transaction_timeout`) a fenced batch is sent BEGIN to
    COMMIT as one pipeline, as an unfenced one is; on older servers every statement
    waits for the server (its idle limit is armed only at a Sync)."""
    await bank.create_read_model(journal, with_primary_key=False)
    inner = bank.make_grouped_handler(journal)
    modes: list[PipelineStatus] = []

    async def handler(conn: psycopg.AsyncConnection[Any], envs: list[Any]) -> None:
        modes.append(conn.info.pipeline_status)
        await inner(conn, envs)

    fence = await _claimed_fence(journal)
    await _run_until_applied(journal, whole_grouped(journal, handler, group_after=1), fence, 3)
    pipelined = await _server_version(journal) >= 170000
    assert set(modes) == {PipelineStatus.ON if pipelined else PipelineStatus.OFF}, modes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reads_after", [False, True], ids=["writes", "then-reads"])
async def test_a_pipelined_fenced_batch_that_outlives_the_ttl_runs_again_synced(
    journal: Journal, reads_after: bool
) -> None:
    """The server ends a pipelined fenced batch once it has lasted the lease TTL (its
    worker might be frozen). A batch that really needs longer runs again at once, with
    every statement synced (the idle limit only), and so do the instance's later ones:
    each event is applied exactly once. The client learns of the end as the timeout's
    error or as a closed connection, depending on what it reads next."""
    if await _server_version(journal) < 170000:
        pytest.skip("fenced batches are pipelined on PostgreSQL 17 and later only")
    await bank.create_read_model(journal, with_primary_key=False)
    inner = bank.make_grouped_handler(journal)
    modes: list[PipelineStatus] = []

    async def slow_once(conn: psycopg.AsyncConnection[Any], envs: list[Any]) -> None:
        modes.append(conn.info.pipeline_status)
        await inner(conn, envs)
        if len(modes) == 1:
            # Past the TTL: wait until the server has ended the batch's session (on a
            # loaded machine its timer may start late), then go on as a slow handler.
            await _until_gone(journal, conn.info.backend_pid, within=20)
            if reads_after:
                await (await conn.execute("SELECT 1")).fetchone()

    fence = await _claimed_fence(journal, 1_000)
    # Retries: the later, synced batches have a 1 s idle limit, which a stall of the
    # loaded test machine could reach; a retried batch is still applied once.
    projection = whole_grouped(
        journal, slow_once, group_after=1, recovery=RecoveryStrategy.retry_and_fail(3, 0.01)
    )
    await _run_until_applied(journal, projection, fence, 3)
    assert modes[0] == PipelineStatus.ON
    assert modes[1:] and set(modes[1:]) == {PipelineStatus.OFF}, modes


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fenced", "waits"),
    [(True, False), (False, False), (False, True)],
    ids=["fenced", "unfenced", "unfenced-synced-and-waited"],
)
async def test_a_handler_may_read_and_nest_a_transaction_before_it_writes(
    journal: Journal, fenced: bool, waits: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler that reads a result first and then writes in its own
    `conn.transaction()` (a savepoint inside the batch's transaction: the pipeline
    sends a Sync after BEGIN, so psycopg knows a transaction is open) is not taken for
    one that ended the batch, and its writes commit only with the batch: a batch that
    fails after the nested block leaves nothing, and its retry applies each event once.
    Without the Sync, the unfenced batch's nested block committed it early. `waits`:
    the fallback for a psycopg without the steps that send a Sync without waiting."""
    assert runner.SYNC_WITHOUT_WAIT, "the installed psycopg sends a Sync without waiting"
    if waits:
        monkeypatch.setattr(runner, "SYNC_WITHOUT_WAIT", False)
    await bank.create_read_model(journal, with_primary_key=False)
    inner = bank.make_grouped_handler(journal)
    calls = 0

    async def handler(conn: psycopg.AsyncConnection[Any], envs: list[Any]) -> None:
        nonlocal calls
        calls += 1
        cur = await conn.execute("SELECT 1")
        assert await cur.fetchone() == (1,)
        async with conn.transaction():
            await inner(conn, envs)
        if calls == 1:
            raise RuntimeError("the first attempt fails after its nested block")

    projection = whole_grouped(
        journal, handler, group_after=1, recovery=RecoveryStrategy.retry_and_fail(2, 0.01)
    )
    fence = await _claimed_fence(journal) if fenced else None
    await _run_until_applied(journal, projection, fence, 3)
    assert calls == 4  # the failed attempt, its retry and the next two batches

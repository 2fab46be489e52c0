"""A fleet worker: one process's share of a projection's slice ranges.

Start the same worker on 1..N machines; they find each other through
PostgreSQL alone. Three loops run in each worker:

* **renew** (every TTL / 3): the worker's heartbeat row and every lease it
  holds get a new expiry. A lease that did not renew was taken over (or
  released by an operator): its instance is cancelled at once — it could not
  commit anyway, the fence rolls its transactions back.
* **rebalance** (every `poll_interval`): read the desired split, the live
  workers and every lease; the pure planner (`assignment.plan`) says what to
  release, claim and keep. Releases first — each instance finishes its batch,
  saves its offsets and gives its lease back — then claims, in a transaction
  that holds the projection's fleet row and the replaced lease rows locked.
  So a new range starts only after every old range sharing a slice with it
  has stopped and saved (or its lease expired and its last fenced
  transaction ended).
* **supervise** (one per held range): runs the instance under its `Fence`;
  a failure restarts it with exponential backoff (1 s .. 30 s) under the
  same lease, counted and shown by `status`; a lost lease ends it.

Database outages are survived the same way: every loop logs, backs off and
tries again; a lease that expired meanwhile is re-claimed or taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import attrs
import psycopg

from journal import Journal, SliceRange, slice_ranges
from journal.connection import driver_errors, schema_errors
from journal.durations import name_duration_fields, positive, to_timedelta
from journal.errors import InvalidArgument, JournalError
from journal.serialization import SerializerRegistry
from projections.aio.leases import claim_range, lock_claims, release_lease, renew_leases
from projections.aio.runner import Projection, run_fenced
from projections.errors import LeaseLost
from projections.fencing import Fence
from projections.fleet.assignment import LeaseRow, plan
from projections.fleet.lease_sql import FleetSql, lease_rows
from projections.names import validate_name
from projections.telemetry import Telemetry, telemetry_for_runner

_log = logging.getLogger("slicejournal.projections.fleet")

Factory = Callable[[Journal, SliceRange], Projection]


@attrs.frozen
class WorkerApp:
    """What `slicejournal worker MODULE:ATTR` runs when a bare factory is not enough:
    the factory, and the serializers the worker's journal must decode events with."""

    factory: Factory
    serializers: SerializerRegistry | None = None


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _check_instances(_i: object, _a: object, value: int) -> None:
    slice_ranges(value)


def _check_worker_id(_i: object, _a: object, value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > 255 or "\x00" in value:
        raise InvalidArgument(f"worker id must be 1..255 characters without NUL, got {value!r}")


@attrs.frozen(field_transformer=name_duration_fields)
class WorkerSettings:
    """How a worker takes part in its fleet (validated; defaults as the CLI's)."""

    worker_id: str = attrs.field(factory=default_worker_id, validator=_check_worker_id)
    # The count used when no count is stored for the projection yet.
    instances: int = attrs.field(default=4, validator=_check_instances)
    lease_ttl: timedelta = attrs.field(
        default=timedelta(seconds=10), converter=to_timedelta, validator=positive
    )
    restart_backoff_min: timedelta = attrs.field(
        default=timedelta(seconds=1), converter=to_timedelta, validator=positive
    )
    restart_backoff_max: timedelta = attrs.field(
        default=timedelta(seconds=30), converter=to_timedelta, validator=positive
    )

    @property
    def ttl_ms(self) -> int:
        """The lease TTL in milliseconds, as the lease rows store it."""
        return max(1, int(self.lease_ttl.total_seconds() * 1000))

    @property
    def renew_interval(self) -> float:
        """Seconds between lease renewals: a third of the TTL."""
        return self.lease_ttl.total_seconds() / 3

    @property
    def poll_interval(self) -> float:
        """How often the fleet is rebalanced: a quarter of the TTL, at most 1 s."""
        return min(1.0, self.lease_ttl.total_seconds() / 4)


@attrs.define
class HeldRange:
    """A range whose lease this worker holds, and the projection instance running it
    (read by metrics and status)."""

    slice_range: SliceRange
    fence: Fence
    task: asyncio.Task[None] | None = None
    projection: Projection | None = None
    restarts: int = 0
    last_error: str | None = None
    lost: bool = False
    stopping: asyncio.Event = attrs.field(factory=asyncio.Event)


class FleetWorker:
    """Runs the ranges of one projection this worker holds, until `stop()`."""

    def __init__(
        self,
        journal: Journal,
        factory: Factory,
        settings: WorkerSettings | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.journal = journal
        # Lease events go here; the instances report to their own (the process's unless
        # the factory gives them one).
        self.telemetry = telemetry_for_runner(telemetry)
        self.factory = factory
        self.settings = settings or WorkerSettings()
        try:  # construction only: learns name and entity type
            probe = factory(journal, SliceRange.FULL)
        except Exception as error:
            raise InvalidArgument(
                f"the factory failed when called as factory(journal, SliceRange(0, 1023)): "
                f"{type(error).__name__}: {error}"
            ) from error
        if not isinstance(probe, Projection):
            raise InvalidArgument(
                f"the factory must return a Projection, got {type(probe).__name__}"
            )
        self.name = validate_name(probe.name)
        self.entity_type = probe.entity_type
        self.me = self.settings.worker_id
        self.instances: dict[SliceRange, HeldRange] = {}
        # Ranges whose instance stopped but whose lease this worker still holds.
        self._parked: dict[SliceRange, int] = {}
        # The fleet tables are named by the projections' settings (`ProjectionTables`).
        self.tables = probe.tables
        self._sql = FleetSql(self.tables)
        self._stop = asyncio.Event()
        # For `ready()`: when the heartbeat and leases were last renewed, and the ranges
        # the last plan gave this worker.
        self._renewed_at: float | None = None
        self._wanted: list[SliceRange] = []
        self._split: int | None = None  # the instance count last read (a change is logged)

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run` to stop every instance (batches finished, offsets saved), release its
        leases and return."""
        self._stop.set()

    async def run(self) -> None:
        """Join the fleet and run the ranges this worker leases until `stop()`; then finish
        their batches, save offsets, release the leases and leave.

        A database outage while running is logged and retried; what does end it (the
        first registration failing, say) is a typed `JournalError`, as everywhere."""
        _log.info("worker %s joins projection %s", self.me, self.name,
                  extra=self._extra("worker_started"))  # fmt: skip
        # The fleet's tables, which the pool does not know; then the driver's errors typed.
        with driver_errors(), schema_errors(self.tables):
            await self._check_pools()  # connections left idle by a previous run may be gone
            await self._register()
            renew = asyncio.create_task(self._every(self.settings.renew_interval, self._renew))
            try:
                await self._every(self.settings.poll_interval, self._rebalance)
            finally:
                # Instances first, while their leases are still renewed: a slow final
                # batch must not outlive its lease and lose its offsets to the fence.
                await self._stop_all()
                renew.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renew
                await self._leave()

    async def _register(self) -> None:
        ttl = self.settings.ttl_ms
        async with self.journal.pool.connection() as conn:
            await conn.execute(
                self._sql.register, (self.name, self.entity_type, self.settings.instances, ttl)
            )

    async def _stop_all(self) -> None:
        ranges = list(self.instances)
        for instance in await asyncio.gather(*(self._stop_instance(r) for r in ranges)):
            if instance is not None:
                self._parked[instance.slice_range] = instance.fence.epoch

    async def _leave(self) -> None:
        ranges = list(self._parked)
        for r, epoch in list(self._parked.items()):
            await self._release_row(r, epoch)
        with contextlib.suppress(psycopg.Error, JournalError):
            async with self.journal.pool.connection() as conn:
                await conn.execute(self._sql.leave, (self.name, self.me))
        _log.info("worker %s left projection %s (released %d range(s))", self.me, self.name,
                  len(ranges), extra=self._extra("worker_stopped"))  # fmt: skip

    async def _every(self, interval: float, step: Callable[[], Any]) -> None:
        """Run `step` every `interval` until stopped; a failing step is logged and retried
        with backoff (a database restart, a killed backend)."""
        failures = 0
        while not self._stop.is_set():
            try:
                await step()
                failures = 0
                delay = interval
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, JournalError, OSError) as error:
                failures += 1
                await self._check_pools()
                # Soon at first (a lease must be renewed before it expires), then backing
                # off up to the step's own interval.
                delay = min(interval, 0.25 * 2**failures)
                what = getattr(step, "__name__", str(step)).lstrip("_")
                _log.warning("worker %s: %s failed (%s); retrying in %.1f s", self.me, what,
                             error, delay, extra=self._extra("retry", step=what,
                                                             error=str(error)))  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    # -- renew -------------------------------------------------------------------------------

    async def _renew(self) -> None:
        held = {i.fence.epoch: i for i in self.instances.values() if not i.lost}
        ttl = self.settings.ttl_ms
        async with self.journal.pool.connection() as conn, conn.transaction():
            await conn.execute(self._sql.heartbeat, {"name": self.name, "me": self.me, "ttl": ttl})
            renewed = await renew_leases(conn, self._sql, self.name, self.me, list(held), ttl)
        self._renewed_at = time.monotonic()
        for epoch, instance in held.items():
            if epoch not in renewed:
                self._lost(instance, "its lease was not renewed (taken over or expired)")

    def ready(self) -> str | None:
        """None when the worker is ready — it renewed its heartbeat within the lease TTL and
        runs every range the fleet gives it (or it was given none) — else why not.

        Safe to call from another thread (it only reads)."""
        if self._stop.is_set():
            return "stopping"
        if self._renewed_at is None:
            return "not registered yet"
        now = time.monotonic()
        if now - self._renewed_at > self.settings.lease_ttl.total_seconds():
            return f"no heartbeat renewed for {now - self._renewed_at:.1f} s"
        missing = [str(r) for r in self._wanted if r not in self.instances]
        if missing:
            return f"ranges not running yet: {', '.join(missing)}"
        return None

    def _lost(self, instance: HeldRange, why: str) -> None:
        """The instance's lease is gone: stop it (it could not commit anyway). Only this
        instance: the range may already run again under a newer claim."""
        r = instance.slice_range
        if instance.lost or self.instances.get(r) is not instance:
            return
        del self.instances[r]
        instance.lost = True
        self.telemetry.lease_lost(self.name, r.key, self.me, why)
        _log.warning("worker %s lost range %s of %s: %s; instance stopped", self.me, r,
                     self.name, why, extra=self._extra("lease_lost", r, instance.fence.epoch,
                                                       reason=why))  # fmt: skip
        if instance.task is not None and instance.task is not asyncio.current_task():
            instance.task.cancel()

    # -- rebalance ---------------------------------------------------------------------------

    async def _rebalance(self) -> None:
        self._reap()
        async with self.journal.pool.connection() as conn:
            async with conn.transaction():
                instances, now, workers, leases = await self._read(conn, lock=False)
            if instances != self._split:
                if self._split is not None:
                    _log.info("worker %s: projection %s rescaled from %d to %d ranges", self.me,
                              self.name, self._split, instances,
                              extra=self._extra("rescaled", instances=instances))  # fmt: skip
                self._split = instances
            decided = plan(self.me, slice_ranges(instances), workers, leases, now)
            self._wanted = [*decided.claim, *decided.waiting, *decided.keep]
            # Stop what moves away, but keep its lease row "parked" for now: while it
            # is held, the planner still knows who had those slices, so the ranges of
            # a new split that overlap it stay with this worker (sticky), and this
            # worker's claim transaction replaces the row in one step.
            for r in decided.release:
                await self._park(r)
            idle = [r for r in decided.keep if r not in self.instances]
            if not (decided.claim or decided.waiting or self._parked or idle):
                return
            claimed, wanted = await self._claim(conn)
            for r, epoch in claimed:
                self._start(r, epoch)
            for r, epoch in list(self._parked.items()):
                if not any(r.overlaps(w) for w in wanted):
                    await self._release_row(r, epoch)

    def _reap(self) -> None:
        """Forget instances whose supervisor ended by itself (lease lost)."""
        for r, instance in list(self.instances.items()):
            if (
                instance.task is not None
                and instance.task.done()
                and not instance.stopping.is_set()
            ):
                self.instances.pop(r)

    async def _read(
        self, conn: psycopg.AsyncConnection[Any], *, lock: bool
    ) -> tuple[int, float, list[str], list[LeaseRow]]:
        if not lock:  # (not under the claim's locks: it would hold up this worker's renewal)
            params = {"name": self.name, "me": self.me, "ttl": self.settings.ttl_ms}
            await conn.execute(self._sql.heartbeat, params)
        cur = await conn.execute(self._sql.lock_fleet if lock else self._sql.fleet, (self.name,))
        row = await cur.fetchone()
        if row is None:  # deleted by hand while running: register again, plan next tick
            await self._register()
            raise JournalError(f"the fleet row of {self.name} was missing; registered again")
        instances, _, _, now, _ = row
        cur = await conn.execute(self._sql.live_workers, (self.name,))
        workers = [w for (w,) in await cur.fetchall()]
        cur = await conn.execute(self._sql.leases, (self.name,))
        leases = lease_rows(await cur.fetchall())
        if not lock:
            await conn.execute(self._sql.collect, self._sql.collect_params(self.name, instances))
            await conn.execute(self._sql.forget_workers, (self.name,))
        return instances, now, workers, leases

    async def _claim(
        self, conn: psycopg.AsyncConnection[Any]
    ) -> tuple[list[tuple[SliceRange, int]], list[SliceRange]]:
        """Claim what the plan gives this worker, under the fleet lock; a lease row still
        locked by a fenced transaction makes the claim wait for the next tick.

        Returns the claimed ranges with their epochs, and every range the plan
        gives this worker (claimed, waiting or kept)."""
        claimed: list[tuple[SliceRange, int]] = []
        wanted: list[SliceRange] = []
        wait_ms = max(100, self.settings.ttl_ms // 5)
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {int(wait_ms)}")
                await lock_claims(conn, self._sql, self.name)
                instances, now, workers, leases = await self._read(conn, lock=True)
                decided = plan(self.me, slice_ranges(instances), workers, leases, now)
                wanted = [*decided.claim, *decided.waiting, *decided.keep]
                # A range held in the table but run by no instance here (its lease
                # expired and its fence failed, or it was parked and came back):
                # claimed again under a new epoch rather than left to expire.
                idle = [r for r in decided.keep if r not in self.instances]
                for r in [*decided.claim, *idle]:
                    if any(r.overlaps(mine) for mine in self.instances):
                        continue  # one of this worker's own instances still covers a slice
                    epoch = await self._claim_one(conn, r)
                    if epoch is not None:
                        claimed.append((r, epoch))
        except psycopg.errors.LockNotAvailable:
            _log.info("worker %s: a range of %s is still in a transaction of its previous "
                      "owner; claiming again at the next tick", self.me, self.name,
                      extra=self._extra("claim_deferred"))  # fmt: skip
            return [], wanted
        for r, _ in claimed:
            for parked in [p for p in self._parked if p.overlaps(r)]:
                del self._parked[parked]  # replaced by the claim
        return claimed, wanted

    async def _claim_one(self, conn: psycopg.AsyncConnection[Any], r: SliceRange) -> int | None:
        epoch, _ = await claim_range(conn, self._sql, self.name, r, self.me, self.settings.ttl_ms)
        return epoch  # None: taken meanwhile

    # -- instances ---------------------------------------------------------------------------

    def _start(self, r: SliceRange, epoch: int) -> None:
        fence = Fence(self.name, r, self.me, epoch, self.settings.ttl_ms)
        instance = HeldRange(r, fence)
        self.instances[r] = instance
        instance.task = asyncio.create_task(self._supervise(instance), name=f"fleet {r}")
        self.telemetry.lease_claimed(self.name, r.key, self.me, epoch)
        _log.info("worker %s claimed range %s of %s (epoch %d)", self.me, r, self.name, epoch,
                  extra=self._extra("lease_claimed", r, epoch))  # fmt: skip

    async def _supervise(self, instance: HeldRange) -> None:
        r = instance.slice_range
        backoff = self.settings.restart_backoff_min.total_seconds()
        while not (instance.stopping.is_set() or instance.lost):
            started = asyncio.get_running_loop().time()
            try:
                projection = self.factory(self.journal, r)
                instance.projection = projection
                await self._report(instance, running=True)
                await run_fenced(projection, instance.fence)
                # Stopped on request: status must not show it running while parked.
                with contextlib.suppress(psycopg.Error, JournalError, OSError):
                    await self._report(instance, running=False)
                return
            except asyncio.CancelledError:
                raise
            except LeaseLost as error:
                self._lost(instance, str(error))
                return
            except Exception as error:
                instance.restarts += 1
                instance.last_error = f"{type(error).__name__}: {error}"
                self.telemetry.instance_restarted(self.name, r.key, error)
                _log.error("worker %s: range %s of %s failed (restart %d in %.1f s): %s",
                           self.me, r, self.name, instance.restarts, backoff,
                           instance.last_error,
                           extra=self._extra("failed", r, instance.fence.epoch,
                                             restarts=instance.restarts,
                                             error=instance.last_error))  # fmt: skip
            await self._check_pools()
            with contextlib.suppress(psycopg.Error, JournalError, OSError):
                await self._report(instance, running=False)
            limit = self.settings.restart_backoff_max.total_seconds()
            if asyncio.get_running_loop().time() - started > limit:
                backoff = self.settings.restart_backoff_min.total_seconds()  # it had recovered
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(instance.stopping.wait(), backoff)
            backoff = min(backoff * 2, limit)

    async def _check_pools(self) -> None:
        """After a failure, test the pools' idle connections: backends killed (or a server
        restarted) while they sat idle would otherwise fail one restart each."""
        for pool in (self.journal.pool, self.journal.read_pool):
            with contextlib.suppress(Exception):
                await pool.check()

    async def _report(self, instance: HeldRange, *, running: bool) -> None:
        async with self.journal.pool.connection() as conn:
            await conn.execute(
                self._sql.report,
                (running, instance.restarts, instance.last_error, self.name, self.me,
                 instance.fence.epoch),
            )  # fmt: skip

    async def _stop_instance(self, r: SliceRange) -> HeldRange | None:
        """Stop the range's instance: its batch finished, its offsets saved."""
        instance = self.instances.get(r)
        if instance is None:
            return None
        instance.stopping.set()
        if instance.projection is not None:
            await instance.projection.stop()
        if instance.task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await instance.task
        self.instances.pop(r, None)
        return None if instance.lost else instance

    async def _park(self, r: SliceRange) -> None:
        instance = await self._stop_instance(r)
        if instance is not None:
            self._parked[r] = instance.fence.epoch
            _log.info("worker %s stopped range %s of %s", self.me, r, self.name,
                      extra=self._extra("range_stopped", r, instance.fence.epoch))  # fmt: skip

    async def _release_row(self, r: SliceRange, epoch: int) -> None:
        """Give a stopped range's lease back (it would expire by itself otherwise)."""
        self._parked.pop(r, None)
        try:
            async with self.journal.pool.connection() as conn:
                await release_lease(conn, self._sql, self.name, self.me, epoch)
        except (psycopg.Error, JournalError) as error:
            _log.warning("worker %s: releasing %s failed: %s", self.me, r, error,
                         extra=self._extra("retry", r, epoch, error=str(error)))  # fmt: skip
            return
        self.telemetry.lease_released(self.name, r.key, self.me)
        _log.info("worker %s released range %s of %s", self.me, r, self.name,
                  extra=self._extra("lease_released", r, epoch))  # fmt: skip

    def _extra(
        self, event: str, r: SliceRange | None = None, epoch: int | None = None, **more: object
    ) -> dict[str, object]:
        """A lifecycle log line's structured fields (`extra=`): projection, worker, the
        event, and the range and epoch where there is one."""
        fields: dict[str, object] = {"projection": self.name, "worker": self.me, "event": event}
        if r is not None:
            fields["range"] = r.key
        if epoch is not None:
            fields["epoch"] = epoch
        return {**fields, **more}

    def held(self) -> Iterable[HeldRange]:
        """The ranges this worker holds a lease on right now, with their instances."""
        return list(self.instances.values())

"""Spark holds a projection's slices through the fleet's leases, like one more worker.

Only one runner may apply a slice at a time. A Spark projection (or rebuild)
claims one lease per partition range under its own owner id, in the same
tables, under the same claim lock, by the same rule as fleet workers (a range
is claimable only when no other owner's live lease shares a slice with it),
and every partition transaction on the executors is fenced by its range's
lease. So a fleet that is running keeps Spark out (`ProjectionBusy`, naming
the holders), a fleet started while Spark runs waits for Spark's leases, and
a Spark driver that dies stops blocking anyone once its leases expire.

The driver renews the leases from a daemon thread every TTL / 3 while the
streaming query is active and releases them when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from psycopg import Connection

from journal.errors import JournalError
from journal.settings import JournalSettings
from journal.slices import SliceRange
from journal.sync.pool import open_connection
from journal.tables import Tables
from projections.fencing import Fence
from projections.fleet.lease_sql import FleetSql
from projections.settings import ProjectionTableNames
from projections.sync.leases import claim_range, lock_claims, release_lease, renew_leases
from projections.tables import projection_tables

_log = logging.getLogger("slicejournal.projections.spark")

DEFAULT_LEASE_TTL = timedelta(seconds=30)
# How long a start waits for another owner's leases to go (released or expired).
DEFAULT_LEASE_WAIT = timedelta(seconds=5)


class ProjectionBusy(JournalError):
    """Another runner (fleet workers, another Spark job) holds slices of the projection."""


def spark_owner(kind: str = "spark", query_id: str | None = None) -> str:
    """The owner id of a run: `spark:<query id>` when the streaming query's id is known
    before it starts (`checkpoint.query_id`), else a new id per run (two queries of one
    driver are two owners)."""
    if query_id is not None:
        return f"{kind}:{query_id}"
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class SparkLeases:
    """The leases one Spark driver holds for one projection, one per partition range."""

    def __init__(
        self,
        dsn: str,
        settings: JournalSettings,
        name: str,
        ranges: Sequence[SliceRange],
        *,
        owner: str,
        ttl: timedelta = DEFAULT_LEASE_TTL,
        entity_type: str | None = None,
        tables: ProjectionTableNames | None = None,
    ) -> None:
        """`entity_type`: register the projection for `status` if no fleet has (a
        rebuild, which is not a running projection, passes none). `tables`: the
        names of the projections' tables, if not the defaults."""
        self.dsn = dsn
        self.entity_type = entity_type
        self.settings = settings
        self.name = name
        self.ranges = tuple(ranges)
        self.owner = owner
        self.ttl_ms = max(1, int(ttl.total_seconds() * 1000))
        self.fences: tuple[Fence, ...] = ()
        self.tables = projection_tables(Tables(settings), tables)
        self._sql = FleetSql(self.tables)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _connect(self) -> Connection[Any]:
        return open_connection(self.dsn, self.settings)

    def acquire(self, wait: timedelta = timedelta(0)) -> tuple[Fence, ...]:
        """Claim every range, all or nothing; `ProjectionBusy` if another owner still holds
        a slice after `wait` (a query that just ended may be releasing its leases)."""
        deadline = time.monotonic() + wait.total_seconds()
        while True:
            try:
                return self._acquire()
            except ProjectionBusy:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.2)

    def _acquire(self) -> tuple[Fence, ...]:
        s = self._sql
        fences = []
        with self._connect() as conn, conn.transaction():
            if self.entity_type is not None:
                register = (self.name, self.entity_type, len(self.ranges), self.ttl_ms)
                conn.execute(s.register_if_absent, register)
            lock_claims(conn, s, self.name)
            for r in self.ranges:
                epoch, blockers = claim_range(conn, s, self.name, r, self.owner, self.ttl_ms)
                if epoch is None:
                    held = ", ".join(sorted({f"{b.slice_range} by {b.owner}" for b in blockers}))
                    raise ProjectionBusy(
                        f"projection {self.name!r} is running elsewhere ({held}); stop those "
                        "workers (SIGTERM releases their leases) or wait until their leases "
                        "expire, then start it on Spark"
                    )
                fences.append(Fence(self.name, r, self.owner, epoch, self.ttl_ms))
        self.fences = tuple(fences)
        fields = self._extra("lease_claimed", ranges=[r.key for r in self.ranges])
        _log.info("spark owner %s holds %s in %d range(s)", self.owner, self.name, len(fences),
                  extra=fields)  # fmt: skip
        return self.fences

    def _extra(self, event: str, **more: object) -> dict[str, object]:
        """A lease log line's structured fields (`extra=`)."""
        return {"projection": self.name, "worker": self.owner, "event": event, **more}

    def report_running(self, running: bool = True) -> None:
        """Show the ranges as running (or not) in `status`, like a fleet instance does."""
        with self._connect() as conn, conn.transaction():
            for f in self.fences:
                conn.execute(self._sql.report, (running, 0, None, self.name, self.owner, f.epoch))

    def renew(self) -> bool:
        """Extend every lease; False if any was lost (taken over after expiring)."""
        epochs = [f.epoch for f in self.fences]
        with self._connect() as conn:
            renewed = renew_leases(conn, self._sql, self.name, self.owner, epochs, self.ttl_ms)
        return len(renewed) == len(epochs)

    def release(self) -> None:
        """Give every lease back (idempotent); runners waiting for them may claim at once."""
        self._stop.set()
        if not self.fences:
            return
        with self._connect() as conn, conn.transaction():
            for f in self.fences:
                release_lease(conn, self._sql, self.name, self.owner, f.epoch)
        self.fences = ()
        _log.info("spark owner %s released %s", self.owner, self.name,
                  extra=self._extra("lease_released"))  # fmt: skip

    def keep_alive(self, active: Callable[[], bool], on_lost: Callable[[], None]) -> None:
        """Renew every TTL / 3 while `active()`; release when it turns false. A lease that
        could not be renewed calls `on_lost` (the query is stopped: its fenced
        transactions would fail anyway)."""

        def still_active() -> bool:
            try:
                return active()
            except Exception as error:  # its session is gone (a Connect client stopped it)
                _log.debug("spark projection %s: query state unknown, ending: %s", self.name,
                           error)  # fmt: skip
                return False

        def loop() -> None:
            interval = self.ttl_ms / 3000
            due = time.monotonic() + interval
            try:
                # Checked often, so a finished query hands its slices back at once.
                while not self._stop.wait(min(0.25, interval)) and still_active():
                    if time.monotonic() < due:
                        continue
                    due = time.monotonic() + interval
                    try:
                        if not self.renew():
                            _log.error("spark owner %s lost a lease of %s", self.owner,
                                       self.name, extra=self._extra("lease_lost"))  # fmt: skip
                            on_lost()
                            break
                    except Exception as error:  # the database is away: retry next tick
                        _log.warning("renewing the leases of %s failed: %s", self.name, error,
                                     extra=self._extra("retry", error=str(error)))  # fmt: skip
            finally:
                with contextlib.suppress(Exception):
                    self.release()

        self._thread = threading.Thread(target=loop, name=f"slicejournal leases {self.name}")
        self._thread.daemon = True
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

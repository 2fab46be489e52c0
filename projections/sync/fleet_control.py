# Generated from projections/aio/fleet_control.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""Operating a running fleet from any machine: scale, status, offsets.

Everything here talks to PostgreSQL only; the workers notice within one
poll interval. `scale` stores the desired count and can wait until every
range of the new split is owned and running. `set_offset` and
`clear_offset` revoke the leases of the ranges they touch in the same
transaction that rewrites the offsets: the running instances can commit
nothing more (their fence fails), and the instances that re-claim those
ranges start from the new offsets. `SyncFleetControl` is generated from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from journal.errors import JournalError
from journal.slices import SliceRange, slice_ranges
from journal.sync.flavour import sleep
from journal.sync.journal import SyncJournal
from projections.errors import UnknownProjection
from projections.fleet.lease_sql import FleetSql
from projections.fleet.status import FleetStatus, LeaseStatus, NoFleet
from projections.management import check_timestamp
from projections.names import validate_name
from projections.settings import ProjectionTableNames
from projections.sync.management import SyncProjectionManagement
from projections.sync.offset_dao import OffsetDao
from projections.tables import translate_projection_errors


class SyncFleetControl:
    """Scale a fleet, read its status, move its offsets — by projection name."""

    def __init__(self, journal: SyncJournal, *, tables: ProjectionTableNames | None = None) -> None:
        """`tables`: the names of the projections' tables, if not the defaults (those of
        the workers' projections' `ProjectionSettings.tables`)."""
        self._journal = journal
        self._management = SyncProjectionManagement(journal, tables=tables)
        self.tables = self._management.tables
        self._sql = FleetSql(self.tables)

    @translate_projection_errors
    def scale(self, name: str, instances: int) -> bool:
        """Store the desired instance count (a divisor of 1024); True if it changed.

        Raises `InvalidArgument` for a bad count and `UnknownProjection` if no
        worker ever ran the projection; nothing changes then.
        """
        slice_ranges(instances)  # validates before anything is written
        validate_name(name)
        with self._journal.pool.connection() as conn:
            cur = conn.execute(self._sql.scale, (instances, name, instances))
            if cur.rowcount:
                return True
            cur = conn.execute(self._sql.fleet, (name,))
            if cur.fetchone() is None:
                raise self._not_a_fleet(name)
        return False

    def _not_a_fleet(self, name: str) -> UnknownProjection:
        """`NoFleet` for a projection known otherwise (in-process), else `UnknownProjection`."""
        try:
            self._management.require_known(name)
        except UnknownProjection as e:
            return e
        return NoFleet(name)

    @translate_projection_errors
    def status(self, name: str) -> FleetStatus:
        """The desired split, the live workers and every range's lease and progress.

        Raises `UnknownProjection` if no worker ever registered the projection:
        `NoFleet` (a subclass) if it is known otherwise, running in-process.
        """
        validate_name(name)
        with self._journal.pool.connection() as conn:
            cur = conn.execute(self._sql.fleet, (name,))
            row = cur.fetchone()
        if row is None:
            raise self._not_a_fleet(name)
        with self._journal.pool.connection() as conn:
            instances, entity_type, ttl_ms, now, updated_at = row
            cur = conn.execute(self._sql.live_workers, (name,))
            workers = tuple(w for (w,) in cur.fetchall())
            cur = conn.execute(self._sql.lease_details, (name,))
            rows = cur.fetchall()
        ranges = slice_ranges(instances)
        try:
            progress = self._management.status(name, entity_type, ranges)
        except UnknownProjection:  # registered, nothing stored yet
            progress = [None] * len(ranges)  # type: ignore[list-item]
        by_range = {SliceRange(r[0], r[1]): r for r in rows}
        out = []
        for r, p in zip(ranges, progress, strict=True):
            lease = by_range.get(r)
            if lease is None:
                out.append(LeaseStatus(r, None, None, False, 0, None, now - updated_at, p))
                continue
            _, _, owner, epoch, expires, running, restarts, error = lease
            live = owner is not None and expires > now
            unowned = 0.0 if live else now - max(expires, updated_at)
            out.append(
                LeaseStatus(
                    r, owner if live else None, epoch, running and live, restarts, error, unowned, p
                )
            )
        split = set(ranges)
        leftovers = tuple(
            SliceRange(lo, hi)
            for lo, hi, owner, _, expires, *_ in rows
            if owner is not None and expires > now and SliceRange(lo, hi) not in split
        )
        return FleetStatus(name, entity_type, instances, ttl_ms / 1000, workers, tuple(out),
                           leftovers)  # fmt: skip

    @translate_projection_errors
    def wait_converged(
        self,
        name: str,
        *,
        timeout: float,  # a deadline for the whole wait, reported in the error
        interval: float = 0.5,
        progress: Callable[[FleetStatus], None] | None = None,
    ) -> FleetStatus:
        """Poll `status` until the fleet has converged; `JournalError` after `timeout` s.

        A projection no worker has registered yet is waited for too (workers
        just started); it is `UnknownProjection` if none registers in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = self.status(name)
            except UnknownProjection:
                if time.monotonic() >= deadline:
                    raise
                sleep(interval)
                continue
            if progress is not None:
                progress(status)
            if status.converged:
                return status
            if time.monotonic() >= deadline:
                missing = [str(r.slice_range) for r in status.ranges if not r.running]
                raise JournalError(
                    f"projection {name} did not converge within {timeout:.0f} s: "
                    f"not running: {', '.join(missing) or '-'}; "
                    f"old ranges still held: {', '.join(map(str, status.leftovers)) or '-'}; "
                    f"live workers: {len(status.workers)}"
                )
            sleep(interval)

    @translate_projection_errors
    def set_offset(
        self, name: str, timestamp: datetime, slices: SliceRange = SliceRange.FULL
    ) -> None:
        """Resume the projection at `timestamp` for these slices, on a live fleet too."""
        self._rewrite(name, slices, check_timestamp(timestamp))

    @translate_projection_errors
    def clear_offset(self, name: str, slices: SliceRange = SliceRange.FULL) -> None:
        """Forget the offsets of these slices (they restart from the beginning), live too."""
        self._rewrite(name, slices, None)

    def _rewrite(self, name: str, slices: SliceRange, timestamp: datetime | None) -> None:
        validate_name(name)
        SliceRange.check(slices, "slices")
        dao = OffsetDao(self.tables, name)
        with self._journal.pool.connection() as conn, conn.transaction():
            conn.execute(self._sql.lock_fleet, (name,))
            # Revoke every lease sharing a slice: waits for their fenced transactions in
            # flight, then nothing more of theirs can commit.
            conn.execute(self._sql.lock_overlapping, (name, slices.max_slice, slices.min_slice))
            conn.execute(self._sql.revoke, (name, slices.max_slice, slices.min_slice))
            if timestamp is None:
                dao.clear(conn, slices)
            else:
                dao.set_start(conn, slices.key, slices, timestamp)

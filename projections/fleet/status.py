"""What an operator sees of a fleet: the desired split, its workers, every range's lease.

`FleetControl` (`projections/aio/fleet_control.py`, and its generated sync
twin) reads these from PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from journal.errors import JournalError
from journal.slices import SliceRange
from projections.backlog import Backlog
from projections.errors import UnknownProjection
from projections.management import RangeStatus


class NoFleet(UnknownProjection):
    """`FleetControl.status` / `scale` of a projection that is known (it stored
    offsets, was paused or resumed, or dead-lettered an envelope) but that no fleet
    worker ever registered: it runs in-process (a `Projection` or `ProjectionGroup` in
    the application's own process). `ProjectionManagement.status` reports it. An
    `UnknownProjection` too, so code waiting for a fleet to appear keeps waiting."""

    def __init__(self, name: str) -> None:
        self.name = name
        JournalError.__init__(
            self,
            f"projection {name!r} has no fleet: no `slicejournal worker` ever registered it "
            "(it runs in-process); `slicejournal status NAME` shows its offsets, pauses, "
            "backlog and dead letters",
        )


@attrs.frozen
class LeaseStatus:
    """One range of the desired split: who runs it and where it stands."""

    slice_range: SliceRange
    owner: str | None  # None: no live lease
    epoch: int | None
    running: bool
    restarts: int
    last_error: str | None
    # Seconds the range has had no live owner (0 while owned).
    unowned_for: float
    progress: RangeStatus | None = None

    @property
    def lag(self) -> timedelta | None:
        """How far the stored offset is behind the range's newest event (see `backlog`)."""
        return None if self.progress is None else self.progress.lag

    @property
    def backlog(self) -> Backlog | None:
        """The range's events not handled yet, and the age of the oldest."""
        return None if self.progress is None else self.progress.backlog

    @property
    def paused(self) -> bool:
        """True if the range (or the whole projection) is paused."""
        return self.progress is not None and self.progress.paused

    @property
    def resume_from(self) -> datetime | None:
        """Where an instance for this range would resume (None: from the beginning)."""
        return None if self.progress is None else self.progress.resume_from


@attrs.frozen
class FleetStatus:
    """The desired split, the live workers, and every range's lease."""

    name: str
    entity_type: str
    instances: int
    lease_ttl: float
    workers: tuple[str, ...]
    ranges: tuple[LeaseStatus, ...]
    # Live leases of another split, still to be released (a rescale in progress).
    leftovers: tuple[SliceRange, ...] = ()

    @property
    def converged(self) -> bool:
        """Every range of the split is owned and running; nothing of an older split is left."""
        return not self.leftovers and all(r.owner and r.running for r in self.ranges)

    @property
    def orphaned(self) -> tuple[LeaseStatus, ...]:
        """Ranges with no owner for longer than twice the lease TTL."""
        return tuple(r for r in self.ranges if r.unowned_for > 2 * self.lease_ttl)


def orphan_message(status: FleetStatus) -> str | None:
    """The one line `status` prints (and exits non-zero on) when ranges lack an owner."""
    if not status.orphaned:
        return None
    ranges = ", ".join(f"{r.slice_range} ({r.unowned_for:.0f} s)" for r in status.orphaned)
    return f"no owner for longer than 2 x lease TTL ({2 * status.lease_ttl:.0f} s): {ranges}"

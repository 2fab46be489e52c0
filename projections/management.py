"""Operating a projection from outside: the values and checks of management.

The commands themselves (`ProjectionManagement`) are drivers:
`projections/aio/management.py` and its generated sync twin.

State lives in PostgreSQL (`projection_management`, the offset store), so an
operator's command reaches every running instance, in any process, within
`management_poll_interval`, and survives restarts and rescaling. Pausing
the whole projection uses the key "*"; pausing a slice range ("min-max")
pauses every instance that handles any slice of it, whatever the current
split into ranges is.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

import attrs

from journal.errors import InvalidArgument
from journal.slices import SliceRange
from projections.backlog import Backlog


@attrs.frozen
class RangeStatus:
    """Where one slice range of a projection stands."""

    slice_range: SliceRange
    latest_offset: datetime | None
    journal_head: datetime | None
    paused: bool
    # Where an instance for this range would resume: the earliest of its
    # slices' latest rows (None = from the beginning: a slice has no row).
    resume_from: datetime | None = None
    # The events of the range not handled yet, and how long the oldest has waited
    # (projections/backlog.py): what `slicejournal status` and the metrics show.
    backlog: Backlog | None = None

    @property
    def lag(self) -> timedelta | None:
        """How far the stored offset is behind the newest event of the range (the journal's
        head minus the latest offset; see `backlog` for what has been waiting, and how long)."""
        if self.journal_head is None:
            return timedelta(0)
        if self.latest_offset is None:
            return None
        return max(self.journal_head - self.latest_offset, timedelta(0))


@attrs.frozen
class DeadLetter:
    """An envelope a projection skipped after its retries ran out."""

    persistence_id: str
    seq_nr: int
    slice: int
    db_timestamp: datetime
    error: str
    failed_at: datetime


def check_ranges(ranges: object) -> list[SliceRange]:
    """A sequence of `SliceRange`s, or `InvalidArgument` naming the bad one."""
    if isinstance(ranges, str | bytes | SliceRange) or not isinstance(ranges, Iterable):
        raise InvalidArgument(
            f"ranges must be a number of ranges or a sequence of SliceRange, got {ranges!r}"
        )
    return [SliceRange.check(r, f"ranges[{i}]") for i, r in enumerate(ranges)]


def check_timestamp(timestamp: object) -> datetime:
    """A timezone-aware datetime, or `InvalidArgument`."""
    if not isinstance(timestamp, datetime) or timestamp.tzinfo is None:
        raise InvalidArgument(f"timestamp must be a timezone-aware datetime, got {timestamp!r}")
    return timestamp

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

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from journal.errors import InvalidArgument
from journal.slices import SliceRange, validate_persistence_id
from projections.backlog import Backlog


@attrs.frozen
class RangeStatus:
    """Where one slice range of a projection stands."""

    slice_range: SliceRange
    latest_offset: datetime | None
    # The newest row of the range the projection reads: an event, or for a projection
    # over durable state, a change.
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
    #: "parked" (skipped, nothing asked), "pending" (a replay was requested and the
    #: instance owning the slice has not run it yet), "replayed" (handled again; kept
    #: as a record). A replay that failed is "parked" again with the new `error`.
    status: str = "parked"
    replayed_at: datetime | None = None
    #: How many replays of it failed.
    replay_failures: int = 0


def dead_letter_of(row: Sequence[Any]) -> DeadLetter:
    """A dead-letter row (`ManagementSql.dead_letters`'s columns) as a `DeadLetter`."""
    pid, seq_nr, slice_, db_timestamp, error, failed_at, requested, replayed, failures = row
    status = "replayed" if replayed is not None else "pending" if requested else "parked"
    return DeadLetter(
        pid, seq_nr, slice_, db_timestamp, error, failed_at, status, replayed, failures
    )


def check_letters(letters: object) -> list[tuple[str, int]] | None:
    """None (every letter), or a list of (persistence_id, seq_nr); `InvalidArgument`."""
    if letters is None:
        return None
    if isinstance(letters, str | bytes) or not isinstance(letters, Iterable):
        raise InvalidArgument(
            f"letters must be (persistence_id, seq_nr) pairs or None, got {letters!r}"
        )
    out = []
    for letter in letters:
        if (
            not isinstance(letter, tuple)
            or len(letter) != 2
            or not isinstance(letter[0], str)
            or isinstance(letter[1], bool)
            or not isinstance(letter[1], int)
        ):
            raise InvalidArgument(f"a letter is a (persistence_id, seq_nr) pair, got {letter!r}")
        out.append((validate_persistence_id(letter[0]), letter[1]))
    return out


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

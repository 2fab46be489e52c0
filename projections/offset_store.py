"""The per-slice offset store's decisions, with no database handle.

For every envelope a projection receives, `OffsetState.validate` decides:

* **duplicate** — its seq_nr is <= the stored or in-flight seq_nr of its pid,
  or it is older than the time window its slice still tracks (so it was
  handled before its record was cleaned up);
* **accepted** — seq_nr is exactly stored + 1, or 1 for an unknown pid, or the
  previous event is deleted or older than the time window;
* **gap** — an earlier event of the pid has not been seen yet. Instead of
  failing the projection (Pekko), the runner fetches the missing seq_nrs by
  persistence id and feeds them through `validate` in order (Akka's later fix).

Offsets are stored per slice, so a projection instance loads only its slice
range and any future split of the slices can resume. Besides one record per
accepted (pid, seq_nr), each slice keeps a *progress marker* (pid "", seq_nr 0)
that says "everything of this slice before this timestamp was handled" — it is
what lets a range with quiet or empty slices resume without re-reading the
journal from the start. A *start marker* (seq_nr -1) written by
`set_offset` says "ignore everything of this slice before this timestamp".

A range starts from the **earliest** of its slices' latest rows, never the
latest, so a slice that was behind cannot skip events; events the ahead slices
already handled come again and are recognised here as duplicates.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import datetime, timedelta

import attrs

from journal.model import TimestampOffset

PROGRESS_PID = ""
PROGRESS_SEQ_NR = 0
START_SEQ_NR = -1


@attrs.frozen
class Record:
    """One stored offset row: (slice, pid, seq_nr) handled at `timestamp` (db_timestamp)."""

    slice: int
    persistence_id: str
    seq_nr: int
    timestamp: datetime

    @property
    def is_marker(self) -> bool:
        """A progress or start marker rather than a handled event."""
        return self.persistence_id == PROGRESS_PID and self.seq_nr <= PROGRESS_SEQ_NR

    @property
    def is_progress(self) -> bool:
        """A progress marker: the slice has been read up to `timestamp`, no event."""
        return self.persistence_id == PROGRESS_PID and self.seq_nr == PROGRESS_SEQ_NR

    @property
    def is_start(self) -> bool:
        """A start marker (`set_offset`): resume at `timestamp`, skip anything older."""
        return self.persistence_id == PROGRESS_PID and self.seq_nr == START_SEQ_NR


class Verdict(enum.Enum):
    """What the offset store decides about one envelope."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    GAP = "gap"
    NEEDS_PREVIOUS_TIMESTAMP = "needs_previous_timestamp"


@attrs.frozen
class Validation:
    """The decision for one envelope; for a gap, the seq_nrs to fetch first."""

    verdict: Verdict
    missing_from: int = 0
    missing_to: int = 0

    @property
    def accepted(self) -> bool:
        """True if the envelope is to be handled."""
        return self.verdict is Verdict.ACCEPTED


ACCEPTED = Validation(Verdict.ACCEPTED)
DUPLICATE = Validation(Verdict.DUPLICATE)
NEEDS_PREVIOUS_TIMESTAMP = Validation(Verdict.NEEDS_PREVIOUS_TIMESTAMP)


class _Unknown:
    pass


UNKNOWN = _Unknown()


class OffsetState:
    """What one projection instance knows about handled events of its slice range."""

    def __init__(self, time_window: timedelta, records: Iterable[Record] = ()) -> None:
        self.time_window = time_window
        self._by_pid: dict[str, Record] = {}
        self._latest_by_slice: dict[int, Record] = {}
        self._start_by_slice: dict[int, datetime] = {}
        self._inflight: dict[str, int] = {}
        for record in records:
            self._add(record)

    # -- building ----------------------------------------------------------

    def _add(self, record: Record) -> None:
        if record.is_start:
            current = self._start_by_slice.get(record.slice)
            if current is None or record.timestamp > current:
                self._start_by_slice[record.slice] = record.timestamp
        elif not record.is_marker:
            known = self._by_pid.get(record.persistence_id)
            if known is None or record.seq_nr > known.seq_nr:
                self._by_pid[record.persistence_id] = record
        latest = self._latest_by_slice.get(record.slice)
        if latest is None or record.timestamp > latest.timestamp:
            self._latest_by_slice[record.slice] = record

    def saved(self, records: Iterable[Record]) -> None:
        """Records were committed: they are now the stored state, no longer in flight."""
        for record in records:
            self._add(record)
            if self._inflight.get(record.persistence_id, 0) <= record.seq_nr:
                self._inflight.pop(record.persistence_id, None)

    def accept(self, persistence_id: str, seq_nr: int) -> None:
        """An accepted envelope is being handled (not yet saved)."""
        if seq_nr > self._inflight.get(persistence_id, 0):
            self._inflight[persistence_id] = seq_nr

    def discard_inflight(self) -> None:
        """The in-flight batch was rolled back: forget what it accepted."""
        self._inflight.clear()

    # -- queries -------------------------------------------------------------

    def seq_nr_of(self, persistence_id: str) -> int | None:
        """Highest handled (stored or in-flight) seq_nr of the pid, None if unknown."""
        stored = self._by_pid.get(persistence_id)
        inflight = self._inflight.get(persistence_id)
        if stored is None:
            return inflight
        return stored.seq_nr if inflight is None else max(stored.seq_nr, inflight)

    def latest_of_slice(self, slice_: int) -> Record | None:
        """The newest stored row of a slice (event or marker), or None."""
        return self._latest_by_slice.get(slice_)

    @property
    def slices(self) -> frozenset[int]:
        """The slices that have at least one stored row."""
        return frozenset(self._latest_by_slice)

    def start_offset(self, slices: Iterable[int]) -> TimestampOffset | None:
        """Where a stream over `slices` resumes: the earliest of their latest rows.

        None (from the beginning) if any slice has no row at all: nothing says
        how far that slice got.
        """
        slice_set = frozenset(slices)
        latest = []
        for s in slice_set:
            record = self._latest_by_slice.get(s)
            if record is None:
                return None
            latest.append(record.timestamp)
        if not latest:
            return None
        earliest = min(latest)
        seen = {
            r.persistence_id: r.seq_nr
            for r in self._by_pid.values()
            if r.timestamp == earliest and r.slice in slice_set
        }
        return TimestampOffset(earliest, earliest, seen)

    # -- the decision ------------------------------------------------------------

    def validate(
        self,
        persistence_id: str,
        seq_nr: int,
        slice_: int,
        timestamp: datetime,
        previous_timestamp: datetime | _Unknown | None = UNKNOWN,
    ) -> Validation:
        """Accept, drop as duplicate, or report a gap for one envelope.

        For an unknown pid with seq_nr > 1 the answer depends on when its
        previous event was written: the first call returns
        NEEDS_PREVIOUS_TIMESTAMP and the caller asks again with
        `previous_timestamp` (None if that event is deleted or gone). For a
        known pid, None after a gap means the missing events are deleted: accepted.
        """
        start = self._start_by_slice.get(slice_)
        if start is not None and timestamp < start:
            return DUPLICATE  # before the offset set by management
        known = self.seq_nr_of(persistence_id)
        if known is not None:
            if seq_nr <= known:
                return DUPLICATE
            if seq_nr == known + 1:
                return ACCEPTED
            if previous_timestamp is None:
                return ACCEPTED  # the missing events were deleted: nothing to apply first
            return Validation(Verdict.GAP, known + 1, seq_nr - 1)
        window_start = self._window_start(slice_)
        if window_start is not None and timestamp < window_start:
            return DUPLICATE  # older than anything this slice still tracks: handled before
        if seq_nr == 1:
            return ACCEPTED
        if isinstance(previous_timestamp, _Unknown):
            return NEEDS_PREVIOUS_TIMESTAMP
        if previous_timestamp is None:
            return ACCEPTED  # the previous event was deleted
        if window_start is not None and previous_timestamp < window_start:
            return ACCEPTED  # its record was cleaned up with the window
        return Validation(Verdict.GAP, 1, seq_nr - 1)

    def _window_start(self, slice_: int) -> datetime | None:
        latest = self._latest_by_slice.get(slice_)
        return None if latest is None else latest.timestamp - self.time_window

    # -- housekeeping ---------------------------------------------------------------

    def evict(self) -> int:
        """Forget pid records older than their slice's window (the store deletes them too)."""
        drop = []
        for pid, record in self._by_pid.items():
            window_start = self._window_start(record.slice)
            if window_start is not None and record.timestamp < window_start:
                latest = self._latest_by_slice.get(record.slice)
                if latest is not record:
                    drop.append(pid)
        for pid in drop:
            del self._by_pid[pid]
        return len(drop)

    def __len__(self) -> int:
        return len(self._by_pid)

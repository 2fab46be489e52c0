"""The per-slice offset store's decisions, with no database handle.

For every envelope a projection receives, `OffsetState.validate` decides:

* **duplicate** — its seq_nr is <= the stored or in-flight seq_nr of its pid,
  or its timestamp is older than that handled record's (it is from the pid's
  past: below), or it is older than the time window its slice still tracks
  (so it was handled before its record was cleaned up);
* **accepted** — seq_nr is exactly stored + 1, or 1 for an unknown pid, or
  the journal shows every missing event before it deleted (its deletion
  marker, a `deleted = true` row, is at or above them), or the previous event
  is older than the time window; or it starts a new lifetime of a reset id
  (below);
* **gap** — earlier events of the pid have not been seen: the runner fetches
  them by persistence id and feeds them through `validate` in order;
* **rejected** — events before it are neither fetched nor shown deleted: they
  are not visible yet (a late commit, a restore, a replicated write). Pekko's
  rule: nothing is accepted on a guess; the envelope waits and is retried (see
  `projections/core.py`) until backtracking or the retry finds the missing ones.

A gap that finds nothing used to be taken for "deleted": the later event was
accepted and, when the missing one became visible after all, it was dropped
as a duplicate and lost. Only the journal's deletion marker is evidence now.

**Ids reset after deletion.** `Journal.delete_all(pid, reset_sequence_number=True)`
lets an id start again at seq_nr 1. Its tombstone (seq_nr 0, `deleted`) and
any seq_nr 1 whose db_timestamp is later than the pid's handled event by at
least `accept_sequence_number_reset_after` start a new lifetime instead of
being duplicates. Records are therefore ordered per pid by (timestamp,
seq_nr), not seq_nr alone: the newest is the pid's *handled* record.

**A tombstone is handled before the id's next lifetime**, however late the
stream brings it (backtracking re-reads, a transaction the horizon did not
wait for): once a later event is handled, an earlier tombstone is "from the
pid's past" (below) and never applied, and whatever the handler derived from
the erased lifetime would stay. So gap fills fetch tombstones as slice queries
deliver them (a kept sequence's tombstone sits in the gap below the next
event), an unknown pid's previous seq_nr counts as stored when it is a
tombstone (its gap is filled), and a new lifetime's seq_nr 1 first asks for
the id's seq_nr 0 (a gap 0..0): the reset tombstone, if the journal has one
newer than the handled record. A gap fill never takes an event later than the
envelope it is for (`projections/core.py`): after a reset the missing seq_nrs
may be stored again by the next lifetime, and one of those handled in their
place would make the reset tombstone "from the pid's past".

**Nothing older than the handled record comes back.** An envelope whose
db_timestamp is earlier than its pid's handled (stored or in-flight) record
is a duplicate, whatever its seq_nr. Why this is sound and needed: the
journal gives each write of an id a db_timestamp later than the id's previous
row (`GREATEST(now, previous + 1 µs)`), the tombstone included, and a new
lifetime only starts after its tombstone. So an earlier envelope is either of
the handled record's own lifetime — then its seq_nr is lower, it was handled
— or of an earlier lifetime, from before a handled tombstone: its id was
erased and it must never be applied again. Comparing seq_nrs alone cannot
tell: after a reset the handled tombstone is seq_nr 0, so the previous
lifetime's still-visible seq_nr 1 (re-delivered by backtracking or a restart
while the erasure's batches run) looked like "handled + 1", and the later
ones came through the gap fill. A single instance then stored an offset row
it had stored before (`OffsetConflict`), or, once that row was cleaned up,
re-applied an erased event. The same holds for records of two lifetimes in
any order (p:3 at t, then p:2 at t + 1 ms: p:3 at t is not "2 + 1").

The rule needs no record older than the window: `evict` forgets only pids
whose handled record is older than their slice's window, and an unknown
pid's envelope older than the window is a duplicate anyway (below), so
nothing older than a forgotten record can be accepted either.

Offsets are stored per slice, so a projection instance loads only its slice
range and any future split of the slices can resume. Besides one record per
accepted (pid, seq_nr), each slice keeps a *progress marker* (pid "", seq_nr 0)
that says "everything of this slice before this timestamp was handled" — it is
what lets a range with quiet or empty slices resume without re-reading the
journal from the start. A *start marker* (seq_nr -1) written by
`set_offset` says "ignore everything of this slice before this timestamp".

**Revisions (durable state).** With `consecutive=False` the numbers are an id's
durable state revisions (`DurableStateChange.seq_nr`), Akka's rule for
`changesBySlices`: the query delivers the latest revision of each changed id,
so a revision at or below the handled one is a duplicate and any higher one is
accepted. A gap is normal: nothing is looked for and nothing is rejected; ids
never reset (a deletion keeps its revision).

A range starts from the **earliest** of its slices' latest rows, never the
latest, so a slice that was behind cannot skip events; events the ahead slices
already handled come again and are recognised here as duplicates. After a
downscale (0-255 and 256-511 become 0-511) the new range loads the rows of
every slice it covers, whichever key wrote them, and so adopts them.

Memory holds the records of each slice's time window (`evict`); the table may
keep rows longer (`ProjectionSettings.delete_after_consumed`). Once memory was
trimmed, an unknown pid's stored record is looked up in the table
(NEEDS_STORED_OFFSET) before anything else is concluded about it.
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
    REJECTED = "rejected"
    NEEDS_PREVIOUS_TIMESTAMP = "needs_previous_timestamp"
    NEEDS_STORED_OFFSET = "needs_stored_offset"


@attrs.frozen
class Validation:
    """The decision for one envelope; for a gap or a rejection, the seq_nrs missing."""

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
NEEDS_STORED_OFFSET = Validation(Verdict.NEEDS_STORED_OFFSET)
# Fetch the id's seq_nr 0 (a reset tombstone) before accepting a new lifetime's seq_nr 1.
_RESET_TOMBSTONE = Validation(Verdict.GAP, 0, 0)


class _Unknown:
    pass


UNKNOWN = _Unknown()


@attrs.frozen
class _Handled:
    """The newest handled (stored or in-flight) event of a pid; timestamp None if unknown.

    `since`: the newest db_timestamp known of the pid's handled events (an
    in-flight event accepted without its timestamp is no older than the
    stored record): no envelope older than it is new.
    """

    seq_nr: int
    timestamp: datetime | None
    since: datetime | None = None


def _newer(record: Record, than: Record) -> bool:
    """Per pid, later lifetimes win: ordered by (timestamp, seq_nr)."""
    return (record.timestamp, record.seq_nr) > (than.timestamp, than.seq_nr)


def _not_older(seq_nr: int, timestamp: datetime | None, than: _Handled) -> bool:
    """(timestamp, seq_nr) at or after `than`'s; by seq_nr alone if a timestamp is unknown."""
    if timestamp is None or than.timestamp is None:
        return seq_nr >= than.seq_nr
    return (timestamp, seq_nr) >= (than.timestamp, than.seq_nr)


class OffsetState:
    """What one projection instance knows about handled events of its slice range.

    `reset_after` is `accept_sequence_number_reset_after` (None: off, a seq_nr 1
    at or below the handled one is always a duplicate); `table_outlives_memory`
    says the table keeps rows `evict` forgets (`delete_after_consumed`);
    `consecutive=False` validates durable state revisions (gaps are normal).
    """

    def __init__(
        self,
        time_window: timedelta,
        records: Iterable[Record] = (),
        *,
        reset_after: timedelta | None = None,
        table_outlives_memory: bool = False,
        consecutive: bool = True,
    ) -> None:
        self.time_window = time_window
        # False: revisions of durable state, the latest of each id; gaps are normal.
        self.consecutive = consecutive
        self.reset_after = reset_after
        # The table keeps rows after `evict` forgets them (delete_after_consumed).
        self.table_outlives_memory = table_outlives_memory
        # True once memory may lack a pid the table still holds: unknown pids are
        # then looked up there first (NEEDS_STORED_OFFSET).
        self.trimmed = False
        self._by_pid: dict[str, Record] = {}
        self._latest_by_slice: dict[int, Record] = {}
        self._start_by_slice: dict[int, datetime] = {}
        self._inflight: dict[str, _Handled] = {}
        self._looked_up: set[str] = set()
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
            if known is None or _newer(record, known):
                self._by_pid[record.persistence_id] = record
        latest = self._latest_by_slice.get(record.slice)
        if latest is None or record.timestamp > latest.timestamp:
            self._latest_by_slice[record.slice] = record

    def saved(self, records: Iterable[Record]) -> None:
        """Records were committed: they are now the stored state, no longer in flight."""
        for record in records:
            self._add(record)
            inflight = self._inflight.get(record.persistence_id)
            if inflight is not None and _not_older(record.seq_nr, record.timestamp, inflight):
                del self._inflight[record.persistence_id]

    def accept(self, persistence_id: str, seq_nr: int, timestamp: datetime | None = None) -> None:
        """An accepted envelope is being handled (not yet saved).

        A newer one by (timestamp, seq_nr) — a later timestamp is a reset id's new
        lifetime — replaces what is in flight (by seq_nr if a timestamp is unknown);
        an older one never does."""
        current = self._inflight.get(persistence_id)
        if current is None or (
            (seq_nr, timestamp) != (current.seq_nr, current.timestamp)
            and _not_older(seq_nr, timestamp, current)
        ):
            self._inflight[persistence_id] = _Handled(seq_nr, timestamp, timestamp)

    def discard_inflight(self) -> None:
        """The in-flight batch was rolled back: forget what it accepted."""
        self._inflight.clear()

    def looked_up(self, persistence_id: str, record: Record | None) -> None:
        """The answer to NEEDS_STORED_OFFSET: the pid's newest stored row, or None."""
        self._looked_up.add(persistence_id)
        if record is not None:
            self._add(record)

    # -- queries -------------------------------------------------------------

    def _handled(self, persistence_id: str) -> _Handled | None:
        # What is in flight was accepted against what is stored: it is newer.
        inflight = self._inflight.get(persistence_id)
        stored = self._by_pid.get(persistence_id)
        if inflight is None:
            if stored is None:
                return None
            return _Handled(stored.seq_nr, stored.timestamp, stored.timestamp)
        if inflight.since is None and stored is not None:
            # Accepted without its timestamp: no older than the stored record.
            return _Handled(inflight.seq_nr, None, stored.timestamp)
        return inflight

    def seq_nr_of(self, persistence_id: str) -> int | None:
        """Highest handled (stored or in-flight) seq_nr of the pid, None if unknown."""
        handled = self._handled(persistence_id)
        return None if handled is None else handled.seq_nr

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
        *,
        deleted_to: int | None = None,
        snapshot: bool = False,
    ) -> Validation:
        """Accept, drop as duplicate, or report a gap (or a rejection) for one envelope.

        `snapshot`: the envelope is the id's snapshot, standing for its events up to
        `seq_nr` (a start-from-snapshot stream): accepted above the handled seq_nr
        whatever lies between, as a revision is, and a duplicate at or below it.

        `deleted_to` is the journal's evidence, once asked: the highest seq_nr
        of the pid's deletion marker at or above the first missing one (0: none).
        Missing events at or below it are deleted, and so nothing to wait for.

        For an unknown pid with seq_nr > 1 the answer may need the table
        (NEEDS_STORED_OFFSET, when memory was trimmed; see `looked_up`) and
        then when its previous event was written: NEEDS_PREVIOUS_TIMESTAMP,
        and the caller asks again with `previous_timestamp` (None if that event
        is not stored) and the `deleted_to` found beside it.
        """
        start = self._start_by_slice.get(slice_)
        if start is not None and timestamp < start:
            return DUPLICATE  # before the offset set by management
        handled = self._handled(persistence_id)
        if handled is not None:
            if handled.since is not None and timestamp < handled.since:
                # Older than the pid's handled record: of its lifetime (a lower seq_nr),
                # or of an earlier one, from before a handled tombstone. Never again.
                return DUPLICATE
            if not self.consecutive or snapshot:
                return DUPLICATE if seq_nr <= handled.seq_nr else ACCEPTED
            if seq_nr <= handled.seq_nr:
                if not self._resets(seq_nr, timestamp, handled):
                    return DUPLICATE
                if seq_nr == 1 and deleted_to is None:
                    # A new lifetime: its reset tombstone first (below), if the journal
                    # holds one; the gap fill's answer then settles this envelope.
                    return _RESET_TOMBSTONE
                return ACCEPTED
            if seq_nr == handled.seq_nr + 1:
                return ACCEPTED
            return _gap(handled.seq_nr + 1, seq_nr - 1, deleted_to)
        window_start = self._window_start(slice_)
        if window_start is not None and timestamp < window_start:
            return DUPLICATE  # older than anything this slice still tracks: handled before
        if seq_nr <= 1:
            return ACCEPTED  # a first event, or the tombstone of a reset id
        if not self.consecutive or snapshot:
            if self.trimmed and persistence_id not in self._looked_up:
                return NEEDS_STORED_OFFSET
            return ACCEPTED  # a revision or a snapshot: the earlier ones need not be seen
        if deleted_to is not None and seq_nr - 1 <= deleted_to:
            return ACCEPTED  # the previous events were deleted
        if self.trimmed and persistence_id not in self._looked_up:
            return NEEDS_STORED_OFFSET
        if isinstance(previous_timestamp, _Unknown):
            return NEEDS_PREVIOUS_TIMESTAMP
        if previous_timestamp is None:
            # Not stored and not shown deleted: not visible yet. Wait for it.
            return Validation(Verdict.REJECTED, 1, seq_nr - 1)
        if window_start is not None and previous_timestamp < window_start:
            return ACCEPTED  # its record was cleaned up with the window
        return Validation(Verdict.GAP, 1, seq_nr - 1)

    def _resets(self, seq_nr: int, timestamp: datetime, handled: _Handled) -> bool:
        """A reset id's new lifetime rather than a duplicate: its tombstone (seq_nr 0), or
        a seq_nr 1 later than the handled event by at least `reset_after`."""
        if handled.timestamp is None or timestamp <= handled.timestamp:
            return False  # never later: a replay of the original
        if seq_nr == 0:
            return True
        return (
            seq_nr == 1
            and self.reset_after is not None
            and timestamp - handled.timestamp >= self.reset_after
        )

    def _window_start(self, slice_: int) -> datetime | None:
        latest = self._latest_by_slice.get(slice_)
        return None if latest is None else latest.timestamp - self.time_window

    # -- housekeeping ---------------------------------------------------------------

    def evict(self) -> int:
        """Forget pid records older than their slice's window (the store may keep them
        longer: from now on an unknown pid is looked up there first)."""
        drop = []
        for pid, record in self._by_pid.items():
            window_start = self._window_start(record.slice)
            if window_start is not None and record.timestamp < window_start:
                latest = self._latest_by_slice.get(record.slice)
                if latest is not record:
                    drop.append(pid)
        for pid in drop:
            del self._by_pid[pid]
        if drop and self.table_outlives_memory:
            self.trimmed = True
        self._looked_up.clear()
        return len(drop)

    def __len__(self) -> int:
        return len(self._by_pid)


def _gap(missing_from: int, missing_to: int, deleted_to: int | None) -> Validation:
    """Missing events: accepted if the journal shows them all deleted, else a gap."""
    if deleted_to is not None and missing_to <= deleted_to:
        return ACCEPTED
    return Validation(Verdict.GAP, missing_from, missing_to)

"""The projection core, sans I/O: everything a projection instance decides, for every driver.

No asyncio, no psycopg, no clock of its own: every method that needs time
takes `now` (monotonic seconds on the driver's clock). Three drivers run it —
the async runner (`runner.py`, awaits), the synchronous one (`sync_runner.py`,
blocking calls) and the offset-store model tests (an in-memory journal).

`ProjectionCore` is the object they drive, in h11's style: inputs go in
(`offer(env, now)`, and one outcome per action: `answer`, `handled`,
`committed`, `skipped`, `failed`), and each call returns the next `Action`
(small frozen values) or None — nothing to do until the next envelope or
`next_deadline()`, when `poll(now)` hands out a batch whose time is up:

* `StoredOffset` / `PreviousTimestamp` / `MissingEvents` / `LoadPayload` —
  the validation conversation: an unknown pid's stored row (once memory was
  trimmed), the previous event's timestamp of an unknown pid, the events
  missing before a gap (admitted first, in order), each with the journal's
  deletion evidence, and the payload of a backtracked envelope (None:
  deleted since, dropped);
* `Handle` — at-least-once: run the handler outside any transaction;
* `Commit` — exactly-once (one envelope) or grouped (a batch by
  `group_after_envelopes` / `group_after_duration`): the handler and the
  offset rows (events, then the progress markers due) in one transaction;
* `SaveOffsets` — at-least-once offsets (every `save_offset_after_envelopes`
  / `save_offset_after_duration`) or a heartbeat's progress markers.

Inside, `admit` is the validation conversation as a generator (the pattern of
psycopg's `generators.py`: it yields requests and returns the envelopes to
hand out), `Batcher` batches per delivery mode and `progress_markers` picks
the slices that lag, at most every `progress_interval`.

**Rejected envelopes wait.** An envelope whose missing predecessors are
neither fetched by the gap fill nor shown deleted by the journal (a
`deleted = true` marker at or above them) is *rejected*, never accepted on a
guess. The core holds it and offers it again — as soon as an envelope of the
same pid is accepted, every `rejected_retry_interval` (`poll`), and whenever
the stream (its backtracking) delivers it again — and no progress marker
claims its timestamp meanwhile, so a restart re-reads it too. An envelope is
thus applied once its predecessors were, in order, or never if it is a
duplicate. Pekko drops a rejected live envelope and relies on backtracking,
failing the projection when a backtracking one is rejected; holding it also
covers a predecessor that turns up outside any backtracking window (a
restore), without restarting anything.

**Tombstones.** `Journal.delete_all` leaves a tombstone row that the slice
query delivers (`EventEnvelope.deleted`, no event): it goes through the same
validation and reaches the handler, which erases the id's rows. A reset id's
tombstone has seq_nr 0 and starts its new lifetime (`offset_store.py`).

**Durable state.** A core built with `source=STATE_CHANGES` (its offset state
`consecutive=False`) validates revisions: the latest revision of each changed
id, a gap normal, never a `PreviousTimestamp` or `MissingEvents`, never a
rejection. A backtracking change (value not loaded) accepted is loaded by id
(`LoadPayload`, answered with the id's *current* state as a
`DurableStateChange`, or None if the row is gone): if the id moved on to a
newer revision meanwhile, the newest is delivered — revision, value and
`deleted` from the load, offset, source and `db_timestamp` from the change,
as Akka's `loadEnvelope` does — and its offset row stores that newer revision,
so the query's later delivery of it is a duplicate. Delivering the newest
rather than dropping the older one as a duplicate never waits on a later
delivery that a backtracking window might miss.

What stays in the drivers is I/O policy: retries with backoff (they sleep)
and dead letters (they write) — the core learns only the outcome, `skipped`
or `failed` — and the pause checks and the cleanup timer, which are a poll
and a timestamp each and would gain nothing from a round trip through here.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import attrs

from journal.durable_state import DurableStateChange
from journal.errors import ProtocolError
from journal.model import EventEnvelope, TimestampOffset
from projections.offset_store import (
    PROGRESS_PID,
    PROGRESS_SEQ_NR,
    UNKNOWN,
    OffsetState,
    Record,
    Validation,
    Verdict,
)
from projections.settings import ProjectionSettings

_log = logging.getLogger("slicejournal.projections.core")


# What a projection handles: the journal's events or the durable state's changes.
Envelope = EventEnvelope | DurableStateChange


class Rows(Protocol):
    """What the core needs of the stream's row source (`journal.query.source.RowSource`,
    not imported here: the core imports no I/O stack)."""

    @property
    def consecutive(self) -> bool:
        """False: durable state revisions, the latest of each id (gaps normal)."""
        ...


def loaded(env: Envelope) -> bool:
    """False for a backtracking envelope or change whose payload has not been read."""
    return env.event_loaded if isinstance(env, EventEnvelope) else env.value_loaded


def wanted(envelopes: Iterable[Envelope]) -> list[Envelope]:
    """The envelopes a handler sees: not the keys an `EventFilter` left out."""
    return [e for e in envelopes if not (isinstance(e, EventEnvelope) and e.filtered)]


@attrs.frozen
class StoredOffset:
    """Answer with the projection's newest stored `Record` of pid in slice, or None."""

    persistence_id: str
    slice: int


@attrs.frozen
class PreviousTimestamp:
    """Answer with a `Previous`: the db_timestamp of (pid, seq_nr) if it is a row slice
    queries deliver (an event not deleted, or a tombstone), and the journal's deletion
    evidence from that seq_nr on."""

    persistence_id: str
    seq_nr: int


@attrs.frozen
class MissingEvents:
    """Answer with a `GapFill`: the stored events and tombstones of pid with from_seq_nr
    <= seq_nr <= to_seq_nr, in order, and the journal's deletion evidence from
    from_seq_nr on (from_seq_nr 0: a reset id's tombstone, before its new seq_nr 1)."""

    persistence_id: str
    from_seq_nr: int
    to_seq_nr: int


@attrs.frozen
class Previous:
    """The reply to `PreviousTimestamp`.

    `deleted_to`: the highest seq_nr >= the asked one of the pid's deletion
    markers (`deleted = true` rows), 0 if none: every seq_nr up to it is deleted.
    """

    timestamp: datetime | None
    deleted_to: int = 0


@attrs.frozen
class GapFill:
    """The reply to `MissingEvents`: the events found and the deletion evidence
    (`deleted_to`, as in `Previous`). A missing seq_nr neither found nor at or
    below `deleted_to` is not visible yet: the envelope after it is rejected."""

    events: Sequence[EventEnvelope]
    deleted_to: int = 0


@attrs.frozen
class LoadPayload:
    """Answer with the envelope (payload loaded) of (pid, seq_nr), or None if deleted.

    For durable state: the id's current state as a `DurableStateChange` (its
    revision may be newer than `seq_nr`), or None if it has no row."""

    persistence_id: str
    seq_nr: int


Request = StoredOffset | PreviousTimestamp | MissingEvents | LoadPayload
Admission = Generator[Request, Any, list[Envelope]]


@attrs.define
class ProjectionStats:
    """Counters of one projection instance since it started."""

    accepted: int = 0
    duplicates: int = 0
    gaps_filled: int = 0
    rejected: int = 0
    skipped: int = 0
    retries: int = 0
    transactions: int = 0
    cleaned_up: int = 0
    heartbeats: int = 0
    latest_timestamp: datetime | None = None


def record_of(env: Envelope) -> Record:
    """The offset row an accepted envelope is stored as."""
    return Record(env.slice, env.persistence_id, env.seq_nr, env.db_timestamp)


def _waits_for(gap: Validation, fill: GapFill) -> int:
    """The evidence the envelope after a filled gap is validated with.

    A missing event the fill found is visible: it was handled just now, or
    dropped on purpose (before an offset set by management, a duplicate). Only
    one neither found nor deleted is still to wait for; if there is none, the
    whole gap counts as settled.
    """
    first = max(gap.missing_from, fill.deleted_to + 1)
    unsettled = gap.missing_to - first + 1
    found = sum(1 for e in fill.events if first <= e.seq_nr <= gap.missing_to)
    return gap.missing_to if unsettled <= found else fill.deleted_to


def same_instant(a: datetime, b: datetime) -> bool:
    """Whether two aware datetimes are one instant, whatever their zones (`==` between
    zones is never true in a repeated hour): a loaded row is the one read before."""
    return a - b == timedelta(0)


def _of_its_lifetime(fill: GapFill, ts: datetime) -> GapFill:
    """The gap fill without the events later than the envelope (at `ts`) it was for.

    An id that `delete_all` reset numbers its next lifetime from 1 again, so the
    missing seq_nrs may be stored again, by the later lifetime, once an envelope
    of the earlier one comes (a read buffered before the erasure, a late commit,
    backtracking). Those rows are not the missing events, which are never later
    than the envelope after them (an id's timestamps grow with its seq_nrs):
    taken for them, one of them was handled in place of the id's reset tombstone,
    which was then older than the handled record and dropped, and so were the
    later lifetime's events up to it. Without them the gap stays open: the
    envelope is rejected and held until the tombstone makes it a duplicate.

    A later tombstone stays: it erases the envelope's lifetime too (a reset
    tombstone that a second reset moved past the lifetime being read, a later
    lifetime's kept-sequence one), so it is handled first and the envelope, older
    than it, is a duplicate."""
    events = [e for e in fill.events if e.db_timestamp <= ts or e.deleted]
    if len(events) == len(fill.events):
        return fill
    return GapFill(events, fill.deleted_to)


def admit(
    state: OffsetState,
    env: Envelope,
    stats: ProjectionStats,
    *,
    where: str = "",
    log: logging.Logger = _log,
    fields: Mapping[str, object] | None = None,
    rejected: list[Envelope] | None = None,
    evidence: int | None = None,
    fetched: Mapping[int, datetime] | None = None,
) -> Admission:
    """Validate `env`; yields `Request`s, returns the envelopes to handle (gap fillers first).

    A rejected `env` is appended to `rejected` (to be held and retried). With
    `evidence` and `fetched` (the deletion evidence and the seq_nrs -> timestamps
    of a gap fill that fetched `env`), a remaining gap is a rejection at once:
    the fill already looked.
    """
    pid, seq_nr, slice_, ts = env.persistence_id, env.seq_nr, env.slice, env.db_timestamp
    # A snapshot stands for the id's events up to its seq_nr (start from snapshots).
    snapshot = isinstance(env, EventEnvelope) and env.from_snapshot
    # Inside a gap fill, a predecessor that was not fetched is not stored.
    previous: datetime | Any | None = UNKNOWN if fetched is None else fetched.get(seq_nr - 1)
    v = state.validate(pid, seq_nr, slice_, ts, previous, deleted_to=evidence, snapshot=snapshot)
    if v.verdict is Verdict.NEEDS_STORED_OFFSET:
        stored: Record | None = yield StoredOffset(pid, slice_)
        state.looked_up(pid, stored)
        v = state.validate(
            pid, seq_nr, slice_, ts, previous, deleted_to=evidence, snapshot=snapshot
        )
    if v.verdict is Verdict.NEEDS_PREVIOUS_TIMESTAMP:
        found: Previous = yield PreviousTimestamp(pid, seq_nr - 1)
        previous = found.timestamp
        v = state.validate(pid, seq_nr, slice_, ts, previous, deleted_to=found.deleted_to)
    if v.verdict is Verdict.DUPLICATE:
        stats.duplicates += 1
        return []
    accepted: list[Envelope] = []
    if v.verdict is Verdict.GAP and fetched is None:
        # Earlier events of this pid have not come yet (they committed late, or the
        # range started after them): admit the missing ones first.
        fill = _of_its_lifetime((yield MissingEvents(pid, v.missing_from, v.missing_to)), ts)
        timestamps = {e.seq_nr: e.db_timestamp for e in fill.events}
        for earlier in fill.events:
            stats.gaps_filled += 1
            accepted += yield from admit(
                state, earlier, stats, where=where, log=log, fields=fields,
                evidence=fill.deleted_to, fetched=timestamps,
            )  # fmt: skip
        log.info(
            "projection %s: gap before %r seq_nr %d filled with %d event(s)",
            where,
            pid,
            seq_nr,
            len(fill.events),
            extra={**(fields or {}), "event": "gap_filled", "persistence_id": pid,
                   "seq_nr": seq_nr, "events": len(fill.events)},
        )  # fmt: skip
        v = state.validate(pid, seq_nr, slice_, ts, previous, deleted_to=_waits_for(v, fill))
        if v.verdict is Verdict.DUPLICATE:
            stats.duplicates += 1
            return accepted
    if not v.accepted:
        # A gap the journal does not show deleted: its events are not visible yet.
        if rejected is not None:
            stats.rejected += 1
            rejected.append(env)
            log.info(
                "projection %s: %r seq_nr %d rejected: seq_nr %d-%d not visible yet "
                "and not deleted; held until they are",
                where,
                pid,
                seq_nr,
                v.missing_from,
                v.missing_to,
                extra={**(fields or {}), "event": "rejected", "persistence_id": pid,
                       "seq_nr": seq_nr},
            )  # fmt: skip
        return accepted
    if not loaded(env):
        found_env: Envelope | None = yield LoadPayload(pid, seq_nr)
        if found_env is None or (
            state.consecutive and not same_instant(found_env.db_timestamp, ts)
        ):
            # Deleted since: nothing to apply. Or the seq_nr is stored again by a later
            # lifetime of a reset id (`_of_its_lifetime`): that event is not this one.
            stats.duplicates += 1
            return accepted
        # Durable state: the id's current revision, maybe newer (the module's docstring).
        env = found_env._replace(offset=env.offset, source=env.source, db_timestamp=ts)
        seq_nr = env.seq_nr
    state.accept(pid, seq_nr, ts)
    stats.accepted += 1
    accepted.append(env)
    return accepted


def progress_markers(
    state: OffsetState,
    slices: Iterable[int],
    progress: datetime | None,
    last_saved_at: float,
    now: float,
    interval: timedelta,
) -> list[Record]:
    """Markers for slices whose latest row lags `progress`, at most once per `interval`."""
    if progress is None or now - last_saved_at < interval.total_seconds():
        return []
    out = []
    for s in slices:
        latest = state.latest_of_slice(s)
        if latest is None or latest.timestamp < progress - interval:
            out.append(Record(s, PROGRESS_PID, PROGRESS_SEQ_NR, progress))
    return out


def converse(conversation: Admission, answer: Callable[[Request], Any]) -> list[Envelope]:
    """Run `admit` to its end with a blocking `answer(request)` (sync runner, model tests)."""
    reply: Any = None
    while True:
        try:
            request = conversation.send(reply)
        except StopIteration as done:
            accepted: list[Envelope] = done.value
            return accepted
        reply = answer(request)


class Mode(enum.Enum):
    """Delivery mode of a projection instance."""

    EXACTLY_ONCE = "exactly_once"
    GROUPED = "grouped"
    AT_LEAST_ONCE = "at_least_once"


@attrs.define
class Batcher:
    """When accepted envelopes go out, per delivery mode.

    exactly-once: each envelope at once (one transaction each); grouped: a
    batch after `group_after_envelopes` or `group_after_duration`;
    at-least-once: the handler already ran, and the offsets of a batch are
    saved after `save_offset_after_envelopes` or `save_offset_after_duration`.
    """

    mode: Mode
    size: int
    wait: float
    pending: list[Envelope] = attrs.field(factory=list)
    started: float = 0.0

    @classmethod
    def for_mode(cls, mode: Mode, settings: ProjectionSettings) -> Batcher:
        if mode is Mode.AT_LEAST_ONCE:
            size, wait = settings.save_offset_after_envelopes, settings.save_offset_after_duration
        else:
            size, wait = settings.group_after_envelopes, settings.group_after_duration
        return cls(mode, size, wait.total_seconds())

    @property
    def empty(self) -> bool:
        return not self.pending

    def add(self, env: Envelope, now: float) -> list[Envelope]:
        """The batch that is due now because of `env` (empty: wait for more or the clock)."""
        if self.mode is Mode.EXACTLY_ONCE:
            return [env]
        if not self.pending:
            self.started = now
        self.pending.append(env)
        return self.take() if len(self.pending) >= self.size else []

    def due(self) -> float:
        """When the pending batch must go out even if nothing else arrives."""
        return self.started + self.wait if self.pending else float("inf")

    def take(self) -> list[Envelope]:
        batch, self.pending = self.pending, []
        return batch


# -- the core object: actions out, outcomes in ----------------------------------------------------


@attrs.frozen
class Handle:
    """At-least-once: run the handler on `envelope`, outside any transaction.

    Answer with `handled(now)`, `skipped(now)` (dead-lettered after retries)
    or `failed()`.
    """

    envelope: Envelope


@attrs.frozen
class Commit:
    """Exactly-once / grouped: the handler on `envelopes` and `records` in one transaction.

    `records` are the envelopes' offset rows (`events`) followed by the
    progress markers due. Answer with `committed(now)`; `skipped(now)` if
    the envelopes were dead-lettered instead (their `events` rows written in
    that transaction, no markers); or `failed()`.
    """

    envelopes: tuple[Envelope, ...]
    events: tuple[Record, ...]
    markers: tuple[Record, ...] = ()

    @property
    def records(self) -> list[Record]:
        return [*self.events, *self.markers]


@attrs.frozen
class SaveOffsets:
    """Write `records` in a transaction of their own (at-least-once offsets, or progress
    markers from a heartbeat), then `committed(now)`."""

    records: tuple[Record, ...]


Action = (
    StoredOffset | PreviousTimestamp | MissingEvents | LoadPayload | Handle | Commit | SaveOffsets
)


class ProjectionCore:
    """Everything one projection instance decides, as a plain object (h11's style).

    The driver feeds it envelopes with `offer(env, now)` and gets back the
    next `Action`, or None when there is nothing to do until the next
    envelope or `next_deadline()`. Every action is answered by exactly one
    call, which returns the next action:

    * `StoredOffset` / `PreviousTimestamp` / `MissingEvents` / `LoadPayload` ->
      `answer(reply, now)`;
    * `Handle` -> `handled(now)` | `skipped(now)` | `failed()`;
    * `Commit` -> `committed(now)` | `skipped(now)` | `failed()`;
    * `SaveOffsets` -> `committed(now)`.

    `poll(now)` hands out a batch whose time is up (or retries the rejected
    envelopes held, when due), `flush(now)` the pending batch whatever its
    age (pause, stop), `retry(now)` the held envelopes at once. The clock is injected: `now` is
    monotonic seconds, on whatever clock the driver uses.

    The driver keeps the I/O policy: retries with backoff and dead letters
    (they sleep and write; the core only learns the outcome), the pause
    checks and the cleanup timer (`cleaned_up` tells the core). It pickles
    between envelopes, not in the middle of an admission conversation.
    """

    def __init__(
        self,
        mode: Mode,
        settings: ProjectionSettings,
        slices: Iterable[int],
        *,
        stats: ProjectionStats | None = None,
        state: OffsetState | None = None,
        where: str = "",
        log: logging.Logger = _log,
        fields: Mapping[str, object] | None = None,
        source: Rows | None = None,
    ) -> None:
        self.mode = mode
        self.settings = settings
        # What the stream reads: events (None), or durable state changes (revisions, gaps
        # normal): `journal.query.source.EVENTS` or `STATE_CHANGES`.
        self.consecutive = True if source is None else source.consecutive
        self.slices = slices
        self.stats = stats if stats is not None else ProjectionStats()
        self.where = where
        self.log = log
        # The structured fields of its log lines (projection, range): `extra=`.
        self.fields = dict(fields or {})
        self.state = state if state is not None else self._state(())
        self._batcher = Batcher.for_mode(mode, settings)
        # Rejected envelopes, by (pid, seq_nr), until accepted or found duplicates.
        self._held: dict[tuple[str, int], Envelope] = {}
        self._rejected: list[Envelope] = []
        self._retry_at = float("inf")
        self._progress: datetime | None = None
        self._progress_saved_at = 0.0
        self._conversation: Admission | None = None
        self._offered: Envelope | None = None
        self._accepted: deque[Envelope] = deque()
        self._outstanding: Action | None = None

    def start(self, records: Iterable[Record]) -> TimestampOffset | None:
        """(Re)start from the stored offset rows; returns where the slice stream resumes.

        Whatever a failed run left in flight is dropped: the stream delivers it again.
        """
        self.state = self._state(records)
        self._batcher.take()
        self._abandon()
        return self.state.start_offset(self.slices)

    def _state(self, records: Iterable[Record]) -> OffsetState:
        settings = self.settings
        return OffsetState(
            settings.time_window,
            records,
            reset_after=settings.accept_sequence_number_reset_after,
            table_outlives_memory=settings.delete_after_consumed is not None,
            consecutive=self.consecutive,
        )

    @property
    def held(self) -> tuple[Envelope, ...]:
        """The rejected envelopes waiting for their predecessors, in (pid, seq_nr) order."""
        return tuple(self._held[k] for k in sorted(self._held))

    @property
    def pending(self) -> tuple[Envelope, ...]:
        """The accepted envelopes of the batch not yet handed out."""
        return tuple(self._batcher.pending)

    # -- inputs -----------------------------------------------------------------------------

    def offer(self, env: Envelope, now: float) -> Action | None:
        """The next envelope of the stream (heartbeats and backtracking ones included)."""
        self._idle_or_fail("offer")
        if env.is_heartbeat:
            self.stats.heartbeats += 1
            return None if env.offset is None else self.progress(env.offset.timestamp, now)
        self._offered = env
        decided = self._admit_at_once(env)
        if decided is not None:  # as `_converse` ends a conversation, without one
            self._settle(decided, now)
            self._accepted.extend(decided)
            return self._next(now)
        self._conversation = self._admit(env)
        return self._converse(None, now)

    def retry(self, now: float) -> Action | None:
        """Offer the held (rejected) envelopes again, now."""
        self._idle_or_fail("retry")
        held = self.held
        self._held.clear()
        self._retry_at = now + self.settings.rejected_retry_interval.total_seconds()
        if not held:
            return None
        self._conversation = self._readmit(held)
        return self._converse(None, now)

    def progress(self, timestamp: datetime, now: float) -> Action | None:
        """Every event of the range up to `timestamp` has been offered (a heartbeat of the
        stream, or a Spark batch's end): slices whose latest stored row lags it get a
        progress marker, at most once per `progress_interval`, while no batch is pending."""
        self._idle_or_fail("progress")
        if not self._batcher.empty:
            return None
        self._progress = timestamp
        markers = self._markers(now)
        return self._out(SaveOffsets(tuple(markers))) if markers else None

    def answer(self, reply: Any, now: float) -> Action | None:
        """The reply to a `StoredOffset`, `PreviousTimestamp`, `MissingEvents` or `LoadPayload`."""
        self._expect("answer", StoredOffset, PreviousTimestamp, MissingEvents, LoadPayload)
        return self._converse(reply, now)

    def handled(self, now: float) -> Action | None:
        """At-least-once: the handler is done with the `Handle`'s envelope."""
        action = self._expect("handled", Handle)
        assert isinstance(action, Handle)
        return self._add(action.envelope, now) or self._next(now)

    def committed(self, now: float) -> Action | None:
        """The `Commit` or `SaveOffsets` transaction committed."""
        action = self._expect("committed", Commit, SaveOffsets)
        assert isinstance(action, Commit | SaveOffsets)
        self._saved(action.records, now)
        return self._next(now)

    def skipped(self, now: float) -> Action | None:
        """The retries ran out and the envelopes were dead-lettered (see `Handle`, `Commit`)."""
        action = self._expect("skipped", Handle, Commit)
        if isinstance(action, Handle):
            self.stats.skipped += 1
            return self._add(action.envelope, now) or self._next(now)
        assert isinstance(action, Commit)
        self._saved(action.events, now)
        self.stats.skipped += len(action.envelopes)
        return self._next(now)

    def failed(self) -> None:
        """The handler kept failing, or the driver crashed: forget everything in flight
        (the pending batch too), so whatever comes next is validated afresh."""
        self.state.discard_inflight()
        self._batcher.take()
        self._abandon()

    def cleaned_up(self, deleted: int) -> None:
        """The store deleted `deleted` rows older than the window: forget them here too."""
        self.state.evict()
        self.stats.cleaned_up += deleted

    # -- time ---------------------------------------------------------------------------------

    def next_deadline(self) -> float:
        """When the pending batch must go out, or the held envelopes be retried, even if no
        envelope arrives (inf: none)."""
        retry = self._retry_at if self._held else float("inf")
        return min(self._batcher.due(), retry)

    def poll(self, now: float) -> Action | None:
        """The pending batch if its time is up at `now`, else the held envelopes' retry."""
        if now >= self._batcher.due():
            return self.flush(now)
        if self._held and now >= self._retry_at:
            return self.retry(now)
        return None

    def flush(self, now: float) -> Action | None:
        """The pending batch, whatever its age (pause, stop)."""
        self._idle_or_fail("flush")
        batch = self._batcher.take()
        return self._out(self._deliver(batch, now)) if batch else None

    # -- inside ---------------------------------------------------------------------------------

    def _admit(self, env: Envelope) -> Admission:
        return admit(self.state, env, self.stats, where=self.where, log=self.log,
                     fields=self.fields, rejected=self._rejected)  # fmt: skip

    def _admit_at_once(self, env: Envelope) -> list[Envelope] | None:
        """What `admit` returns when its first validation decides alone — a duplicate,
        or accepted with its payload at hand: most envelopes of a stream — without
        the generator it would run (a catch-up offers every event). None when `admit`
        must converse: a gap, a lookup, a payload to load, a rejection."""
        snapshot = isinstance(env, EventEnvelope) and env.from_snapshot
        pid, seq_nr, ts = env.persistence_id, env.seq_nr, env.db_timestamp
        verdict = self.state.validate(pid, seq_nr, env.slice, ts, snapshot=snapshot).verdict
        if verdict is Verdict.DUPLICATE:
            self.stats.duplicates += 1
            return []
        if verdict is Verdict.ACCEPTED and loaded(env):
            self.state.accept(pid, seq_nr, ts)
            self.stats.accepted += 1
            return [env]
        return None

    def _readmit(self, envelopes: Sequence[Envelope]) -> Admission:
        accepted: list[Envelope] = []
        for env in envelopes:
            accepted += yield from self._admit(env)
        return accepted

    def _converse(self, reply: Any, now: float) -> Action | None:
        assert self._conversation is not None
        try:
            request = self._conversation.send(reply)
        except StopIteration as done:
            self._conversation = None
            self._settle(done.value, now)
            self._accepted.extend(done.value)
            return self._next(now)
        return self._out(request)

    def _settle(self, accepted: Sequence[Envelope], now: float) -> None:
        """Hold what the conversation rejected; an accepted pid's held envelopes are due."""
        for env in accepted:
            self._held.pop((env.persistence_id, env.seq_nr), None)
        if self._rejected:
            if not self._held:
                self._retry_at = now + self.settings.rejected_retry_interval.total_seconds()
            for env in self._rejected:
                self._held[(env.persistence_id, env.seq_nr)] = env
            self._rejected.clear()
        if self._held:
            waiting = {pid for pid, _ in self._held}
            if any(env.persistence_id in waiting for env in accepted):
                self._retry_at = now  # their predecessor may have just arrived

    def _next(self, now: float) -> Action | None:
        """Hand out the accepted envelopes one by one, then finish the offered one."""
        while self._accepted:
            env = self._accepted.popleft()
            if self.mode is Mode.AT_LEAST_ONCE:
                return self._out(Handle(env))
            action = self._add(env, now)
            if action is not None:
                return action
        offered, self._offered = self._offered, None
        # Only positions of the normal query count as progress (a backtracking
        # envelope's offset lies behind it); markers of this envelope's own
        # commit still claim the previous position.
        if offered is not None and offered.source == "query":
            timestamp = offered._offset_timestamp()  # without building the offset
            if timestamp is not None:
                self._progress = self.stats.latest_timestamp = timestamp
        return None

    def _add(self, env: Envelope, now: float) -> Action | None:
        """Into the batch; the batch's delivery if that made it due."""
        due = self._batcher.add(env, now)
        return self._out(self._deliver(due, now)) if due else None

    def _deliver(self, batch: list[Envelope], now: float) -> Commit | SaveOffsets:
        events = tuple(record_of(e) for e in batch)
        markers = tuple(self._markers(now))
        if self.mode is Mode.AT_LEAST_ONCE:
            return SaveOffsets(events + markers)
        return Commit(tuple(batch), events, markers)

    def _markers(self, now: float) -> list[Record]:
        progress = self._progress
        if progress is not None and self._held:
            # A marker says "everything before it was handled": never past one held.
            progress = min(progress, *(e.db_timestamp for e in self._held.values()))
        return progress_markers(
            self.state,
            self.slices,
            progress,
            self._progress_saved_at,
            now,
            self.settings.progress_interval,
        )

    def _saved(self, records: Sequence[Record], now: float) -> None:
        self.state.saved(records)
        self.stats.transactions += 1
        if any(r.is_progress for r in records):
            self._progress_saved_at = now

    def _out(self, action: Action) -> Action:
        self._outstanding = action
        return action

    def _expect(self, call: str, *kinds: type) -> Action:
        action, self._outstanding = self._outstanding, None
        if action is None or not isinstance(action, kinds):
            self._outstanding = action
            raise ProtocolError(f"{call}() does not answer {action!r}")
        return action

    def _idle_or_fail(self, call: str) -> None:
        if self._outstanding is not None or self._offered is not None:
            raise ProtocolError(f"{call}() while {self._outstanding!r} is unanswered")

    def _abandon(self) -> None:
        if self._conversation is not None:
            self._conversation.close()
        self._conversation = None
        self._rejected.clear()
        self._offered = None
        self._accepted.clear()
        self._outstanding = None

    def __getstate__(self) -> dict[str, Any]:
        if self._conversation is not None:
            raise TypeError("a ProjectionCore pickles between envelopes, not during an admission")
        return dict(self.__dict__)

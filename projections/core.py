"""The projection core, sans I/O: what to do with each envelope, for every runner.

Admitting an envelope is a conversation: validate it against the offset store;
maybe ask for the previous event's timestamp; on a gap ask for the missing
events and admit those first; for a backtracked envelope ask for its payload.
`admit` is that conversation as a generator (the pattern of psycopg's
`generators.py`): it *yields* a request, the driver answers with `send()`, and
it finally *returns* the envelopes to hand to the handler, in order, each
already accepted as in flight. The async runner answers with awaits, the
synchronous runner with blocking calls, the model tests with an in-memory
journal — all three run this same code.

`Batcher` decides, per delivery mode, when accepted envelopes are committed
(or, at-least-once, when their offsets are saved), and `progress_markers`
which slices get a progress marker — both with the clock injected as `now`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Generator, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from journal.model import EventEnvelope
from projections.offset_store import (
    PROGRESS_PID,
    PROGRESS_SEQ_NR,
    OffsetState,
    Record,
    Verdict,
)
from projections.settings import ProjectionSettings

_log = logging.getLogger("slicejournal.projections.core")


@attrs.frozen
class PreviousTimestamp:
    """Answer with the db_timestamp of (pid, seq_nr), or None if deleted or gone."""

    persistence_id: str
    seq_nr: int


@attrs.frozen
class MissingEvents:
    """Answer with the stored events of pid with from_seq_nr <= seq_nr <= to_seq_nr, in order."""

    persistence_id: str
    from_seq_nr: int
    to_seq_nr: int


@attrs.frozen
class LoadPayload:
    """Answer with the envelope (payload loaded) of (pid, seq_nr), or None if deleted."""

    persistence_id: str
    seq_nr: int


Request = PreviousTimestamp | MissingEvents | LoadPayload
Admission = Generator[Request, Any, list[EventEnvelope]]


@attrs.define
class ProjectionStats:
    """Counters of one projection instance since it started."""

    accepted: int = 0
    duplicates: int = 0
    gaps_filled: int = 0
    skipped: int = 0
    retries: int = 0
    transactions: int = 0
    cleaned_up: int = 0
    heartbeats: int = 0
    latest_timestamp: datetime | None = None


def record_of(env: EventEnvelope) -> Record:
    """The offset row an accepted envelope is stored as."""
    return Record(env.slice, env.persistence_id, env.seq_nr, env.db_timestamp)


def admit(
    state: OffsetState, env: EventEnvelope, stats: ProjectionStats, *, where: str = ""
) -> Admission:
    """Validate `env`; yields `Request`s, returns the envelopes to handle (gap fillers first)."""
    pid, seq_nr = env.persistence_id, env.seq_nr
    v = state.validate(pid, seq_nr, env.slice, env.db_timestamp)
    if v.verdict is Verdict.NEEDS_PREVIOUS_TIMESTAMP:
        previous = yield PreviousTimestamp(pid, seq_nr - 1)
        v = state.validate(pid, seq_nr, env.slice, env.db_timestamp, previous)
    if v.verdict is Verdict.DUPLICATE:
        stats.duplicates += 1
        return []
    accepted: list[EventEnvelope] = []
    if v.verdict is Verdict.GAP:
        # An earlier event of this pid has not come yet (it committed late, or
        # the range started after it): admit the missing ones first.
        missing: Sequence[EventEnvelope] = yield MissingEvents(pid, v.missing_from, v.missing_to)
        for earlier in missing:
            stats.gaps_filled += 1
            accepted += yield from admit(state, earlier, stats, where=where)
        _log.info(
            "projection %s: gap before %r seq_nr %d filled with %d event(s)",
            where,
            pid,
            seq_nr,
            len(missing),
        )
        v = state.validate(pid, seq_nr, env.slice, env.db_timestamp, None)
        if not v.accepted:
            stats.duplicates += 1
            return accepted
    if not env.event_loaded:
        loaded: EventEnvelope | None = yield LoadPayload(pid, seq_nr)
        if loaded is None:  # deleted since: nothing to apply
            stats.duplicates += 1
            return accepted
        env = attrs.evolve(loaded, offset=env.offset, source=env.source)
    state.accept(pid, seq_nr)
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


def converse(conversation: Admission, answer: Callable[[Request], Any]) -> list[EventEnvelope]:
    """Run `admit` to its end with a blocking `answer(request)` (sync runner, model tests)."""
    reply: Any = None
    while True:
        try:
            request = conversation.send(reply)
        except StopIteration as done:
            accepted: list[EventEnvelope] = done.value
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
    pending: list[EventEnvelope] = attrs.field(factory=list)
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

    def add(self, env: EventEnvelope, now: float) -> list[EventEnvelope]:
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

    def take(self) -> list[EventEnvelope]:
        batch, self.pending = self.pending, []
        return batch

"""The offset store's decisions (`projections.offset_store`), without a database.

`OffsetState` and the projection core are sans-I/O, so the real core
(`projections.core.ProjectionCore`) is driven here the way the runners drive
it — its previous-timestamp and missing-events requests answered from an
in-memory journal model, accepted envelopes committed in batches — over
generated histories. `Store` mirrors the SQL of `projections/offset_sql.py` (save replaces a
slice's progress marker; cleanup deletes rows older than the slice's latest
minus the window), so rescaling can be checked end to end in milliseconds.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from journal import NUMBER_OF_SLICES, EventEnvelope, SliceRange, TimestampOffset, slice_ranges
from projections.core import (
    Commit,
    GapFill,
    MissingEvents,
    Mode,
    Previous,
    PreviousTimestamp,
    ProjectionCore,
)
from projections.offset_store import (
    PROGRESS_PID,
    PROGRESS_SEQ_NR,
    START_SEQ_NR,
    OffsetState,
    Record,
    Verdict,
)
from projections.settings import ProjectionSettings

BASE = datetime(2024, 1, 1, tzinfo=UTC)
WINDOW = timedelta(seconds=60)
# Batches go out only when a test flushes them: the injected clock stands still.
MODEL_SETTINGS = ProjectionSettings(group_after_envelopes=2**62, group_after_duration=60.0)
NOW = 0.0

ACCEPTED = Verdict.ACCEPTED
DUPLICATE = Verdict.DUPLICATE
GAP = Verdict.GAP
NEEDS_PREVIOUS = Verdict.NEEDS_PREVIOUS_TIMESTAMP


def at(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)


def rec(slice_: int, pid: str, seq_nr: int, seconds: float) -> Record:
    return Record(slice_, pid, seq_nr, at(seconds))


def progress_marker(slice_: int, seconds: float) -> Record:
    return Record(slice_, PROGRESS_PID, PROGRESS_SEQ_NR, at(seconds))


def start_marker(slice_: int, seconds: float) -> Record:
    return Record(slice_, PROGRESS_PID, START_SEQ_NR, at(seconds))


# -- the journal model and a runner-like driver ----------------------------------------------------


@attrs.frozen
class Ev:
    """One journal event: db_timestamp `ts` in whole seconds after BASE."""

    pid: str
    seq_nr: int
    slice: int
    ts: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.pid, self.seq_nr)

    @property
    def timestamp(self) -> datetime:
        return at(self.ts)

    def record(self) -> Record:
        return Record(self.slice, self.pid, self.seq_nr, self.timestamp)

    def envelope(self) -> EventEnvelope:
        return EventEnvelope(self.pid, "T", self.slice, self.seq_nr, self.timestamp, "payload")


def request_range(request: MissingEvents) -> tuple[int, int]:
    return request.from_seq_nr, request.to_seq_nr


def journal_order(e: Ev) -> tuple[int, int, str]:
    """The slice query's order: (db_timestamp, seq_nr)."""
    return (e.ts, e.seq_nr, e.pid)


class JournalModel:
    """The events, plus `delete_events_to` (deleted events are never delivered or fetched)."""

    def __init__(self, events: Iterable[Ev]) -> None:
        self.events = sorted(events, key=journal_order)
        self.by_pid: dict[str, list[Ev]] = {}
        for e in sorted(self.events, key=lambda e: (e.pid, e.seq_nr)):
            self.by_pid.setdefault(e.pid, []).append(e)
        for pid, evs in self.by_pid.items():
            assert [e.seq_nr for e in evs] == list(range(1, len(evs) + 1)), pid
        self.deleted_to: dict[str, int] = {}

    def delete_to(self, pid: str, seq_nr: int) -> None:
        self.deleted_to[pid] = max(self.deleted_to.get(pid, 0), seq_nr)

    def is_deleted(self, e: Ev) -> bool:
        return e.seq_nr <= self.deleted_to.get(e.pid, 0)

    def timestamp_of(self, pid: str, seq_nr: int) -> datetime | None:
        """`Journal.timestamp_of`: None for a deleted (or missing) event."""
        evs = self.by_pid.get(pid, [])
        if not 1 <= seq_nr <= len(evs) or self.is_deleted(evs[seq_nr - 1]):
            return None
        return evs[seq_nr - 1].timestamp

    def evidence(self, pid: str, from_seq_nr: int) -> int:
        """The deletion marker's seq_nr if at or above `from_seq_nr`, else 0."""
        marker = self.deleted_to.get(pid, 0)
        return marker if marker >= from_seq_nr else 0

    def fetch(self, pid: str, lo: int, hi: int) -> list[Ev]:
        """`current_events_by_persistence_id(pid, lo, hi)`: stored events, deleted skipped."""
        return [e for e in self.by_pid.get(pid, [])[lo - 1 : hi] if not self.is_deleted(e)]


class Driver:
    """Feeds envelopes through the real projection core (`projections.core.ProjectionCore`,
    grouped, with an injected clock that never makes a batch due), executing its requests
    against the journal model as the runners do against the journal.

    Accepted envelopes wait in the core's pending batch; `flush` commits the
    batch (the handler's writes and the offset rows together, as exactly-once
    does) and `crash` loses it (`failed()`).
    """

    def __init__(self, state: OffsetState, model: JournalModel) -> None:
        self.model = model
        self.core = ProjectionCore(
            Mode.GROUPED, MODEL_SETTINGS, range(NUMBER_OF_SLICES), state=state
        )
        self.stats = self.core.stats
        self.committed: list[tuple[str, int]] = []
        self.accepted_order: list[tuple[str, int]] = []
        self.dropped_after_gap: list[tuple[str, int]] = []
        self.progress: int | None = None

    @property
    def state(self) -> OffsetState:
        return self.core.state

    def deliver(self, e: Ev) -> None:
        if self.model.is_deleted(e):
            return  # slice queries skip deleted rows
        self._validate_and_process(e)
        self.progress = e.ts if self.progress is None else max(self.progress, e.ts)

    def _validate_and_process(self, e: Ev) -> None:
        asked_for_missing = False
        before = len(self.core.pending)
        action = self.core.offer(e.envelope(), NOW)
        while action is not None:
            pid = action.persistence_id if hasattr(action, "persistence_id") else ""
            if isinstance(action, PreviousTimestamp):
                reply: Any = Previous(
                    self.model.timestamp_of(pid, action.seq_nr),
                    self.model.evidence(pid, action.seq_nr),
                )
            elif isinstance(action, MissingEvents):
                asked_for_missing = True
                assert 1 <= action.from_seq_nr <= action.to_seq_nr < e.seq_nr
                fetched = self.model.fetch(pid, *request_range(action))
                reply = GapFill(
                    [m.envelope() for m in fetched], self.model.evidence(pid, action.from_seq_nr)
                )
            else:
                raise AssertionError(f"payloads are loaded and batches never due here: {action}")
            action = self.core.answer(reply, NOW)
        accepted = self.core.pending[before:]
        keys = [(a.persistence_id, a.seq_nr) for a in accepted]
        if asked_for_missing and e.key not in keys:
            self.dropped_after_gap.append(e.key)
        self.accepted_order.extend(keys)

    def flush(self, markers: Sequence[Record] = ()) -> list[Record]:
        """Commit the pending batch (plus markers); returns the rows the store gets."""
        commit = self.core.flush(NOW)
        records = [*markers]
        if commit is not None:
            assert isinstance(commit, Commit) and not commit.markers  # no stream progress here
            records = [*commit.records, *markers]
            assert self.core.committed(NOW) is None
            self.committed.extend((r.persistence_id, r.seq_nr) for r in commit.events)
        self.state.saved(markers)  # the model's markers, in the same transaction
        return records

    def crash(self) -> None:
        self.core.failed()

    def markers(self, slices: Iterable[int], lag: int = 0) -> list[Record]:
        """Progress markers as the runner writes them: for slices whose latest row lags
        the progress by more than `lag` seconds (or that have none)."""
        if self.progress is None:
            return []
        behind = at(self.progress - lag)
        out = []
        for s in slices:
            latest = self.state.latest_of_slice(s)
            if latest is None or latest.timestamp < behind:
                out.append(progress_marker(s, self.progress))
        return out


class Store:
    """The offset table, with the semantics of `OffsetDao.save` and `OffsetDao.cleanup`:
    a slice's new progress marker replaces its old one; cleanup deletes the rows older
    than the slice's latest row minus the window."""

    def __init__(self) -> None:
        self.by_slice: dict[int, set[Record]] = {}

    def save(self, records: Sequence[Record]) -> None:
        for r in records:
            rows = self.by_slice.setdefault(r.slice, set())
            if r.is_progress:
                rows.difference_update([x for x in rows if x.is_progress])
            rows.add(r)

    def cleanup(self, slices: SliceRange, window: timedelta) -> None:
        for s in slices:
            rows = self.by_slice.get(s)
            if rows:
                keep_from = max(r.timestamp for r in rows) - window
                self.by_slice[s] = {r for r in rows if r.timestamp >= keep_from}

    def load(self, slices: SliceRange) -> list[Record]:
        return [r for s in slices for r in self.by_slice.get(s, ())]

    @property
    def rows(self) -> set[Record]:
        return {r for rows in self.by_slice.values() for r in rows}


def label(text: str) -> None:
    """Count a kind of case in hypothesis' statistics (a no-op outside `given`)."""
    if currently_in_test_context():
        event(text)


def assert_per_pid_ascending(keys: Iterable[tuple[str, int]]) -> None:
    last: dict[str, int] = {}
    for pid, seq_nr in keys:
        assert seq_nr > last.get(pid, 0), f"{pid} seq_nr {seq_nr} after {last.get(pid)}"
        last[pid] = seq_nr


FEW_SLICES = st.integers(0, 3)


@st.composite
def journals(
    draw: st.DrawFn,
    *,
    slices: st.SearchStrategy[int] = FEW_SLICES,
    max_pids: int = 6,
    max_writes: int = 6,
    max_step: int = 6,
) -> list[Ev]:
    """Several pids; atomic writes of 1-3 events share a timestamp; per pid the
    timestamps of successive writes strictly increase; pids share slices and times."""
    events: list[Ev] = []
    for i in range(draw(st.integers(1, max_pids))):
        pid = f"T|p{i}"
        slice_ = draw(slices)
        ts = draw(st.integers(0, 10))
        seq_nr = 0
        for _ in range(draw(st.integers(1, max_writes))):
            for _ in range(draw(st.integers(1, 3))):
                seq_nr += 1
                events.append(Ev(pid, seq_nr, slice_, ts))
            ts += draw(st.integers(1, max_step))
    return events


# -- known pids: duplicate, accepted, gap ----------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    stored=st.integers(1, 20),
    inflight=st.none() | st.integers(0, 5),
    probe=st.integers(1, 40),
    seconds=st.integers(-1000, 1000),
)
def test_known_pid_duplicate_accepted_or_exact_gap(
    stored: int, inflight: int | None, probe: int, seconds: int
) -> None:
    state = OffsetState(WINDOW, [rec(7, "T|a", stored, 500), rec(7, "T|b", 1, 900)])
    handled = stored
    if inflight is not None:
        state.accept("T|a", stored + inflight)
        handled = stored + inflight
    assert state.seq_nr_of("T|a") == handled
    # At or after the handled record (an in-flight one accepted without its
    # timestamp is no older than the stored one), only the seq_nr against the
    # handled one decides, however far the window has moved. Before it, the
    # envelope is from the pid's past (its lifetime's earlier events, or an
    # earlier lifetime's): a duplicate whatever its seq_nr.
    v = state.validate("T|a", probe, 7, at(seconds))
    if seconds < 500 or probe <= handled:
        assert v.verdict is DUPLICATE
    elif probe == handled + 1:
        assert v.verdict is ACCEPTED
    else:
        assert v.verdict is GAP
        assert (v.missing_from, v.missing_to) == (handled + 1, probe - 1)


def test_inflight_is_handled_until_saved_or_discarded() -> None:
    state = OffsetState(WINDOW)
    assert state.validate("T|a", 1, 3, at(0)).verdict is ACCEPTED
    state.accept("T|a", 1)
    state.accept("T|a", 2)
    state.accept("T|a", 1)  # a lower one never lowers what is in flight
    assert state.seq_nr_of("T|a") == 2
    assert state.validate("T|a", 1, 3, at(0)).verdict is DUPLICATE
    assert state.validate("T|a", 2, 3, at(1)).verdict is DUPLICATE
    assert state.validate("T|a", 3, 3, at(2)).verdict is ACCEPTED
    # Saving only part of the batch keeps the rest in flight.
    state.saved([rec(3, "T|a", 1, 0)])
    assert state.seq_nr_of("T|a") == 2
    assert state.validate("T|a", 2, 3, at(1)).verdict is DUPLICATE
    state.saved([rec(3, "T|a", 2, 1)])
    assert state.seq_nr_of("T|a") == 2
    assert len(state) == 1
    # A rolled-back batch is forgotten: its envelopes are accepted again.
    state.accept("T|a", 3)
    state.accept("T|b", 1)
    state.discard_inflight()
    assert state.seq_nr_of("T|a") == 2
    assert state.seq_nr_of("T|b") is None
    assert state.validate("T|a", 3, 3, at(2)).verdict is ACCEPTED
    assert state.validate("T|b", 1, 3, at(2)).verdict is ACCEPTED


def test_loaded_records_keep_the_highest_seq_nr_per_pid_in_any_order() -> None:
    records = [rec(1, "T|a", 3, 30), rec(1, "T|a", 5, 50), rec(1, "T|a", 4, 40)]
    for order in (records, records[::-1]):
        state = OffsetState(WINDOW, order)
        assert state.seq_nr_of("T|a") == 5
        assert state.latest_of_slice(1) == rec(1, "T|a", 5, 50)
        assert state.slices == frozenset({1})


def test_known_pid_whose_missing_events_were_deleted_is_accepted() -> None:
    # Handled up to 3; events 4..5 were deleted (delete_events_to(pid, 5)) before
    # the projection read them, so the query delivers 6 next. The runner asks
    # for 4..5, gets nothing, and validates again with previous_timestamp=None
    # ("deleted or gone"). A GAP here would drop 6 and every later event of the pid.
    # The journal's deletion marker at 5 is the evidence.
    state = OffsetState(WINDOW, [rec(2, "T|a", 3, 10)])
    assert state.validate("T|a", 6, 2, at(20)).verdict is GAP
    assert state.validate("T|a", 6, 2, at(20), deleted_to=5).verdict is ACCEPTED
    assert state.validate("T|a", 6, 2, at(20), deleted_to=9).verdict is ACCEPTED
    # Nothing found and no marker (or one below the gap's end): still a gap, never a guess.
    for evidence in (None, 0, 4):
        v = state.validate("T|a", 6, 2, at(20), deleted_to=evidence)
        assert (v.verdict, v.missing_from, v.missing_to) == (GAP, 4, 5)


# -- unknown pids ----------------------------------------------------------------------------------


def test_unknown_pid_first_event_is_accepted() -> None:
    assert OffsetState(WINDOW).validate("T|a", 1, 0, at(0)).verdict is ACCEPTED
    state = OffsetState(WINDOW, [rec(0, "T|b", 4, 100)])
    assert state.validate("T|a", 1, 0, at(50)).verdict is ACCEPTED
    assert state.validate("T|a", 1, 0, at(40)).verdict is ACCEPTED  # exactly the window start


def test_unknown_pid_later_event_depends_on_the_previous_timestamp() -> None:
    state = OffsetState(WINDOW, [rec(5, "T|b", 1, 100)])  # window of slice 5 starts at 40
    assert state.validate("T|a", 4, 5, at(90)).verdict is NEEDS_PREVIOUS
    # previous deleted (the journal's marker at or above it)
    assert state.validate("T|a", 4, 5, at(90), None, deleted_to=3).verdict is ACCEPTED
    # previous neither stored nor deleted: not visible yet, rejected
    v = state.validate("T|a", 4, 5, at(90), None, deleted_to=0)
    assert (v.verdict, v.missing_from, v.missing_to) == (Verdict.REJECTED, 1, 3)
    # previous older than the window: its record was cleaned up, so it was handled
    assert state.validate("T|a", 4, 5, at(90), at(39)).verdict is ACCEPTED
    # previous inside the window but not in the store: not handled yet
    for previous in (40, 80, 89):
        v = state.validate("T|a", 4, 5, at(90), at(previous))
        assert (v.verdict, v.missing_from, v.missing_to) == (GAP, 1, 3)


def test_unknown_pid_in_a_slice_without_rows_gaps_from_one() -> None:
    state = OffsetState(WINDOW, [rec(5, "T|b", 1, 100)])
    v = state.validate("T|a", 2, 6, at(90), at(-10_000))  # slice 6 has no rows: no window
    assert (v.verdict, v.missing_from, v.missing_to) == (GAP, 1, 1)
    assert state.validate("T|a", 2, 6, at(90), None, deleted_to=1).verdict is ACCEPTED
    assert state.validate("T|a", 2, 6, at(90), None).verdict is Verdict.REJECTED


# -- the time window and eviction ------------------------------------------------------------------


def test_unknown_pid_older_than_its_slices_window_is_a_duplicate() -> None:
    state = OffsetState(WINDOW, [rec(1, "T|b", 3, 100), rec(2, "T|c", 1, 10)])
    assert state.validate("T|a", 1, 1, at(39)).verdict is DUPLICATE
    assert state.validate("T|a", 7, 1, at(39)).verdict is DUPLICATE
    assert state.validate("T|a", 1, 1, at(40)).verdict is ACCEPTED
    # The window is per slice: slice 2's latest is 10, so 39 is recent there.
    assert state.validate("T|a", 1, 2, at(39)).verdict is ACCEPTED
    # Progress markers move a slice's window too.
    state.saved([progress_marker(2, 200)])
    assert state.validate("T|a", 1, 2, at(139)).verdict is DUPLICATE
    assert state.validate("T|a", 1, 2, at(140)).verdict is ACCEPTED


def test_evict_forgets_old_pids_but_keeps_their_effect() -> None:
    state = OffsetState(
        WINDOW,
        [
            rec(1, "T|old", 4, 10),
            rec(1, "T|edge", 2, 40),
            rec(1, "T|new", 9, 100),
            rec(2, "T|other-slice", 1, 10),  # slice 2's own latest: never evicted
        ],
    )
    assert state.evict() == 1
    assert state.seq_nr_of("T|old") is None
    assert state.seq_nr_of("T|edge") == 2  # exactly at the window start: kept (as cleanup does)
    assert state.seq_nr_of("T|new") == 9
    assert state.seq_nr_of("T|other-slice") == 1
    assert len(state) == 3
    # Old re-deliveries of the evicted pid are still duplicates ...
    for seq_nr, seconds in ((1, 2), (4, 10)):
        assert state.validate("T|old", seq_nr, 1, at(seconds)).verdict is DUPLICATE
    # ... and its next event is accepted through the previous-timestamp rule.
    assert state.validate("T|old", 5, 1, at(101)).verdict is NEEDS_PREVIOUS
    assert state.validate("T|old", 5, 1, at(101), at(10)).verdict is ACCEPTED
    assert state.evict() == 0
    # Records saved by the running instance are evicted the same way.
    state.accept("T|live", 1)
    state.saved([rec(1, "T|live", 1, 50)])
    state.saved([rec(1, "T|new", 10, 120)])  # the window of slice 1 now starts at 60
    assert state.evict() == 2
    assert state.seq_nr_of("T|live") is None and state.seq_nr_of("T|edge") is None
    assert state.seq_nr_of("T|new") == 10
    assert len(state) == 2


def test_evict_never_drops_a_slices_latest_row() -> None:
    state = OffsetState(timedelta(microseconds=1), [rec(s, f"T|{s}", 1, s) for s in range(5)])
    assert state.evict() == 0
    assert all(state.seq_nr_of(f"T|{s}") == 1 for s in range(5))


@settings(max_examples=200, deadline=None)
@given(
    histories=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 100), st.integers(1, 4), st.integers(1, 20)),
        min_size=1,
        max_size=8,
    ),
    markers=st.dictionaries(st.integers(0, 2), st.integers(0, 150), max_size=3),
    window=st.integers(1, 60),
)
def test_evict_matches_cleanup_and_keeps_decisions(
    histories: list[tuple[int, int, int, int]],
    markers: dict[int, int],
    window: int,
) -> None:
    # Pid i lives in one slice and has `count` events `step` seconds apart from `first`.
    rows = [
        rec(slice_, f"T|{i}", seq_nr, first + (seq_nr - 1) * step)
        for i, (slice_, first, count, step) in enumerate(histories)
        for seq_nr in range(1, count + 1)
    ]
    rows += [progress_marker(s, seconds) for s, seconds in markers.items()]
    w = timedelta(seconds=window)
    state = OffsetState(w, rows)
    before = {p: state.seq_nr_of(p) for p in {r.persistence_id for r in rows if not r.is_marker}}
    latest = {s: state.latest_of_slice(s) for s in range(3)}
    newest: dict[str, Record] = {}
    for r in rows:
        if not r.is_marker and (
            r.persistence_id not in newest or r.seq_nr > newest[r.persistence_id].seq_nr
        ):
            newest[r.persistence_id] = r
    dropped = state.evict()
    # What the store keeps after cleanup is what the state still knows.
    store = Store()
    store.save(rows)
    store.cleanup(SliceRange(0, 1023), w)
    kept_pids = {r.persistence_id for r in store.rows if not r.is_marker}
    assert {s: state.latest_of_slice(s) for s in range(3)} == latest
    assert dropped == len(before) - len(kept_pids)
    for pid, r in newest.items():
        slice_latest = latest[r.slice]
        assert slice_latest is not None
        window_start = slice_latest.timestamp - w
        if r.timestamp < window_start:
            assert state.seq_nr_of(pid) is None and pid not in kept_pids
            # Re-delivered: still a duplicate. Next event: accepted via its previous.
            assert state.validate(pid, r.seq_nr, r.slice, r.timestamp).verdict is DUPLICATE
            nxt = slice_latest.timestamp + timedelta(seconds=1)
            assert state.validate(pid, r.seq_nr + 1, r.slice, nxt).verdict is NEEDS_PREVIOUS
            assert state.validate(pid, r.seq_nr + 1, r.slice, nxt, r.timestamp).accepted
        else:
            assert state.seq_nr_of(pid) == before[pid] == r.seq_nr and pid in kept_pids
            assert state.validate(pid, r.seq_nr, r.slice, r.timestamp).verdict is DUPLICATE
            nxt = r.timestamp + timedelta(seconds=1)
            assert state.validate(pid, r.seq_nr + 1, r.slice, nxt).verdict is ACCEPTED


# -- start_offset and start markers ----------------------------------------------------------------


def test_start_offset_is_the_earliest_latest_row_with_the_pids_seen_there() -> None:
    state = OffsetState(
        WINDOW,
        [
            rec(0, "T|a", 1, 10),
            rec(0, "T|a", 2, 20),  # slice 0's latest: 20
            rec(1, "T|b", 5, 20),  # slice 1's latest: 20 too
            rec(1, "T|c", 3, 15),
            rec(2, "T|d", 1, 20),
            rec(2, "T|d", 2, 30),  # slice 2's latest: 30; T|d's newest is at 30, not 20
            rec(9, "T|e", 1, 20),  # outside the asked slices
        ],
    )
    start = state.start_offset([0, 1, 2])
    assert start is not None
    assert start.timestamp == at(20)
    assert dict(start.seen) == {"T|a": 2, "T|b": 5}
    only_2 = state.start_offset(SliceRange(2, 2))
    assert only_2 is not None and only_2.timestamp == at(30) and dict(only_2.seen) == {"T|d": 2}


def test_start_offset_is_none_if_any_slice_has_no_row() -> None:
    state = OffsetState(WINDOW, [rec(0, "T|a", 1, 10), rec(2, "T|b", 1, 20)])
    assert state.start_offset([0, 1, 2]) is None
    assert state.start_offset(SliceRange(0, 1023)) is None
    assert state.start_offset([]) is None
    assert OffsetState(WINDOW).start_offset([0]) is None
    assert state.start_offset([0, 2]) == TimestampOffset(at(10), at(10), {"T|a": 1})


def test_progress_markers_count_as_rows_but_not_as_seen_pids() -> None:
    state = OffsetState(WINDOW, [rec(0, "T|a", 1, 10)])
    assert state.start_offset([0, 1]) is None
    state.saved([progress_marker(1, 5)])
    start = state.start_offset([0, 1])
    assert start is not None and start.timestamp == at(5) and dict(start.seen) == {}
    # A newer marker for the same slice moves it on.
    state.saved([progress_marker(1, 50)])
    start = state.start_offset([0, 1])
    assert start is not None and start.timestamp == at(10) and dict(start.seen) == {"T|a": 1}
    assert state.seq_nr_of(PROGRESS_PID) is None
    assert len(state) == 1


def test_start_markers_skip_everything_before_them() -> None:
    state = OffsetState(WINDOW, [start_marker(s, 100) for s in range(4)])
    start = state.start_offset(range(4))
    assert start is not None and start.timestamp == at(100) and dict(start.seen) == {}
    # Before the marker: a duplicate whatever the pid's seq_nr.
    assert state.validate("T|a", 1, 2, at(99)).verdict is DUPLICATE
    assert state.validate("T|a", 5, 2, at(99), None).verdict is DUPLICATE
    # At or after it: the usual rules.
    assert state.validate("T|a", 1, 2, at(100)).verdict is ACCEPTED
    v = state.validate("T|b", 2, 2, at(101), at(99))
    assert (v.verdict, v.missing_from, v.missing_to) == (GAP, 1, 1)
    state.accept("T|b", 2)  # the runner's gap fill found 1 a duplicate, then accepted 2
    state.saved([rec(2, "T|b", 2, 101)])
    assert state.validate("T|b", 1, 2, at(99)).verdict is DUPLICATE
    assert state.validate("T|b", 3, 2, at(102)).verdict is ACCEPTED
    # Only the slices that have the marker.
    assert OffsetState(WINDOW, [start_marker(1, 100)]).validate("T|a", 1, 2, at(5)).accepted


def test_the_newest_start_marker_of_a_slice_wins() -> None:
    for markers in ([start_marker(0, 200), start_marker(0, 100)], [start_marker(0, 100)]):
        state = OffsetState(WINDOW, markers)
        state.saved([start_marker(0, 200)] if len(markers) == 1 else [])
        assert state.validate("T|a", 1, 0, at(150)).verdict is DUPLICATE
        assert state.validate("T|a", 1, 0, at(200)).verdict is ACCEPTED


# -- model-based: any delivery order ---------------------------------------------------------------


@attrs.frozen
class Delete:
    """`delete_events_to(pid, seq_nr)` happens at this point of the delivery script."""

    pid: str
    seq_nr: int


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[Ev], list[Ev | Delete]]:
    """A journal and a delivery script: every event at least once, in any order, with
    duplicates, and meanwhile a few deletions of a pid's events up to some seq_nr."""
    events = draw(journals())
    extra = draw(st.lists(st.sampled_from(events), max_size=len(events)))
    script: list[Ev | Delete] = list(draw(st.permutations([*events, *extra])))
    pids = sorted({e.pid for e in events})
    for _ in range(draw(st.integers(0, 2))):
        pid = draw(st.sampled_from(pids))
        upto = draw(st.integers(1, max(e.seq_nr for e in events if e.pid == pid)))
        script.insert(draw(st.integers(0, len(script))), Delete(pid, upto))
    return events, script


@settings(max_examples=200, deadline=None)
@given(deliveries(), st.integers(0, 2**32))
def test_any_delivery_order_applies_every_event_once_in_seq_order(
    case: tuple[list[Ev], list[Ev | Delete]], seed: int
) -> None:
    rng = random.Random(seed)
    events, script = case
    model = JournalModel(events)
    # A window longer than the whole history: only seq_nrs decide here.
    driver = Driver(OffsetState(timedelta(days=1)), model)
    for step in script:
        if isinstance(step, Delete):
            model.delete_to(step.pid, step.seq_nr)
        else:
            driver.deliver(step)
        if rng.random() < 0.3:
            driver.flush()
    driver.flush()
    counts = Counter(driver.committed)
    assert all(n == 1 for n in counts.values()), counts
    assert driver.committed == driver.accepted_order
    assert_per_pid_ascending(driver.committed)
    # Every event that was not deleted is applied; deleted ones may have been applied.
    must = {e.key for e in events if not model.is_deleted(e)}
    assert must <= set(counts)
    assert driver.dropped_after_gap == []


@st.composite
def late_deliveries(draw: st.DrawFn) -> tuple[list[Ev], list[Ev], int]:
    """Events become visible up to `lateness` seconds after their timestamp (late
    commits); duplicates come at any later time (backtracking, restarts)."""
    events = draw(journals(max_step=12))
    lateness = draw(st.integers(1, 15))
    timed: list[tuple[int, int, Ev]] = []
    for e in events:
        visible = e.ts + draw(st.integers(0, lateness))
        timed.append((visible, draw(st.integers(0, 1000)), e))
        for _ in range(draw(st.integers(0, 2))):
            timed.append((visible + draw(st.integers(0, 200)), draw(st.integers(0, 1000)), e))
    timed.sort(key=lambda t: (t[0], t[1]))
    return events, [e for _, _, e in timed], lateness


@settings(max_examples=200, deadline=None)
@given(late_deliveries(), st.integers(0, 2**32))
def test_late_commits_within_the_window_with_eviction_and_progress_markers(
    case: tuple[list[Ev], list[Ev], int], seed: int
) -> None:
    rng = random.Random(seed)
    events, order, lateness = case
    # The window just covers the lateness: nothing may be taken for a duplicate.
    state = OffsetState(timedelta(seconds=lateness), [])
    driver = Driver(state, JournalModel(events))
    evicted = 0
    for e in order:
        driver.deliver(e)
        if rng.random() < 0.3:
            markers = driver.markers(range(4)) if rng.random() < 0.5 else []
            driver.flush(markers)
        if rng.random() < 0.2:
            evicted += state.evict()
    driver.flush()
    label("pids were evicted" if evicted else "nothing was evicted")
    counts = Counter(driver.committed)
    assert set(counts) == {e.key for e in events}
    assert all(n == 1 for n in counts.values()), counts
    assert_per_pid_ascending(driver.committed)


# -- rescaling: n ranges -> m ranges, through the stored rows --------------------------------------

EDGE_SLICES = [0, 1, 127, 128, 255, 256, 383, 384, 511, 512, 640, 767, 768, 895, 896, 1023]


@attrs.frozen
class Rescale:
    """How the old instances ran before the rescale."""

    n: int  # old number of ranges
    m: int  # new number of ranges
    progress: Sequence[float]  # per old range: the fraction of its events handled
    crashes: Sequence[bool]  # per old range: crashed (lost its last batch) or stopped
    with_markers: bool  # the runner wrote progress markers
    window: int  # the offset store's time window, seconds
    lag: int  # markers only for slices lagging progress by more than this
    backtracking: int  # how far before its start offset a new range re-reads


def rescale_and_count(events: list[Ev], plan: Rescale, rng: random.Random) -> list[tuple[str, int]]:
    """Run the old ranges, clean up, start the new ranges from the stored rows; return
    every (pid, seq_nr) committed by either phase, in commit order."""
    model = JournalModel(events)
    end = max(e.ts for e in events)
    w = timedelta(seconds=plan.window)
    store = Store()
    applied: list[tuple[str, int]] = []

    def flush(driver: Driver, r: SliceRange) -> None:
        with_markers = plan.with_markers and rng.random() < 0.15
        store.save(driver.flush(driver.markers(r, plan.lag) if with_markers else []))

    # Old phase: each of n ranges handles a prefix of its events in query order;
    # some ranges lag, some stop cleanly, some crash and lose their last batch.
    for r, fraction, crash in zip(slice_ranges(plan.n), plan.progress, plan.crashes, strict=False):
        evs = [e for e in model.events if e.slice in r]
        done = math.ceil(fraction * len(evs))
        driver = Driver(OffsetState(w, store.load(r)), model)
        for i, e in enumerate(evs[:done]):
            driver.deliver(e)
            if i and rng.random() < 0.2:  # a backtracking re-delivery
                driver.deliver(evs[rng.randrange(i)])
            if rng.random() < 0.3:
                flush(driver, r)
            if rng.random() < 0.1:
                store.cleanup(r, w)
                driver.state.evict()
        if crash:
            driver.crash()
        else:
            # A clean stop; idle heartbeats may have moved progress up to the next
            # unhandled event (markers claim only what is strictly before them).
            driver.progress = evs[done].ts if done < len(evs) else end + rng.randint(0, 20)
            markers = driver.markers(r, plan.lag) if plan.with_markers else []
            store.save(driver.flush(markers))
            store.cleanup(r, w)
        applied.extend(driver.committed)

    # New phase: m ranges, each from the stored rows of its slices, resumes at
    # start_offset and re-reads a backtracking window before it.
    for r in slice_ranges(plan.m):
        state = OffsetState(w, store.load(r))
        start = state.start_offset(r)
        evs = [e for e in model.events if e.slice in r]
        latest = [state.latest_of_slice(s) for s in r]
        if start is None:
            label("a new range starts from the beginning")
            todo = list(evs)
        else:
            if any(x is not None and x.timestamp - w > start.timestamp for x in latest):
                label("a new range starts more than a window behind one of its slices")
            else:
                label("a new range starts at an offset")
            begin = start.timestamp
            todo = [
                e
                for e in evs
                if e.timestamp > begin
                or (e.timestamp == begin and e.seq_nr > start.seen.get(e.pid, 0))
            ]
            back = [
                e
                for e in evs
                if begin - timedelta(seconds=plan.backtracking) <= e.timestamp <= begin
            ]
            for e in back:
                todo.insert(rng.randint(0, len(todo)), e)
        driver = Driver(state, model)
        for e in todo:
            driver.deliver(e)
            if rng.random() < 0.3:
                flush(driver, r)
            if rng.random() < 0.1:
                store.cleanup(r, w)
                state.evict()
        store.save(driver.flush())
        applied.extend(driver.committed)
    return applied


def assert_exactly_once(events: list[Ev], applied: list[tuple[str, int]]) -> None:
    counts = Counter(applied)
    assert set(counts) == {e.key for e in events}, "an event was never applied"
    twice = {k: c for k, c in counts.items() if c > 1}
    assert not twice, f"applied more than once: {twice}"
    assert_per_pid_ascending(applied)


rescales = st.builds(
    Rescale,
    n=st.sampled_from([1, 2, 4, 8]),
    m=st.sampled_from([1, 2, 4, 8]),
    progress=st.lists(st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.8, 1.0]), min_size=8, max_size=8),
    crashes=st.lists(st.sampled_from([False] * 5 + [True]), min_size=8, max_size=8),
    with_markers=st.sampled_from([True] * 5 + [False]),
    window=st.sampled_from([1, 2, 5, 15, 1000]),
    lag=st.sampled_from([0, 3, 10]),
    backtracking=st.sampled_from([0, 3, 20]),
)


@settings(max_examples=120, deadline=None)
@given(
    events=journals(
        slices=st.sampled_from(EDGE_SLICES) | st.integers(0, NUMBER_OF_SLICES - 1),
        max_pids=10,
        max_writes=5,
    ),
    plan=rescales,
    seed=st.integers(0, 2**32),
)
def test_rescaling_applies_every_event_exactly_once(
    events: list[Ev], plan: Rescale, seed: int
) -> None:
    assert_exactly_once(events, rescale_and_count(events, plan, random.Random(seed)))


def test_merging_a_range_far_ahead_with_one_far_behind() -> None:
    # Old: 2 ranges; 0-511 handled everything, 512-1023 only its first events.
    # New: 1 range that starts at the lagging slices' offset, more than a window
    # behind the slices of the first range, whose old rows were cleaned up.
    events = [
        Ev(f"T|{name}", seq_nr, slice_, first + 4 * seq_nr)
        for name, slice_, first in (("a", 3, 0), ("b", 3, 1), ("c", 300, 2), ("z", 700, 0))
        for seq_nr in range(1, 11)
    ]
    for seed in range(10):
        for m in (1, 2, 4):
            plan = Rescale(
                n=2,
                m=m,
                progress=[1.0, 0.2],
                crashes=[False, False],
                with_markers=True,
                window=5,
                lag=0,
                backtracking=3,
            )
            assert_exactly_once(events, rescale_and_count(events, plan, random.Random(seed)))

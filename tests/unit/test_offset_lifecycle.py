"""The offset store's rules of issue 23, without a database: deleted versus not visible
yet, held envelopes and their retry, ids reset after deletion, the table lookup of an
unknown pid, heartbeats and progress markers around a held envelope, settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import EventEnvelope, InvalidSettings, TimestampOffset
from projections.core import (
    Commit,
    GapFill,
    MissingEvents,
    Mode,
    Previous,
    PreviousTimestamp,
    ProjectionCore,
    SaveOffsets,
    StoredOffset,
)
from projections.offset_store import OffsetState, Record, Verdict
from projections.settings import ProjectionSettings

BASE = datetime(2025, 1, 1, tzinfo=UTC)
WINDOW = timedelta(minutes=5)


def at(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)


def env(pid: str, seq_nr: int, seconds: float, *, deleted: bool = False) -> EventEnvelope:
    offset = TimestampOffset(at(seconds))
    event = None if deleted else "e"
    return EventEnvelope(pid, "T", 7, seq_nr, at(seconds), event, offset=offset, deleted=deleted)


def heartbeat(seconds: float) -> EventEnvelope:
    return EventEnvelope(
        "", "T", 0, 0, at(seconds), None, offset=TimestampOffset(at(seconds)), source="heartbeat"
    )


def core(records: list[Record] | None = None, **changes: object) -> ProjectionCore:
    c = ProjectionCore(Mode.GROUPED, ProjectionSettings(**{**SETTINGS_KW, **changes}), [7])
    c.start(records or [])
    return c


SETTINGS_KW: dict[str, object] = {
    "group_after_envelopes": 1000,
    "group_after_duration": 60.0,
    "rejected_retry_interval": 2.0,
    "progress_interval": 1.0,
}


# -- deleted versus not visible yet --------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    handled=st.integers(1, 10),
    gap=st.integers(1, 6),
    found=st.integers(0, 6),
    marker=st.integers(0, 20),
)
def test_a_gap_is_accepted_only_when_every_missing_seq_nr_was_found_or_deleted(
    handled: int, gap: int, found: int, marker: int
) -> None:
    # Handled up to `handled`; `handled + gap + 1` arrives. The fill finds the last
    # `found` of the missing ones (the lower ones are gone); the journal's deletion
    # marker is at `marker`. The envelope is applied iff nothing missing is unexplained.
    found = min(found, gap)
    missing = list(range(handled + 1, handled + gap + 1))
    fetched = missing[gap - found :]
    gone = missing[: gap - found]
    evidence = marker if marker >= handled + 1 else 0
    c = core([Record(7, "a", handled, at(10))])
    target = env("a", handled + gap + 1, 100)
    assert c.offer(target, 0.0) == MissingEvents("a", handled + 1, handled + gap)
    c.answer(GapFill([env("a", n, 50 + n) for n in fetched], evidence), 0.0)
    explained = all(n <= evidence for n in gone)
    pending = [e.seq_nr for e in c.pending]
    if explained:
        assert pending == [*fetched, target.seq_nr]
        assert c.held == ()
    else:
        assert target.seq_nr not in pending
        assert [e.seq_nr for e in c.held] == [target.seq_nr]
        assert c.stats.rejected == 1


def test_a_held_envelope_is_retried_and_applied_in_order_once_its_predecessor_arrives() -> None:
    c = core([Record(7, "a", 1, at(10))])
    assert c.offer(env("a", 3, 30), 0.0) == MissingEvents("a", 2, 2)
    assert c.answer(GapFill([], 0), 0.0) is None  # 2 not visible, not deleted: held
    assert [e.seq_nr for e in c.held] == [3] and c.pending == ()
    assert c.next_deadline() == 2.0  # the retry
    # The predecessor comes (backtracking): accepted, and the held one is due at once.
    assert c.offer(env("a", 2, 20), 1.0) is None
    assert c.next_deadline() == 1.0
    assert c.poll(1.0) is None  # retried: 3 follows 2 now, no request needed
    assert [e.seq_nr for e in c.pending] == [2, 3] and c.held == ()
    commit = c.flush(1.0)
    assert isinstance(commit, Commit) and [r.seq_nr for r in commit.events] == [2, 3]


def test_a_held_envelope_is_retried_on_time_and_accepted_once_deleted() -> None:
    c = core([Record(7, "a", 1, at(10))])
    c.offer(env("a", 4, 40), 0.0)
    c.answer(GapFill([], 0), 0.0)
    assert c.poll(1.0) is None and c.held  # not due yet
    assert c.poll(2.0) == MissingEvents("a", 2, 3)  # the retry asks again
    assert c.answer(GapFill([], 2), 2.0) is None  # only 2 deleted: still held
    assert c.next_deadline() == 4.0
    assert c.poll(4.0) == MissingEvents("a", 2, 3)
    assert c.answer(GapFill([], 3), 4.0) is None  # deleted up to 3 now: applied
    assert [e.seq_nr for e in c.pending] == [4] and c.held == ()
    assert c.next_deadline() == 64.0  # nothing held: only the batch, due a minute after 4


def test_an_unknown_pid_whose_previous_is_neither_stored_nor_deleted_is_held() -> None:
    c = core([Record(7, "x", 1, at(100))])
    assert c.offer(env("b", 3, 103), 0.0) == PreviousTimestamp("b", 2)
    assert c.answer(Previous(None, 0), 0.0) is None
    assert [e.seq_nr for e in c.held] == [3]
    assert c.poll(2.0) == PreviousTimestamp("b", 2)
    assert c.answer(Previous(None, 2), 2.0) is None  # deleted meanwhile
    assert [e.seq_nr for e in c.pending] == [3]


def test_progress_markers_and_heartbeats_never_claim_a_held_envelope() -> None:
    # Heartbeats are progress, never validated (Akka #1413: no gap check for them);
    # but while an envelope is held, no marker may say its timestamp was handled.
    c = core([Record(7, "a", 1, at(10))])
    c.offer(env("a", 3, 30), 0.0)
    c.answer(GapFill([], 0), 0.0)
    action = c.offer(heartbeat(60), 5.0)
    assert isinstance(action, SaveOffsets)
    assert [r.timestamp for r in action.records] == [at(30)]
    c.committed(5.0)
    assert c.stats.heartbeats == 1 and c.stats.rejected == 1
    # Once it is applied, markers move on.
    c.offer(env("a", 2, 20), 6.0)
    c.poll(6.0)
    commit = c.flush(7.0)
    assert isinstance(commit, Commit) and [r.seq_nr for r in commit.events] == [2, 3]
    c.committed(7.0)
    action = c.offer(heartbeat(90), 9.0)
    assert isinstance(action, SaveOffsets) and action.records[0].timestamp == at(90)


# -- ids reset after deletion ----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    handled=st.integers(1, 20),
    later=st.integers(-5, 5),
    reset_after=st.none() | st.integers(0, 3),
)
def test_a_seq_nr_1_later_than_the_handled_event_starts_a_new_lifetime(
    handled: int, later: int, reset_after: int | None
) -> None:
    # Handled up to `handled` at t=100. A seq_nr 1 at 100 + later: a replay of the
    # original (never later) is a duplicate; a later one is a reset id's first event
    # when it is later by at least accept_sequence_number_reset_after.
    after = None if reset_after is None else timedelta(seconds=reset_after)
    state = OffsetState(WINDOW, [Record(7, "a", handled, at(100))], reset_after=after)
    v = state.validate("a", 1, 7, at(100 + later))
    new_lifetime = after is not None and later > 0 and timedelta(seconds=later) >= after
    # A new lifetime asks for the id's reset tombstone (seq_nr 0) first; with the
    # gap fill's answer (none here: evidence 0) it is accepted.
    assert (v.verdict, v.missing_from, v.missing_to) == (
        (Verdict.GAP, 0, 0) if new_lifetime else (Verdict.DUPLICATE, 0, 0)
    )
    if new_lifetime:
        assert state.validate("a", 1, 7, at(100 + later), deleted_to=0).accepted
        state.accept("a", 1, at(100 + later))
        assert state.seq_nr_of("a") == 1
        assert state.validate("a", 2, 7, at(101 + later)).accepted
        assert state.validate("a", 1, 7, at(100 + later)).verdict is Verdict.DUPLICATE
        state.saved([Record(7, "a", 1, at(100 + later))])
        assert state.seq_nr_of("a") == 1  # the new lifetime wins over the higher old seq_nr


def test_a_reset_tombstone_starts_the_new_lifetime_whatever_the_setting() -> None:
    c = core([Record(7, "a", 5, at(10))], accept_sequence_number_reset_after=None)
    assert c.offer(env("a", 0, 20, deleted=True), 0.0) is None
    assert c.offer(env("a", 1, 21), 0.0) is None
    assert c.offer(env("a", 1, 3), 0.0) is None  # the original seq_nr 1: a duplicate
    assert c.offer(env("a", 0, 20, deleted=True), 0.0) is None  # the same tombstone again
    commit = c.flush(0.0)
    assert isinstance(commit, Commit)
    assert [(e.seq_nr, e.deleted) for e in commit.envelopes] == [(0, True), (1, False)]
    c.committed(0.0)
    # Stored, and loaded by a restarted instance: the new lifetime is what it knows.
    rows = [Record(7, "a", 5, at(10)), *commit.events]
    assert OffsetState(WINDOW, rows).seq_nr_of("a") == 1


def test_a_tombstone_without_a_reset_follows_the_last_event() -> None:
    c = core([Record(7, "a", 5, at(10))])
    assert c.offer(env("a", 6, 20, deleted=True), 0.0) is None
    assert [e.deleted for e in c.pending] == [True]
    # Seen before its events were (say, after a lag): the tombstone is the evidence.
    d = core([Record(7, "a", 2, at(10))])
    assert d.offer(env("a", 6, 20, deleted=True), 0.0) == MissingEvents("a", 3, 5)
    assert d.answer(GapFill([], 6), 0.0) is None
    assert [e.seq_nr for e in d.pending] == [6]


# -- a tombstone the stream brings late -----------------------------------------------------------
# Backtracking, or a transaction the horizon did not wait for, can bring an erasure's
# tombstone after the id's next event. The next event's gap fill hands it over first, so
# the handler erases before the new lifetime, and the late copy is a duplicate.


def test_a_late_kept_tombstone_comes_through_the_next_events_gap_fill() -> None:
    c = core([Record(7, "a", 5, at(10))])
    assert c.offer(env("a", 7, 30), 0.0) == MissingEvents("a", 6, 6)
    assert c.answer(GapFill([env("a", 6, 20, deleted=True)], 6), 0.0) is None
    assert [(e.seq_nr, e.deleted) for e in c.pending] == [(6, True), (7, False)]
    assert c.offer(env("a", 6, 20, deleted=True), 0.0) is None  # the late copy
    assert len(c.pending) == 2


def test_a_late_reset_tombstone_comes_before_the_new_lifetime() -> None:
    c = core([Record(7, "a", 5, at(10))])
    assert c.offer(env("a", 1, 30), 0.0) == MissingEvents("a", 0, 0)
    assert c.answer(GapFill([env("a", 0, 20, deleted=True)], 0), 0.0) is None
    assert [(e.seq_nr, e.deleted) for e in c.pending] == [(0, True), (1, False)]
    assert c.offer(env("a", 0, 20, deleted=True), 0.0) is None  # the late copy
    assert c.offer(env("a", 2, 31), 0.0) is None
    assert [(e.seq_nr, e.deleted) for e in c.pending] == [(0, True), (1, False), (2, False)]


def test_a_reset_tombstone_moved_past_the_new_lifetime_erases_it() -> None:
    # A second reset moved the id's seq_nr 0 after the lifetime the stream is reading:
    # that lifetime was erased too, so none of it is applied.
    c = core([Record(7, "a", 5, at(10))])
    assert c.offer(env("a", 1, 30), 0.0) == MissingEvents("a", 0, 0)
    assert c.answer(GapFill([env("a", 0, 40, deleted=True)], 0), 0.0) is None
    assert c.offer(env("a", 2, 31), 0.0) is None
    assert c.offer(env("a", 1, 41), 0.0) is None  # the newest lifetime
    assert [(e.seq_nr, e.deleted) for e in c.pending] == [(0, True), (1, False)]
    assert c.pending[-1].db_timestamp == at(41)


def test_a_reset_with_no_tombstone_found_still_starts_the_new_lifetime() -> None:
    c = core([Record(7, "a", 5, at(10))])
    assert c.offer(env("a", 1, 30), 0.0) == MissingEvents("a", 0, 0)
    assert c.answer(GapFill([], 0), 0.0) is None
    assert [(e.seq_nr, e.deleted) for e in c.pending] == [(1, False)]


def test_an_unknown_pids_previous_tombstone_is_handled_first() -> None:
    c = core()
    assert c.offer(env("a", 7, 30), 0.0) == PreviousTimestamp("a", 6)
    assert c.answer(Previous(at(20), 0), 0.0) == MissingEvents("a", 1, 6)
    assert c.answer(GapFill([env("a", 6, 20, deleted=True)], 6), 0.0) is None
    assert [(e.seq_nr, e.deleted) for e in c.pending] == [(6, True), (7, False)]


# -- an unknown pid's stored row (Akka #1197) ------------------------------------------------------


def test_an_unknown_pid_is_looked_up_in_the_table_once_memory_was_trimmed() -> None:
    window = timedelta(seconds=60)
    c = ProjectionCore(
        Mode.GROUPED,
        ProjectionSettings(**{**SETTINGS_KW, "time_window": window,
                              "delete_after_consumed": timedelta(days=1)}),
        [7],
    )  # fmt: skip
    c.start([Record(7, "a", 4, at(10)), Record(7, "b", 1, at(200))])
    c.cleaned_up(0)  # memory keeps the window only: "a" is forgotten, the table keeps it
    assert c.state.seq_nr_of("a") is None
    assert c.offer(env("a", 5, 205), 0.0) == StoredOffset("a", 7)
    assert c.answer(Record(7, "a", 4, at(10)), 0.0) is None  # known again: 5 follows 4
    assert [e.seq_nr for e in c.pending] == [5]
    # Not in the table either: the previous event's timestamp decides, as before.
    assert c.offer(env("z", 3, 206), 0.0) == StoredOffset("z", 7)
    assert c.answer(None, 0.0) == PreviousTimestamp("z", 2)


def test_without_delete_after_consumed_nothing_is_looked_up() -> None:
    c = core([Record(7, "a", 4, at(10)), Record(7, "b", 1, at(400))])
    c.cleaned_up(0)
    assert c.offer(env("a", 5, 405), 0.0) == PreviousTimestamp("a", 4)


# -- settings --------------------------------------------------------------------------------------


def test_the_new_settings_are_validated_and_documented_by_their_defaults() -> None:
    s = ProjectionSettings()
    assert s.delete_after_consumed is None
    assert s.accept_sequence_number_reset_after == timedelta(0)
    assert s.rejected_retry_interval == timedelta(seconds=2)
    assert ProjectionSettings(delete_after_consumed=60).delete_after_consumed == timedelta(
        seconds=60
    )
    for bad in (
        {"delete_after_consumed": -1},
        {"accept_sequence_number_reset_after": -0.5},
        {"rejected_retry_interval": 0},
        {"delete_after_consumed": "soon"},
    ):
        with pytest.raises(InvalidSettings):
            ProjectionSettings(**bad)  # type: ignore[arg-type]

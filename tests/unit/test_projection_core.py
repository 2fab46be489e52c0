"""The projection core's decisions with an injected clock, no database: when each
delivery mode hands a batch out, which progress markers are due, the admit
conversation (previous timestamp, gap fill, payload load), and `ProjectionCore`,
the object every driver runs, action by action."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from journal.errors import JournalError, ProtocolError
from journal.model import NOT_LOADED, EventEnvelope, TimestampOffset
from projections.core import (
    Batcher,
    Commit,
    GapFill,
    Handle,
    LoadPayload,
    MissingEvents,
    Mode,
    Previous,
    PreviousTimestamp,
    ProjectionCore,
    ProjectionStats,
    Request,
    SaveOffsets,
    admit,
    converse,
    progress_markers,
    record_of,
)
from projections.offset_store import PROGRESS_PID, OffsetState, Record
from projections.settings import ProjectionSettings

BASE = datetime(2025, 1, 1, tzinfo=UTC)
SETTINGS = ProjectionSettings(
    group_after_envelopes=3,
    group_after_duration=0.5,
    save_offset_after_envelopes=4,
    save_offset_after_duration=2.0,
    progress_interval=1.0,
)


def env(pid: str, seq_nr: int, seconds: float, *, loaded: bool = True) -> EventEnvelope:
    at = BASE + timedelta(seconds=seconds)
    return EventEnvelope(pid, "T", 7, seq_nr, at, "payload" if loaded else NOT_LOADED)


def test_exactly_once_hands_out_every_envelope_at_once() -> None:
    batcher = Batcher.for_mode(Mode.EXACTLY_ONCE, SETTINGS)
    e = env("a", 1, 0)
    assert batcher.add(e, 0.0) == [e]
    assert batcher.empty and batcher.due() == float("inf")


def test_grouped_flushes_by_size_and_by_time() -> None:
    batcher = Batcher.for_mode(Mode.GROUPED, SETTINGS)
    events = [env("a", i, i) for i in range(1, 5)]
    assert batcher.add(events[0], 10.0) == []
    assert batcher.due() == pytest.approx(10.5)
    assert batcher.add(events[1], 10.2) == []
    assert batcher.add(events[2], 10.3) == events[:3]  # full
    assert batcher.empty
    assert batcher.add(events[3], 11.0) == []
    assert batcher.due() == pytest.approx(11.5)  # the clock starts with the batch's first
    assert batcher.take() == [events[3]]


def test_at_least_once_saves_offsets_by_count_or_duration() -> None:
    batcher = Batcher.for_mode(Mode.AT_LEAST_ONCE, SETTINGS)
    events = [env("a", i, i) for i in range(1, 5)]
    for i, e in enumerate(events[:3]):
        assert batcher.add(e, float(i)) == []
    assert batcher.due() == pytest.approx(2.0)
    assert batcher.add(events[3], 3.0) == events


def test_progress_markers_for_lagging_or_empty_slices_at_most_every_interval() -> None:
    state = OffsetState(timedelta(minutes=5), [Record(1, "a", 1, BASE)])
    progress = BASE + timedelta(seconds=10)
    interval = timedelta(seconds=1)
    assert progress_markers(state, range(1, 3), progress, 0.0, 0.5, interval) == []  # too soon
    markers = progress_markers(state, range(1, 3), progress, 0.0, 5.0, interval)
    assert [(m.slice, m.persistence_id, m.timestamp) for m in markers] == [
        (1, PROGRESS_PID, progress),
        (2, PROGRESS_PID, progress),
    ]
    state.saved([Record(1, "b", 1, progress)])
    assert [m.slice for m in progress_markers(state, range(1, 3), progress, 0, 5, interval)] == [2]
    assert progress_markers(state, range(1, 3), None, 0.0, 5.0, interval) == []


def conversation_for(journal: dict[tuple[str, int], EventEnvelope]) -> Any:
    asked: list[Request] = []

    def answer(request: Request) -> Any:
        asked.append(request)
        if isinstance(request, PreviousTimestamp):
            found = journal.get((request.persistence_id, request.seq_nr))
            return Previous(None if found is None else found.db_timestamp)
        if isinstance(request, MissingEvents):
            return GapFill(
                [
                    journal[(request.persistence_id, n)]
                    for n in range(request.from_seq_nr, request.to_seq_nr + 1)
                    if (request.persistence_id, n) in journal
                ]
            )
        assert isinstance(request, LoadPayload)
        return journal.get((request.persistence_id, request.seq_nr))

    return asked, answer


def test_a_gap_is_filled_in_order_before_the_envelope() -> None:
    stored = {("a", n): env("a", n, n) for n in (1, 2, 3)}
    state = OffsetState(timedelta(minutes=5), [Record(7, "a", 1, BASE + timedelta(seconds=1))])
    stats = ProjectionStats()
    asked, answer = conversation_for(stored)
    accepted = converse(admit(state, stored[("a", 3)], stats), answer)
    assert [e.seq_nr for e in accepted] == [2, 3]
    assert asked == [MissingEvents("a", 2, 2)]
    assert (stats.accepted, stats.gaps_filled, stats.duplicates) == (2, 1, 0)
    assert state.seq_nr_of("a") == 3  # in flight until saved
    again = converse(admit(state, stored[("a", 3)], stats), answer)
    assert again == [] and stats.duplicates == 1


def test_an_unknown_pid_asks_for_the_previous_timestamp() -> None:
    stored = {("b", n): env("b", n, 100 + n) for n in (1, 2)}
    state = OffsetState(timedelta(minutes=5), [Record(7, "x", 1, BASE + timedelta(seconds=100))])
    asked, answer = conversation_for(stored)
    accepted = converse(admit(state, stored[("b", 2)], ProjectionStats()), answer)
    assert asked[0] == PreviousTimestamp("b", 1)
    assert [e.seq_nr for e in accepted] == [1, 2]  # the previous one was in the window


def test_a_backtracked_envelope_gets_its_payload_or_is_dropped_if_deleted() -> None:
    stored = {("c", 1): env("c", 1, 5)}
    state = OffsetState(timedelta(minutes=5))
    stats = ProjectionStats()
    asked, answer = conversation_for(stored)
    accepted = converse(admit(state, env("c", 1, 5, loaded=False), stats), answer)
    assert asked == [LoadPayload("c", 1)]
    assert accepted == [stored[("c", 1)]]
    gone = converse(admit(state, env("d", 1, 6, loaded=False), stats), answer)
    assert gone == [] and stats.duplicates == 1


def test_a_failed_commit_discards_in_flight_so_a_retry_revalidates() -> None:
    state = OffsetState(timedelta(minutes=5))
    _, answer = conversation_for({})
    first = converse(admit(state, env("e", 1, 1), ProjectionStats()), answer)
    assert len(first) == 1
    state.discard_inflight()
    assert len(converse(admit(state, env("e", 1, 1), ProjectionStats()), answer)) == 1


# -- ProjectionCore, action by action --------------------------------------------------------------


def core_for(mode: Mode, records: list[Record] | None = None) -> ProjectionCore:
    core = ProjectionCore(mode, SETTINGS, range(6, 9))
    core.start(records or [])
    return core


def at_query(e: EventEnvelope, seconds: float) -> EventEnvelope:
    """`e` as the normal query delivers it: with the stream's offset after it."""
    offset = TimestampOffset(BASE + timedelta(seconds=seconds))
    return EventEnvelope(
        e.persistence_id, "T", e.slice, e.seq_nr, e.db_timestamp, e.event, offset=offset
    )


def heartbeat(seconds: float) -> EventEnvelope:
    at = BASE + timedelta(seconds=seconds)
    return EventEnvelope("", "T", 0, 0, at, None, offset=TimestampOffset(at), source="heartbeat")


def test_core_exactly_once_commits_each_envelope_in_its_own_transaction() -> None:
    core = core_for(Mode.EXACTLY_ONCE)
    e = env("a", 1, 1)
    commit = core.offer(e, 0.0)
    assert commit == Commit((e,), (record_of(e),))
    assert core.state.seq_nr_of("a") == 1  # in flight
    assert core.committed(0.1) is None
    assert core.stats.transactions == 1 and core.stats.accepted == 1
    assert core.offer(e, 0.2) is None and core.stats.duplicates == 1
    assert core.next_deadline() == float("inf")


def test_core_grouped_flushes_by_size_and_by_time() -> None:
    core = core_for(Mode.GROUPED)
    events = [env("a", i, i) for i in range(1, 6)]
    assert core.offer(events[0], 10.0) is None
    assert core.offer(events[1], 10.1) is None
    assert core.next_deadline() == pytest.approx(10.5)
    full = core.offer(events[2], 10.2)
    assert isinstance(full, Commit) and full.envelopes == tuple(events[:3])
    assert core.committed(10.3) is None
    assert core.offer(events[3], 11.0) is None
    assert core.offer(events[4], 11.2) is None
    assert core.poll(11.4) is None  # not yet
    late = core.poll(11.5)
    assert isinstance(late, Commit) and late.envelopes == tuple(events[3:])
    assert core.committed(11.6) is None
    assert core.flush(12.0) is None and core.stats.transactions == 2


def test_core_at_least_once_hands_out_each_envelope_and_saves_offsets_periodically() -> None:
    core = core_for(Mode.AT_LEAST_ONCE)
    events = [env("a", i, i) for i in range(1, 6)]
    for i, e in enumerate(events[:3]):
        assert core.offer(e, float(i)) == Handle(e)
        assert core.handled(float(i)) is None
    save = core.offer(events[3], 3.0)
    assert save == Handle(events[3])
    save = core.handled(3.0)
    assert save == SaveOffsets(tuple(record_of(e) for e in events[:4]))  # 4 envelopes
    assert core.committed(3.1) is None
    assert core.offer(events[4], 4.0) == Handle(events[4])
    assert core.handled(4.0) is None
    assert core.next_deadline() == pytest.approx(6.0)  # save_offset_after_duration
    assert core.poll(6.0) == SaveOffsets((record_of(events[4]),))


def test_core_progress_markers_from_heartbeats_at_most_every_interval() -> None:
    core = core_for(Mode.EXACTLY_ONCE, [Record(7, "a", 1, BASE + timedelta(seconds=50))])
    save = core.offer(heartbeat(10), 5.0)
    # Slices 6 and 8 have no row; 7's latest (50 s) does not lag 10 s.
    assert save == SaveOffsets(
        tuple(Record(s, PROGRESS_PID, 0, BASE + timedelta(seconds=10)) for s in (6, 8))
    )
    assert core.committed(5.0) is None
    assert core.offer(heartbeat(20), 5.5) is None  # within progress_interval of the last save
    again = core.offer(heartbeat(100), 6.0)
    assert isinstance(again, SaveOffsets) and [r.slice for r in again.records] == [6, 7, 8]
    assert core.stats.heartbeats == 3


def test_core_markers_of_a_commit_claim_the_position_before_its_envelope() -> None:
    core = core_for(Mode.EXACTLY_ONCE)
    first = core.offer(at_query(env("a", 1, 10), 10), 5.0)
    assert isinstance(first, Commit) and first.markers == ()  # no position yet
    assert core.committed(5.0) is None
    second = core.offer(at_query(env("b", 1, 20), 20), 6.5)
    assert isinstance(second, Commit)
    assert [(m.slice, m.timestamp) for m in second.markers] == [
        (6, BASE + timedelta(seconds=10)),
        (8, BASE + timedelta(seconds=10)),
    ]
    assert second.records == [*second.events, *second.markers]
    assert core.committed(6.5) is None
    assert core.stats.latest_timestamp == BASE + timedelta(seconds=20)
    # A heartbeat while a grouped batch is pending does not move the position.
    grouped = core_for(Mode.GROUPED)
    assert grouped.offer(env("a", 1, 1), 0.0) is None
    assert grouped.offer(heartbeat(30), 9.0) is None


def test_core_a_gap_asks_for_the_missing_events_and_commits_them_first() -> None:
    stored = {("a", n): env("a", n, n) for n in (1, 2, 3, 4)}
    core = core_for(Mode.EXACTLY_ONCE, [Record(7, "a", 1, BASE + timedelta(seconds=1))])
    request = core.offer(stored[("a", 4)], 0.0)
    assert request == MissingEvents("a", 2, 3)
    first = core.answer(GapFill([stored[("a", 2)], stored[("a", 3)]]), 0.0)
    assert isinstance(first, Commit) and [e.seq_nr for e in first.envelopes] == [2]
    second = core.committed(0.0)
    assert isinstance(second, Commit) and [e.seq_nr for e in second.envelopes] == [3]
    third = core.committed(0.0)
    assert isinstance(third, Commit) and [e.seq_nr for e in third.envelopes] == [4]
    assert core.committed(0.0) is None
    assert core.stats.gaps_filled == 2 and core.stats.transactions == 3


def test_core_an_unknown_pid_asks_for_the_previous_timestamp() -> None:
    core = core_for(Mode.GROUPED, [Record(7, "x", 1, BASE + timedelta(seconds=100))])
    assert core.offer(env("b", 3, 103), 0.0) == PreviousTimestamp("b", 2)
    # deleted (the journal's marker at 2): accepted without a gap fill
    assert core.answer(Previous(None, deleted_to=2), 0.0) is None
    assert [e.seq_nr for e in core.pending] == [3]
    # not stored and not deleted: not visible yet, so held, never accepted on a guess
    assert core.offer(env("f", 3, 104), 0.0) == PreviousTimestamp("f", 2)
    assert core.answer(Previous(None), 0.0) is None
    assert [e.seq_nr for e in core.pending] == [3] and core.stats.rejected == 1
    assert [(e.persistence_id, e.seq_nr) for e in core.held] == [("f", 3)]


def test_core_a_backtracked_envelope_gets_its_payload_or_is_dropped() -> None:
    core = core_for(Mode.EXACTLY_ONCE)
    bare = env("c", 1, 5, loaded=False)
    assert core.offer(bare, 0.0) == LoadPayload("c", 1)
    commit = core.answer(env("c", 1, 5), 0.0)
    assert isinstance(commit, Commit) and commit.envelopes[0].event == "payload"
    assert core.committed(0.0) is None
    assert core.offer(env("d", 1, 6, loaded=False), 0.0) == LoadPayload("d", 1)
    assert core.answer(None, 0.0) is None  # deleted since
    assert core.stats.duplicates == 1 and core.state.seq_nr_of("d") is None
    # Erased and written again (a reset id): the stored seq_nr 1 is a later event's, whose
    # payload must not be applied as this one's.
    assert core.offer(env("g", 1, 7, loaded=False), 0.0) == LoadPayload("g", 1)
    assert core.answer(env("g", 1, 9), 0.0) is None
    assert core.stats.duplicates == 2 and core.state.seq_nr_of("g") is None


def test_core_a_failed_commit_discards_in_flight_and_the_retry_revalidates() -> None:
    core = core_for(Mode.GROUPED)
    e = env("e", 1, 1)
    assert core.offer(e, 0.0) is None
    assert core.offer(e, 0.0) is None and core.stats.duplicates == 1  # in flight
    assert isinstance(core.flush(0.0), Commit)
    core.failed()
    assert core.state.seq_nr_of("e") is None and core.pending == ()
    assert core.offer(e, 1.0) is None and core.pending == (e,)  # accepted again


def test_core_skipped_envelopes_store_their_rows_without_markers() -> None:
    core = core_for(Mode.EXACTLY_ONCE)
    assert isinstance(core.offer(at_query(env("a", 1, 1), 1), 5.0), Commit)
    assert core.committed(5.0) is None
    commit = core.offer(env("b", 1, 2), 7.0)
    assert isinstance(commit, Commit) and commit.markers  # due, but dead-lettered instead
    assert core.skipped(7.0) is None
    assert core.stats.skipped == 1 and core.state.seq_nr_of("b") == 1
    assert core.state.latest_of_slice(6) is None  # the markers were not written
    alo = core_for(Mode.AT_LEAST_ONCE)
    assert alo.offer(env("c", 1, 1), 0.0) == Handle(env("c", 1, 1))
    assert alo.skipped(0.0) is None and alo.stats.skipped == 1 and len(alo.pending) == 1


def test_core_out_of_turn_calls_are_protocol_errors() -> None:
    core = core_for(Mode.EXACTLY_ONCE)
    with pytest.raises(ProtocolError):
        core.committed(0.0)
    assert isinstance(core.offer(env("a", 1, 1), 0.0), Commit)
    with pytest.raises(ProtocolError):
        core.offer(env("a", 2, 2), 0.0)
    with pytest.raises(ProtocolError) as info:
        core.answer(None, 0.0)
    # One error type for every out-of-turn driver, a JournalError like every library error.
    assert isinstance(info.value, JournalError) and isinstance(info.value, RuntimeError)
    assert core.committed(0.0) is None


def test_the_core_pickles_with_its_settings_state_and_pending_batch() -> None:
    core = core_for(Mode.GROUPED, [Record(7, "a", 1, BASE)])
    assert core.offer(env("a", 2, 2), 3.0) is None
    copy = pickle.loads(pickle.dumps(core))
    assert copy.settings == SETTINGS and copy.mode is Mode.GROUPED
    assert copy.state.seq_nr_of("a") == 2 and copy.pending == core.pending
    assert copy.next_deadline() == core.next_deadline()
    commit = copy.flush(4.0)
    assert isinstance(commit, Commit) and commit.events == (
        Record(7, "a", 2, env("a", 2, 2).db_timestamp),
    )
    records = [Record(7, "a", 1, BASE), Record(8, PROGRESS_PID, 0, BASE)]
    assert pickle.loads(pickle.dumps(records)) == records
    # In the middle of an admission it refuses, rather than losing the conversation.
    assert core.flush(4.0) is not None and core.committed(4.0) is None
    assert core.offer(env("z", 5, 9), 5.0) == PreviousTimestamp("z", 4)
    with pytest.raises(TypeError):
        pickle.dumps(core)

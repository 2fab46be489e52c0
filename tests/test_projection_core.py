"""The projection core's decisions with an injected clock, no database: when each
delivery mode hands a batch out, which progress markers are due, and the admit
conversation (previous timestamp, gap fill, payload load)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from journal import NOT_LOADED, EventEnvelope
from projections import ProjectionSettings
from projections.core import (
    Batcher,
    LoadPayload,
    MissingEvents,
    Mode,
    PreviousTimestamp,
    ProjectionStats,
    Request,
    admit,
    converse,
    progress_markers,
)
from projections.offset_store import PROGRESS_PID, OffsetState, Record

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
            return None if found is None else found.db_timestamp
        if isinstance(request, MissingEvents):
            return [
                journal[(request.persistence_id, n)]
                for n in range(request.from_seq_nr, request.to_seq_nr + 1)
                if (request.persistence_id, n) in journal
            ]
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

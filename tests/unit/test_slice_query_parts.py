"""The parts of the slice query's state, each on its own, and the mode they drive.

`test_by_slice_machine.py` checks the whole machine against a model of the
journal; these tests pin down each part's rule directly, so a regression names
the rule it broke.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal.errors import ProtocolError
from journal.model import EPOCH, TimestampOffset
from journal.query.backtracking import (
    BACKTRACKING_AFTER_BUFFERS,
    IDLE_POLLS_BEFORE_BACKTRACKING,
    BacktrackingTracker,
)
from journal.query.buckets import BUCKET_SECONDS, CHUNK_BUFFERS, BucketTracker, bucket_start
from journal.query.by_slice import (
    BucketsQuery,
    BySliceQuery,
    Done,
    HorizonQuery,
    Mode,
    Request,
    RowsQuery,
    Wait,
)
from journal.query.horizon import Blind, Horizon, OpenTransaction, ended_since, read_past
from journal.query.horizon_tracker import HorizonTracker
from journal.query.scan import ScanPosition, offset_after
from journal.query.tail import HELD_POLL, TailTracker
from journal.settings import BacktrackingSettings, HorizonSettings, QuerySettings

BASE = EPOCH + timedelta(days=20000)  # a multiple of the bucket width


def at(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)


BACKTRACKING = BacktrackingSettings(
    window=timedelta(seconds=60), behind_current_time=timedelta(seconds=5)
)
HORIZON = HorizonSettings(margin=timedelta(milliseconds=5), max_hold=timedelta(seconds=3))


def query_settings(**kw: Any) -> QuerySettings:
    base: dict[str, Any] = {
        "buffer_size": 10,
        "refresh_interval": 1.0,
        "behind_current_time": 0.1,
        "backtracking": BACKTRACKING,
        "horizon": HORIZON,
    }
    base.update(kw)
    return QuerySettings(**base)


# -- the scan position ---------------------------------------------------------


def test_a_later_row_starts_a_new_seen_set() -> None:
    offset = TimestampOffset(at(1), at(1), {"a": 3, "b": 1})
    after = offset_after(offset, at(2), "c", 7, at(5))
    assert after == TimestampOffset(at(2), at(5), {"c": 7})
    assert dict(after.seen) == {"c": 7}


def test_a_row_at_the_offset_is_added_unless_already_seen() -> None:
    offset = TimestampOffset(at(1), at(1), {"a": 3})
    added = offset_after(offset, at(1), "b", 1, at(2))
    assert added is not None and dict(added.seen) == {"a": 3, "b": 1}
    assert offset_after(offset, at(1), "a", 3, at(2)) is None
    assert offset_after(offset, at(1), "a", 2, at(2)) is None
    newer = offset_after(offset, at(1), "a", 4, at(2))
    assert newer is not None and dict(newer.seen) == {"a": 4}


def test_a_row_before_the_offset_is_not_emitted() -> None:
    assert offset_after(TimestampOffset(at(5)), at(4), "a", 9, at(6)) is None


def test_the_scan_excludes_what_was_emitted_at_its_start() -> None:
    position = ScanPosition.at(TimestampOffset(at(3), at(3), {"a": 2}))
    assert position.scan_from == at(3)
    assert dict(position.exclude) == {"a": 2}


def test_a_chunk_moves_the_scan_ahead_of_the_offset_with_nothing_to_exclude() -> None:
    position = ScanPosition.at(TimestampOffset(at(3), at(3), {"a": 2}))
    moved = position.skip_to(at(10))
    assert moved.scan_from == at(10)
    assert moved.latest == position.latest
    assert dict(moved.exclude) == {}


def test_the_scan_never_moves_back() -> None:
    position = ScanPosition.at(TimestampOffset(at(3))).skip_to(at(10))
    assert position.skip_to(at(5)) is position


def full_row(ts: datetime, pid: str, seq_nr: int, read_at: datetime) -> tuple[Any, ...]:
    """A row as the slice query selects it (payload column empty), its read time last."""
    return (pid, "T", 0, seq_nr, ts, "w", None, 31, "", None, None, None, None, read_at)


def test_emitting_a_batch_is_emitting_its_rows_in_turn() -> None:
    start = ScanPosition.at(TimestampOffset(at(3), at(3), {"a": 2}))
    rows = [
        full_row(at(3), "a", 2, at(9)),  # emitted already at the start
        full_row(at(3), "b", 1, at(9)),
        full_row(at(4), "a", 3, at(9)),
        full_row(at(4), "c", 5, at(9)),
        full_row(at(4), "a", 3, at(9)),  # a duplicate within the batch
        full_row(at(6), "d", 1, at(10)),
    ]
    position, emitted = start.emit_rows(rows)
    assert built(emitted) == one_by_one(start, rows)
    assert position == ScanPosition(built(emitted)[-1][1], at(6))
    assert [dict(o.seen) for _, o in built(emitted)] == [{"a": 2, "b": 1}, {"a": 3},
                                                         {"a": 3, "c": 5}, {"d": 1}]  # fmt: skip
    # A row with a timestamp of its own leaves its offset to be built when read.
    assert [type(o) for _, o in emitted] == [TimestampOffset, datetime, TimestampOffset, datetime]
    assert start.emit_rows([rows[0]]) == (start, [])
    # An append's events share a timestamp: each one's offset is still its own.
    append = [full_row(at(7), "e", n, at(11)) for n in (1, 2, 3)]
    after, emitted = position.emit_rows(append)
    assert [o for _, o in emitted] == [at(11)] * 3
    assert after.latest == TimestampOffset(at(7), at(11), {"e": 3})


def test_a_reset_tombstone_at_a_timestamp_another_id_has_is_emitted() -> None:
    """`delete_all(reset_sequence_number=True)` leaves a tombstone at seq_nr 0; an id not
    seen at a timestamp has emitted nothing there, that seq_nr included."""
    start = ScanPosition.at(TimestampOffset(at(3), at(3), {"a": 5}))
    after = start.emit(at(3), "b", 0, at(9))
    assert after is not None and dict(after.latest.seen) == {"a": 5, "b": 0}
    assert after.emit(at(3), "b", 0, at(9)) is None  # but only once
    rows = [full_row(at(4), "a", 1, at(9)), full_row(at(4), "b", 0, at(9)),
            full_row(at(4), "c", 0, at(9))]  # fmt: skip
    _, emitted = start.emit_rows(rows)
    assert [r[0] for r, _ in built(emitted)] == ["a", "b", "c"]


@given(
    st.lists(st.tuples(st.integers(3, 6), st.sampled_from("abc"), st.integers(1, 4)), max_size=12),
    st.sampled_from([{}, {"a": 2}, {"a": 1, "b": 3}]),
)
def test_a_batch_emits_what_its_rows_emit_one_by_one(
    keys: list[tuple[int, str, int]], seen: dict[str, int]
) -> None:
    """Any batch in timestamp order, from any position: the same rows, the same offsets
    (built where the row's own was left to be built) and the same position after."""
    start = ScanPosition.at(TimestampOffset(at(3), at(3), seen))
    rows = [full_row(at(t), pid, seq_nr, at(100 + i)) for i, (t, pid, seq_nr) in
            enumerate(sorted(keys, key=lambda k: k[0]))]  # fmt: skip
    position, emitted = start.emit_rows(rows)
    expected = one_by_one(start, rows)
    assert built(emitted) == expected
    assert position.latest == (expected[-1][1] if expected else start.latest)
    assert dict(position.latest.seen) == dict(expected[-1][1].seen if expected else seen)


def one_by_one(
    start: ScanPosition, rows: list[tuple[Any, ...]]
) -> list[tuple[Any, TimestampOffset]]:
    """What `emit` emits for each row in turn, with the offset after it."""
    emitted = []
    position = start
    for r in rows:
        after = position.emit(r[4], r[0], r[3], r[-1])
        if after is not None:
            position = after
            emitted.append((r, after.latest))
    return emitted


def built(emitted: list[tuple[Any, Any]]) -> list[tuple[Any, TimestampOffset]]:
    """The emitted rows with their offsets, built where a row's own was left to be (as
    the envelope builds it: its timestamp, the read time, its id alone seen)."""
    return [
        (r, o if isinstance(o, TimestampOffset) else TimestampOffset(r[4], o, {r[0]: r[3]}))
        for r, o in emitted
    ]


def test_emitting_moves_offset_and_scan_to_the_row() -> None:
    later = ScanPosition.at(TimestampOffset(at(3))).emit(at(4), "b", 2, at(5))
    assert later is not None and later.scan_from == at(4)

    position = ScanPosition.at(TimestampOffset(at(3))).skip_to(at(10))
    after = position.emit(at(10), "a", 1, at(11))
    assert after is not None
    assert after.latest == TimestampOffset(at(10), at(11), {"a": 1})
    assert after.scan_from == at(10)
    assert dict(after.exclude) == {"a": 1}
    assert after.emit(at(10), "a", 1, at(12)) is None


# -- the bucket tracker --------------------------------------------------------


def buckets(buffer_size: int = 10, limit: int = 100) -> BucketTracker:
    return BucketTracker(buffer_size, limit)


def start_of(seconds: float) -> int:
    return bucket_start(at(seconds))


def test_an_unknown_position_counts_a_window_first() -> None:
    tracker = buckets(limit=100)
    assert tracker.needs_count(at(25))
    # Aligned to the bucket holding the scan position.
    assert tracker.window_end(at(25)) == at(20 + 100 * BUCKET_SECONDS)


def test_an_empty_window_is_followed_by_one_count_to_the_end() -> None:
    tracker = buckets().on_counts([])
    assert tracker.counts is None and tracker.needs_count(at(0))
    assert tracker.window_end(at(0)) is None
    counted = tracker.on_counts([(start_of(5000), 3)])
    assert counted.window_end(at(0)) is not None
    assert counted.counts is not None and counted.counts.complete


def test_a_windowed_count_is_never_complete() -> None:
    tracker = buckets().on_counts([(start_of(0), 1)])
    assert tracker.counts is not None and not tracker.counts.complete


def test_a_count_cut_off_at_the_bucket_limit_is_not_complete() -> None:
    rows = [(start_of(0), 1), (start_of(10), 1)]
    tracker = buckets(limit=2).on_counts([]).on_counts(rows)
    assert tracker.counts is not None and not tracker.counts.complete


def test_the_bound_ends_the_bucket_where_rows_reach_the_buffer() -> None:
    c = CHUNK_BUFFERS  # a chunk is that many buffers
    rows = [(start_of(0), 50 * c), (start_of(10), 4 * c), (start_of(20), 6 * c),
            (start_of(30), 9 * c)]  # fmt: skip
    tracker = buckets(buffer_size=10).on_counts(rows)
    # The bucket before the scan position does not count.
    assert tracker.bound(at(12)) != at(20)
    assert tracker.bound(at(12)) == at(30)
    assert tracker.scan_bound(at(12), None) == at(30)
    assert not tracker.needs_count(at(12))


def test_counts_that_never_reach_the_buffer_bound_at_their_last_bucket_unless_complete() -> None:
    rows = [(start_of(0), 2), (start_of(10), 2)]
    cut_off = buckets(buffer_size=10).on_counts(rows)
    assert cut_off.bound(at(0)) == at(20)
    complete = buckets(buffer_size=10).on_counts([]).on_counts(rows)
    assert complete.bound(at(0)) is None
    # Nothing more to count and nothing to bound: a LIMIT query reads the rest.
    assert not complete.needs_count(at(0))
    assert complete.scan_bound(at(0), None) is None


def test_counts_behind_the_scan_position_are_counted_again() -> None:
    tracker = buckets().on_counts([(start_of(0), 3)])
    assert tracker.bound(at(40)) is None
    assert tracker.needs_count(at(40))


def test_a_bound_past_the_end_of_a_current_query_is_dropped() -> None:
    tracker = buckets(buffer_size=1).on_counts([(start_of(0), 1)])
    assert tracker.scan_bound(at(0), at(20)) == at(10)
    assert tracker.scan_bound(at(0), at(5)) is None


def test_at_the_tail_no_count_and_no_bound() -> None:
    counted = buckets(buffer_size=1).on_counts([(start_of(0), 1)])
    assert counted.needs_count(at(40)) and counted.scan_bound(at(0), None) is not None
    tracker = counted.after_limit_query(full=False)
    assert not tracker.catching_up
    assert not tracker.needs_count(at(40))
    assert tracker.scan_bound(at(0), None) is None


def test_a_full_limit_query_falls_behind_again_and_recounts() -> None:
    tracker = buckets(buffer_size=1).on_counts([(start_of(0), 1)])
    tracker = tracker.after_limit_query(full=False).after_limit_query(full=True)
    assert tracker.catching_up and tracker.counts is None
    assert tracker.needs_count(at(0))


# -- the backtracking tracker --------------------------------------------------


def backtracking(
    offset: TimestampOffset, settings: BacktrackingSettings = BACKTRACKING
) -> BacktrackingTracker:
    return BacktrackingTracker.resuming_from(settings, 10, offset)


RECENT = TimestampOffset(at(100), at(101), {})


def idle(tracker: BacktrackingTracker, polls: int) -> BacktrackingTracker:
    for _ in range(polls):
        tracker = tracker.after_normal_query(0)
    return tracker


def test_idle_polls_make_a_run_due() -> None:
    started = backtracking(RECENT).start(at(100), ())  # at 35
    latest = TimestampOffset(at(36), at(37))  # close behind: the lag rule stays quiet
    tracker = idle(started, IDLE_POLLS_BEFORE_BACKTRACKING - 1)
    assert not tracker.due(latest, live=True)
    assert idle(tracker, 1).due(latest, live=True)
    # A poll with rows starts the count again.
    assert not idle(tracker.after_normal_query(1), 1).due(latest, live=True)


def test_a_few_buffers_of_rows_make_a_run_due() -> None:
    tracker = backtracking(RECENT).after_normal_query(1).start(at(100), ())  # at 35
    latest = TimestampOffset(at(36), at(37))  # close behind: the lag rule stays quiet
    rows = BACKTRACKING_AFTER_BUFFERS * 10
    assert not tracker.after_normal_query(rows - 1).due(latest, live=True)
    assert tracker.after_normal_query(rows).due(latest, live=True)


def test_rows_more_than_half_a_window_past_the_position_make_a_run_due() -> None:
    started = backtracking(RECENT).start(at(100), ())
    assert started.position is not None
    position_ts = started.position.timestamp
    ahead = TimestampOffset(
        position_ts + timedelta(seconds=31), position_ts + timedelta(seconds=31)
    )
    near = TimestampOffset(position_ts + timedelta(seconds=29), position_ts + timedelta(seconds=29))
    assert started.after_normal_query(1).due(ahead, live=True)
    assert not started.after_normal_query(1).due(near, live=True)
    # Without new rows the idle rule decides, not the distance.
    assert not started.due(ahead, live=True)


@pytest.mark.parametrize(
    ("offset", "live", "enabled"),
    [
        (RECENT, False, True),
        (RECENT, True, False),
        (TimestampOffset.zero(), True, True),
        # Catching up far behind the clock: nothing back there commits late.
        (TimestampOffset(at(100), at(100 + 61)), True, True),
    ],
)
def test_no_run_when_it_could_find_nothing(
    offset: TimestampOffset, live: bool, enabled: bool
) -> None:
    settings = attrs.evolve(BACKTRACKING, enabled=enabled)
    tracker = idle(backtracking(offset, settings=settings), 10)
    assert not tracker.due(offset, live=live)


def test_a_run_starts_a_window_behind_and_resets_the_triggers() -> None:
    tracker = idle(backtracking(RECENT), 7).start(at(100), ())
    assert tracker.position == TimestampOffset(at(100 - 65), EPOCH, {})
    assert (tracker.idle_polls, tracker.rows_since) == (0, 0)
    assert tracker.behind_current_time == timedelta(seconds=5)


def test_a_run_never_starts_before_the_epoch() -> None:
    tracker = backtracking(RECENT).start(EPOCH + timedelta(seconds=10), ())
    assert tracker.position == TimestampOffset(EPOCH)


def test_a_run_continues_from_a_position_within_the_window() -> None:
    tracker = backtracking(RECENT).start(at(100), ()).emit(at(90), "a", 1, at(101))
    assert tracker is not None
    again = tracker.start(at(120), ())
    assert again.position == TimestampOffset(at(90), at(101), {"a": 1})


def test_a_reread_run_starts_at_the_earliest_ended_transaction_and_then_resumes() -> None:
    regular = backtracking(RECENT).start(at(100), ()).emit(at(90), "a", 1, at(101))
    assert regular is not None
    rereading = regular.start(at(100), (at(20), at(10), at(30)))
    assert rereading.position == TimestampOffset(at(10))
    # The transactions ended before this run: it reads up to the scan, not behind the clock.
    assert rereading.behind_current_time is None
    ended = rereading.end_run(rows=0)
    assert ended.reread is None
    assert ended.position == regular.position
    assert ended.behind_current_time == timedelta(seconds=5)


def test_a_run_applies_the_tie_rule_of_the_scan() -> None:
    tracker = backtracking(RECENT).start(at(100), ())
    first = tracker.emit(at(40), "a", 1, at(101))
    assert first is not None and first.position == TimestampOffset(at(40), at(101), {"a": 1})
    assert first.emit(at(40), "a", 1, at(102)) is None
    assert first.emit(at(39), "b", 1, at(102)) is None


def test_a_row_before_any_run_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        backtracking(RECENT).emit(at(1), "a", 1, at(1))


def test_a_normal_read_late_enough_counts_as_backtracked() -> None:
    from_start = backtracking(TimestampOffset.zero())
    moved = from_start.covered_by_normal_read(EPOCH, scan_from=at(50), read_at=at(52))
    # Only what was at least behind_current_time old when read.
    assert moved.position == TimestampOffset(at(47))
    further = moved.covered_by_normal_read(at(40), scan_from=at(60), read_at=at(100))
    assert further.position == TimestampOffset(at(60))


def test_a_normal_read_that_leaves_a_gap_does_not_count() -> None:
    started = backtracking(RECENT).start(at(100), ())  # position at 35
    assert started.covered_by_normal_read(at(36), at(50), at(100)) is started
    # A resumed stream has re-read nothing before its first run.
    resumed = backtracking(RECENT)
    assert resumed.covered_by_normal_read(EPOCH, at(50), at(100)) is resumed


# -- the horizon tracker -------------------------------------------------------


def horizon_tracker(live: bool = True, enabled: bool = True) -> HorizonTracker:
    settings = attrs.evolve(HORIZON, enabled=enabled)
    return HorizonTracker.for_stream(settings, live)


@pytest.mark.parametrize(("live", "enabled", "due"), [(True, True, True), (False, True, False)])
def test_only_a_live_query_with_the_horizon_reads_it(live: bool, enabled: bool, due: bool) -> None:
    tracker = horizon_tracker(live, enabled)
    assert tracker.reading_due is due
    assert tracker.exact is due


def test_the_horizon_can_be_turned_off() -> None:
    assert not horizon_tracker(enabled=False).reading_due


def test_a_reading_is_used_by_one_query() -> None:
    writer = OpenTransaction(7, at(40), writes_journal=True)
    tracker = horizon_tracker().on_reading(Horizon(at(50), (writer,)), at(0))
    assert not tracker.reading_due
    used, reading = tracker.use_reading()
    assert reading is not None
    assert reading.bound == at(40) - HORIZON.margin and reading.held
    assert used.reading_due
    assert used.use_reading()[1] is None


def test_a_blind_reading_is_used_up_and_says_stay_behind_the_clock() -> None:
    blind = Horizon(at(50), (), Blind("tracking off", "off"))
    tracker = horizon_tracker().on_reading(blind, at(0))
    assert not tracker.reading_due and not tracker.exact
    behind = timedelta(seconds=0.1)
    assert tracker.lag(behind) == behind
    used, reading = tracker.use_reading()
    assert reading is None and used.reading_due
    trusted = used.on_reading(Horizon(at(51)), at(0))
    assert trusted.exact and trusted.lag(behind) == HORIZON.margin


def test_a_transaction_not_waited_for_is_re_read_for_once_it_ends() -> None:
    idle_tx = OpenTransaction(3, at(1), writes_journal=False)
    tracker = horizon_tracker().on_reading(Horizon(at(10), (idle_tx,)), at(5))
    assert tracker.not_waited_for == {(3, at(1))}
    assert tracker.ended == ()
    assert list(tracker.rereads_due()) == [at(1)]
    still_open = tracker.on_reading(Horizon(at(11), (idle_tx,)), at(5))
    assert still_open.ended == ()
    gone = tracker.on_reading(Horizon(at(12)), at(5))
    assert gone.ended == (at(1),) and gone.not_waited_for == frozenset()
    assert list(gone.rereads_due()) == [at(1)]
    handed_over, ended = gone.start_backtracking()
    assert ended == (at(1),)
    assert handed_over.ended == () and list(handed_over.rereads_due()) == []
    # The run comes after the reading: the next normal query needs a new one.
    assert handed_over.reading_due


def test_a_blind_reading_concludes_nothing_about_who_ended() -> None:
    idle_tx = OpenTransaction(3, at(1), writes_journal=False)
    tracker = horizon_tracker().on_reading(Horizon(at(10), (idle_tx,)), at(5))
    blind = tracker.on_reading(Horizon(at(11), (), Blind("prepared", "1")), at(5))
    assert blind.ended == () and blind.not_waited_for == {(3, at(1))}


# -- the tail tracker ----------------------------------------------------------


def test_the_poll_delay_follows_how_full_the_last_result_was() -> None:
    settings = query_settings(buffer_size=100, refresh_interval=2.0)
    tail, delay = TailTracker().poll(10, settings)
    assert delay == 2.0
    _, delay = tail.poll(11, settings)
    assert delay == 1.0


def test_a_held_stream_polls_soon_and_backs_off() -> None:
    settings = query_settings(buffer_size=100, refresh_interval=1.0)
    tail = TailTracker().asking(held=True)
    delays = []
    for _ in range(4):
        tail, delay = tail.poll(0, settings)
        delays.append(delay)
    assert delays == pytest.approx([HELD_POLL, 2 * HELD_POLL, 4 * HELD_POLL, 8 * HELD_POLL])
    for _ in range(10):
        tail, delay = tail.poll(0, settings)
    assert delay == 1.0
    released, _ = tail.asking(held=False).poll(0, settings)
    assert (released.held_polls, released.held_rows) == (0, 0)


def test_rows_read_while_held_count_towards_the_next_delay() -> None:
    settings = query_settings(buffer_size=100, refresh_interval=1.0)
    tail, _ = TailTracker().asking(held=True).poll(8, settings)
    _, delay = tail.asking(held=False).poll(8, settings)
    assert delay == 0.5  # 16 rows since the last unheld poll: busy


def test_a_heartbeat_reaches_the_horizon_of_the_last_tail_query() -> None:
    tail = TailTracker().after_tail_query(at(40), asked_at=7.0)
    behind = timedelta(seconds=0.1)
    assert tail.reached(at(10), at(50), 9.0, None, behind) == at(40)
    # Not past a transaction not waited for, nor behind what was emitted.
    assert tail.reached(at(10), at(50), 9.0, at(30), behind) == at(30)
    assert tail.reached(at(45), at(50), 9.0, at(30), behind) == at(45)
    clipped = tail.after_clipped_chunk(at(20))
    assert clipped.reached(at(10), at(50), 9.0, None, behind) == at(20)


def test_without_a_horizon_a_heartbeat_stays_behind_the_clock_since_the_tail_read() -> None:
    tail = TailTracker().after_tail_query(None, asked_at=7.0)
    behind = timedelta(seconds=1)
    # Read 2 s ago: only what was older than the lag then.
    assert tail.reached(at(10), at(50), 9.0, None, behind) == at(47)
    assert TailTracker().reached(at(10), at(50), 9.0, None, behind) == at(10)


# -- the mode ------------------------------------------------------------------


def mode_of(machine: BySliceQuery) -> Mode:
    # Read afresh each time: mypy would keep `machine.mode` narrowed across calls.
    return machine.mode


def row(pid: str, seq_nr: int, ts: datetime) -> tuple[Any, ...]:
    return (pid, "T", 0, seq_nr, ts, "w")


def answer(machine: BySliceQuery, request: Request, reading: Horizon) -> None:
    if isinstance(request, HorizonQuery):
        machine.on_horizon(reading)
    elif isinstance(request, BucketsQuery):
        machine.on_buckets([])
    else:
        raise AssertionError(f"unexpected {request!r}")


def next_rows(machine: BySliceQuery, now: float, reading: Horizon | None = None) -> RowsQuery:
    """The next RowsQuery at `now`, past horizon readings and (empty) bucket counts."""
    request = machine.next_request(now)
    while not isinstance(request, RowsQuery):
        answer(machine, request, reading or Horizon(at(now)))
        request = machine.next_request(now)
    return request


def poll_empty(machine: BySliceQuery, now: float, reading: Horizon | None = None) -> float:
    """One normal query that finds nothing; returns when the machine wants the next."""
    query = next_rows(machine, now, reading)
    assert not query.backtracking
    machine.on_rows_done(now)
    wait = machine.next_request(now)
    assert isinstance(wait, Wait)
    return wait.until


def test_idle_polls_switch_to_backtracking_and_back() -> None:
    machine = BySliceQuery(query_settings(), TimestampOffset(at(100), at(100)), now=100.0)
    now = 100.0
    for _ in range(IDLE_POLLS_BEFORE_BACKTRACKING):
        assert mode_of(machine) is Mode.NORMAL
        now = poll_empty(machine, now)
    run = next_rows(machine, now)
    assert run.backtracking and mode_of(machine) is Mode.BACKTRACKING and machine.backtracking
    # A full result: the run goes on.
    for i in range(run.limit or 0):
        machine.on_row(row("a", i + 1, at(90)), at(now), now)
    machine.on_rows_done(now)
    assert mode_of(machine) is Mode.BACKTRACKING
    assert next_rows(machine, now).backtracking
    machine.on_rows_done(now)
    assert mode_of(machine) is Mode.AFTER_BACKTRACKING and not machine.backtracking
    assert not next_rows(machine, now).backtracking
    assert mode_of(machine) is Mode.NORMAL


def test_one_normal_query_follows_a_run_even_when_another_is_due() -> None:
    machine = BySliceQuery(query_settings(), TimestampOffset(at(100), at(100)), now=100.0)
    first = OpenTransaction(3, at(1), writes_journal=False)
    second = OpenTransaction(4, at(2), writes_journal=False)
    now = poll_empty(machine, 100.0, Horizon(at(100), (first, second)))
    run = next_rows(machine, now, Horizon(at(now), (second,)))  # the first ended
    assert run.backtracking and run.from_timestamp == at(1)
    machine.on_rows_done(now)
    assert mode_of(machine) is Mode.AFTER_BACKTRACKING
    # The second ends in the reading right after the run: its re-read waits one query.
    query = next_rows(machine, now, Horizon(at(now)))
    assert not query.backtracking and mode_of(machine) is Mode.NORMAL
    machine.on_rows_done(now)
    wait = machine.next_request(now)
    assert isinstance(wait, Wait)
    rerun = next_rows(machine, wait.until, Horizon(at(wait.until)))
    assert rerun.backtracking and rerun.from_timestamp == at(2)


def test_a_current_query_is_done_at_its_first_result_short_of_its_limit() -> None:
    machine = BySliceQuery(query_settings(), live=False, end=at(50), now=0.0)
    query = next_rows(machine, 0.0)
    assert query.to_inclusive == at(50)
    assert mode_of(machine) is Mode.NORMAL
    machine.on_rows_done(0.0)
    assert mode_of(machine) is Mode.DONE and machine.done
    assert isinstance(machine.next_request(1.0), Done)


def test_a_current_query_reads_the_rest_in_one_statement() -> None:
    # Past the last bucket bound (here: no bucket counted), a current query does not
    # read `buffer_size` rows per LIMIT query: it reads the rest up to its end at once.
    machine = BySliceQuery(query_settings(buffer_size=2), live=False, end=at(50), now=0.0)
    query = next_rows(machine, 0.0)
    assert (query.limit, query.until_exclusive, query.to_inclusive) == (None, None, at(50))
    for seq_nr in (1, 2, 3):
        machine.on_row(row("a", seq_nr, at(1)), at(60), 0.0)
    machine.on_rows_done(0.0)
    assert isinstance(machine.next_request(0.0), Done)


def test_a_full_live_query_at_the_tail_asks_again() -> None:
    machine = BySliceQuery(query_settings(buffer_size=2), live=True, now=0.0)
    query = next_rows(machine, 0.0)
    assert query.limit == 2
    for seq_nr in (1, 2):
        machine.on_row(row("a", seq_nr, at(1)), at(60), 0.0)
    machine.on_rows_done(0.0)
    assert mode_of(machine) is Mode.NORMAL
    request = machine.next_request(0.0)
    while isinstance(request, HorizonQuery):
        answer(machine, request, Horizon(at(0)))
        request = machine.next_request(0.0)
    assert isinstance(request, BucketsQuery)
    # past the counts (none here), a burst is read a chunk's worth at a time
    burst = next_rows(machine, 0.0)
    assert burst.limit == 2 * CHUNK_BUFFERS
    machine.on_row(row("a", 3, at(2)), at(60), 0.0)
    machine.on_rows_done(0.0)  # not full: back to buffer_size
    assert next_rows(machine, 1.0).limit == 2


def test_transactions_read_past_that_ended_are_found_oldest_first() -> None:
    """The one rule the live query's tracker and Spark's offsets share: a transaction
    read past ends when a later reading no longer shows it (its backend may have started
    a new transaction meanwhile, which is another one)."""
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    earlier = {(7, t0 + timedelta(seconds=3)), (8, t0 + timedelta(seconds=1)), (9, t0)}
    open_now = read_past(
        [OpenTransaction(9, t0, True), OpenTransaction(8, t0 + timedelta(seconds=5), False)]
    )
    assert ended_since(earlier, open_now) == [t0 + timedelta(seconds=1), t0 + timedelta(seconds=3)]
    assert ended_since(earlier, frozenset(earlier)) == []
    assert ended_since((), open_now) == []

"""Retention's planner without a database: durations, policies, and the rule that an
event goes only when every projection holding its slice has consumed it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import InvalidArgument, InvalidSettings, SliceRange
from projections.retention import (
    Holder,
    ProjectionInfo,
    Registration,
    RetentionPolicy,
    SliceOutcome,
    deletable,
    parse_duration,
    plan_slice,
    summarize,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30s", timedelta(seconds=30)), ("15m", timedelta(minutes=15)),
     ("12h", timedelta(hours=12)), ("7d", timedelta(days=7))],
)  # fmt: skip
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "0s", "-1d", "1.5h", "7w", "7 d x", "1e3s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InvalidArgument, match="30s, 15m, 12h or 7d"):
        parse_duration(text)


def test_a_policy_needs_a_rule_and_valid_values() -> None:
    with pytest.raises(InvalidSettings, match="at least one rule"):
        RetentionPolicy("A")
    with pytest.raises(InvalidSettings):
        RetentionPolicy("A", keep_last=0)
    with pytest.raises(InvalidSettings):
        RetentionPolicy("A", keep=timedelta(0))
    policy = RetentionPolicy("A", keep="7d", keep_last=3, keep_snapshot=True)
    assert policy.keep == timedelta(days=7) and policy.cutoff(at(0)) == at(0) - timedelta(days=7)
    assert "the last 3 per id" in policy.describe()


def test_a_holder_without_offsets_blocks_the_slice_and_none_leaves_the_policy() -> None:
    policy = RetentionPolicy("A", keep="1s")
    blocked = plan_slice(policy, 3, at(100), [Holder("a", at(50)), Holder("b", None)], WINDOW)
    assert blocked.blocked and blocked.binding == Holder("b", None)
    free = plan_slice(policy, 3, at(100), [], WINDOW)
    assert (free.blocked, free.upper, free.checks) == (False, None, ())
    assert deletable(free, policy, seq_nr=1, timestamp=at(98), highest=1, snapshot_seq_nr=None,
                     consumed={})  # fmt: skip


def test_info_holds_its_entity_type_and_covers_its_slices() -> None:
    implicit = ProjectionInfo("p", Registration.IMPLICIT, None, ("A",), None, 3, at(0), False)
    assert implicit.holds("A") and not implicit.holds("B") and implicit.covers(1023)
    unknown = ProjectionInfo("q", Registration.IMPLICIT, None, (), None, 3, at(0), False)
    assert unknown.holds("B")
    explicit = ProjectionInfo(
        "r", Registration.EXPLICIT, "A", (), SliceRange(0, 511), 0, None, False
    )
    assert explicit.holds("A") and explicit.covers(511) and not explicit.covers(512)
    retired = ProjectionInfo("s", Registration.RETIRED, "A", ("A",), None, 3, at(0), True)
    assert not retired.holds("A") and not retired.covers(0)


holders_st = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, 200)),  # latest
        st.one_of(st.none(), st.integers(0, 200)),  # start marker
        st.one_of(st.none(), st.integers(1, 12)),  # highest seq_nr it stored of the id
    ),
    max_size=3,
)


@settings(max_examples=400, deadline=None)
@given(
    holders=holders_st,
    steps=st.lists(st.integers(1, 20), min_size=1, max_size=12),
    keep=st.one_of(st.none(), st.integers(1, 100)),
    keep_last=st.one_of(st.none(), st.integers(1, 5)),
    snapshot=st.one_of(st.none(), st.integers(0, 12)),
    now=st.integers(100, 260),
)
def test_an_event_goes_only_if_every_holder_consumed_it_and_deletion_is_downward_closed(
    holders: list[tuple[int | None, int | None, int | None]],
    steps: list[int],
    keep: int | None,
    keep_last: int | None,
    snapshot: int | None,
    now: int,
) -> None:
    if keep is None and keep_last is None:
        keep = 10
    policy = RetentionPolicy(
        "A", keep=keep, keep_last=keep_last, keep_snapshot=snapshot is not None
    )
    # One id's events: seq_nr 1..n, timestamps strictly increasing.
    times = [at(sum(steps[: i + 1])) for i in range(len(steps))]
    n = len(times)
    hs, consumed = [], {}
    for i, (latest, start, stored) in enumerate(holders):
        name = f"p{i}"
        hs.append(Holder(name, None if latest is None else at(latest),
                         None if start is None or latest is None or start > latest
                         else at(start)))  # fmt: skip
        if stored is not None and latest is not None and stored <= n:
            stored_ts = times[stored - 1]
            if stored_ts <= at(latest):  # a row is never newer than the slice's latest
                consumed[name] = (stored, stored_ts)
    plan = plan_slice(policy, 0, at(now), hs, WINDOW)
    verdicts = [
        deletable(plan, policy, seq_nr=s, timestamp=times[s - 1], highest=n,
                  snapshot_seq_nr=snapshot, consumed=consumed)
        for s in range(1, n + 1)
    ]  # fmt: skip
    # Downward closed: a batch may delete "seq_nr < target" and mark the target.
    assert verdicts == sorted(verdicts, reverse=True)
    for s, gone in enumerate(verdicts, start=1):
        if not gone:
            continue
        ts = times[s - 1]
        assert keep is None or ts < at(now) - timedelta(seconds=keep)
        assert keep_last is None or s <= n - keep_last
        assert snapshot is None or s <= snapshot
        for h in hs:  # every holder consumed it: a row at or above it, or handled before
            assert h.latest is not None and ts <= h.latest
            row = consumed.get(h.projection)
            by_row = row is not None and row[0] >= s
            by_time = ts < h.latest - WINDOW or (h.start is not None and ts < h.start)
            assert by_row or by_time


def test_reports_sum_per_range_and_name_what_holds() -> None:
    p = Holder("p", at(10), paused=True)
    outcomes = [
        SliceOutcome(0, 5, 2, p, False),
        SliceOutcome(1, 3, 0, Holder("q", at(5)), False),  # holds nothing back here
        SliceOutcome(600, 1, 0, Holder("r", None), True),
    ]
    low, high = summarize(outcomes, SliceRange.FULL.split(2))
    assert (low.events, low.held, low.held_by) == (8, 2, (p,))
    assert (high.events, [h.projection for h in high.held_by]) == (1, ["r"])

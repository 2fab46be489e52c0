"""The backlog's definition (projections/backlog.py) on its own: age from the oldest
waiting event to the database's now, 0 when nothing waits, the count's cap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from projections.backlog import Backlog, measure

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.timeout(5)
def test_nothing_waiting_is_zero_however_old_the_last_event() -> None:
    assert measure(NOW, None, 0) == Backlog(timedelta(0), 0, False, None, NOW)
    assert measure(NOW, None, 0).caught_up


@pytest.mark.timeout(5)
def test_age_is_that_of_the_oldest_waiting_event() -> None:
    oldest = NOW - timedelta(seconds=7.5)
    b = measure(NOW, oldest, 3)
    assert b.age == timedelta(seconds=7.5) and b.age_seconds == 7.5
    assert b.size == 3 and not b.capped and not b.caught_up
    assert b.oldest_unhandled == oldest


@pytest.mark.timeout(5)
def test_clock_skew_never_makes_a_negative_age() -> None:
    assert measure(NOW, NOW + timedelta(seconds=1), 1).age == timedelta(0)


@pytest.mark.timeout(5)
def test_the_count_at_its_cap_is_a_lower_bound() -> None:
    assert measure(NOW, NOW, 10, cap=10).capped
    assert not measure(NOW, NOW, 9, cap=10).capped

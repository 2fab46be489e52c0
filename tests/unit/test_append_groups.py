"""The group commit's decisions (`journal/append_groups.py`): who runs alone, who
waits, and what goes together in the next statement."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from journal import InvalidSettings, JournalSettings
from journal.append_groups import AppendGroups, Stage, Waiting, stored_in_group
from journal.serialization import SerializerRegistry
from journal.writer import prepare_append

pytestmark = pytest.mark.timeout(10)

REGISTRY = SerializerRegistry()


def waiting(pid: str, events: int = 1) -> Waiting:
    batch = prepare_append(REGISTRY, pid, [{"n": i} for i in range(events)], 0, (), None)
    return Waiting(batch, threading.Event())


def pids(group: list[Waiting]) -> list[str]:
    return [w.batch.persistence_id for w in group]


def test_appends_run_alone_up_to_the_limit_then_wait() -> None:
    groups = AppendGroups(statements=2, max_events=100, max_bytes=10**6)
    assert groups.try_run() and groups.try_run()
    assert not groups.try_run()
    assert groups.running == 2
    a, b = waiting("A|a"), waiting("A|b")
    assert not groups.queue(a, 0.0) and not groups.queue(b, 0.0)
    # the first statement to end takes everything waiting as one group, in its place
    assert groups.finish() == [a, b]
    assert groups.running == 2 and a.stage is b.stage is Stage.TAKEN
    assert groups.finish() == []
    assert groups.running == 1
    assert groups.finish() == []
    assert groups.running == 0


def test_a_statement_that_ended_meanwhile_lets_the_append_run_alone() -> None:
    groups = AppendGroups(statements=1, max_events=100, max_bytes=10**6)
    assert groups.try_run()
    assert not groups.try_run()
    assert groups.finish() == []  # ends between the caller's try_run and its queue
    assert groups.queue(waiting("A|a"), 0.0)  # runs alone: not queued
    assert groups.running == 1
    assert groups.finish() == []


def test_one_append_per_id_in_a_group_and_the_rest_keeps_its_place() -> None:
    groups = AppendGroups(statements=1, max_events=100, max_bytes=10**6)
    assert groups.try_run()
    first, second, other, third = waiting("A|x"), waiting("A|x"), waiting("A|y"), waiting("A|x")
    for w in (first, second, other, third):
        groups.queue(w, 0.0)
    assert groups.finish() == [first, other]
    assert groups.finish() == [second]
    assert groups.finish() == [third]
    assert groups.finish() == []
    assert groups.running == 0


def test_a_group_holds_at_most_max_events_but_always_one_append() -> None:
    groups = AppendGroups(statements=1, max_events=5, max_bytes=10**6)
    assert groups.try_run()
    big, a, b, c = waiting("A|big", 7), waiting("A|a", 2), waiting("A|b", 2), waiting("A|c", 2)
    for w in (big, a, b, c):
        groups.queue(w, 0.0)
    assert groups.finish() == [big]  # larger than a group, alone
    assert pids(groups.finish()) == ["A|a", "A|b"]
    assert pids(groups.finish()) == ["A|c"]


def test_an_append_can_be_withdrawn_until_it_is_sent() -> None:
    groups = AppendGroups(statements=1, max_events=100, max_bytes=10**6)
    assert groups.try_run()
    a, b, c = waiting("A|a"), waiting("A|b"), waiting("A|c")
    for w in (a, b, c):
        groups.queue(w, 0.0)
    assert groups.withdraw(a)  # queued: it leaves the queue
    group = groups.finish()
    assert group == [b, c]
    assert groups.withdraw(b)  # taken, not sent: the group goes without it
    assert groups.send(group) == [c]
    assert not groups.withdraw(c)  # sent: its outcome comes
    assert (a.stage, b.stage, c.stage) == (Stage.WITHDRAWN, Stage.WITHDRAWN, Stage.SENT)
    assert groups.finish() == []


def test_an_append_passed_over_for_size_is_not_passed_by_a_later_one_of_its_id() -> None:
    groups = AppendGroups(statements=1, max_events=5, max_bytes=10**6)
    assert groups.try_run()
    a, x_first, x_second = waiting("A|a", 4), waiting("A|x", 3), waiting("A|x", 1)
    for w in (a, x_first, x_second):
        groups.queue(w, 0.0)
    assert groups.finish() == [a]
    assert groups.finish() == [x_first]
    assert groups.finish() == [x_second]


def test_a_group_holds_at_most_max_bytes_of_payload() -> None:
    groups = AppendGroups(statements=1, max_events=100, max_bytes=20)
    assert groups.try_run()
    ws = [waiting(f"A|{i}") for i in range(6)]  # 7 bytes of JSON each: {"n":0}
    assert {w.payload_bytes for w in ws} == {7}
    for w in ws:
        groups.queue(w, 0.0)
    assert groups.finish() == ws[0:2]
    assert groups.finish() == ws[2:4]


def test_stored_in_group_maps_rows_to_appends() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert stored_in_group(3, [(3, at), (1, at)]) == [at, None, at]
    assert stored_in_group(2, []) == [None, None]


def test_appends_unsent_past_their_time_expire_oldest_first() -> None:
    groups = AppendGroups(statements=1, max_events=100, max_bytes=10**6)
    assert groups.try_run()
    a, b, c = waiting("A|a"), waiting("A|b"), waiting("A|c")
    groups.queue(a, 1.0)
    groups.queue(b, 2.0)
    assert groups.oldest_unsent() == 1.0
    group = groups.finish()  # taken, not sent: can still expire
    assert group == [a, b]
    groups.queue(c, 3.0)
    assert groups.expired(1.5) == [a]
    assert a.stage is Stage.WITHDRAWN
    assert groups.send(group) == [b]  # the group goes without it
    assert groups.oldest_unsent() == 3.0
    assert groups.expired(2.5) == []  # b is sent: it no longer expires
    assert groups.expired(3.0) == [c]
    assert groups.oldest_unsent() is None
    assert groups.finish() == []
    assert groups.running == 0


def test_append_statements_auto_groups_asyncio_appends_only() -> None:
    auto = JournalSettings()
    assert auto.append_statements == "auto"
    assert (auto.append_statements_for(True), auto.append_statements_for(False)) == (2, None)
    for value in (1, 5, None):
        chosen = JournalSettings(append_statements=value)
        assert chosen.append_statements_for(True) == chosen.append_statements_for(False) == value


@pytest.mark.parametrize("value", [0, -1, True, "2", "AUTO", 1.5])
def test_append_statements_must_be_a_positive_int_none_or_auto(value: object) -> None:
    with pytest.raises(InvalidSettings, match="append_statements"):
        JournalSettings(append_statements=value)  # type: ignore[arg-type]


def test_a_group_is_handed_to_the_caller_of_its_first_append_still_wanted() -> None:
    groups = AppendGroups(statements=1, max_events=100, max_bytes=10**6)
    assert groups.try_run()
    a, b, c, d = waiting("A|a"), waiting("A|b"), waiting("A|c"), waiting("A|d")
    for w in (a, b, c):
        groups.queue(w, 0.0)
    group = groups.finish()
    assert groups.withdraw(a)
    assert groups.hand_over(group) is b  # its role is set before anyone can see it sent
    assert (b.group, b.leads) == ([b, c], False)
    assert not groups.withdraw(b) and not groups.withdraw(c)
    groups.queue(d, 1.0)
    alone = groups.finish()
    assert groups.hand_over(alone) is d
    assert (d.group, d.leads) == (None, True)
    e = waiting("A|e")
    groups.queue(e, 2.0)
    gone = groups.finish()
    assert groups.withdraw(e)
    assert groups.hand_over(gone) is None
    assert groups.finish() == []
    assert groups.running == 0


def test_expired_appends_leave_the_queue_in_order() -> None:
    groups = AppendGroups(statements=1, max_events=100, max_bytes=10**6)
    assert groups.try_run()
    ws = [waiting(f"A|{i}") for i in range(5)]
    for i, w in enumerate(ws):
        groups.queue(w, float(10 - i))  # a clock read before another thread's: kept in order
    assert [w.queued_at for w in ws] == [10.0] * 5
    assert groups.expired(9.0) == []
    assert groups.expired(10.0) == ws
    assert groups.finish() == []

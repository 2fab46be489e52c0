"""The backlog (projections/backlog.py) read from a real journal and offset store: 0 on a
caught-up quiet projection however long it stays quiet, growing behind a stuck handler,
growing on a paused range only, and 0 on a range that never had an event.

Every reading goes through `ProjectionManagement` (what `slicejournal status` shows); the
waits are bounded polls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from journal import Journal, SliceRange, slice_for, slice_ranges
from journal.model import EventEnvelope
from projections import Projection, ProjectionManagement, ProjectionSettings
from projections.tables import ProjectionTables
from tests.support.projections import eventually

ENTITY = "Meter"
NAME = "meters"
ALL = SliceRange(0, 1023)
FAST = ProjectionSettings(
    management_poll_interval=timedelta(milliseconds=100),
    progress_interval=timedelta(milliseconds=200),
    group_after_duration=timedelta(milliseconds=50),
)


def pids_in(slices: SliceRange, count: int) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < count:
        pid = f"{ENTITY}|m-{i}"
        if slice_for(pid) in slices:
            out.append(pid)
        i += 1
    return out


async def write(j: Journal, pids: list[str], events: int = 1) -> int:
    for pid in pids:
        seq = await j.highest_seq_nr(pid)
        await j.append(pid, [{"n": seq + k} for k in range(events)], expected_seq_nr=seq)
    return len(pids) * events


class Counting:
    """An exactly-once handler that counts, and blocks while `gate` is clear."""

    def __init__(self) -> None:
        self.seen = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.blocked = asyncio.Event()

    async def __call__(self, conn: Any, env: EventEnvelope) -> None:
        if not self.gate.is_set():
            self.blocked.set()
            await self.gate.wait()
        self.seen += 1


@contextlib.asynccontextmanager
async def running(p: Projection) -> AsyncIterator[asyncio.Task[Any]]:
    task = asyncio.create_task(p.run())
    try:
        yield task
    finally:
        await p.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)


def projection(j: Journal, handler: Counting, r: SliceRange = ALL) -> Projection:
    return Projection.exactly_once(
        j, name=NAME, entity_type=ENTITY, slice_range=r, handler=handler, settings=FAST
    )


@pytest.mark.timeout(60)
async def test_a_caught_up_projection_on_a_quiet_journal_has_no_backlog(journal: Journal) -> None:
    j = journal
    mgmt = ProjectionManagement(j)
    total = await write(j, pids_in(ALL, 20), 3)
    handler = Counting()
    async with running(projection(j, handler)):
        await eventually(lambda: handler.seen == total, "all events handled")

        async def caught_up() -> bool:
            return (await mgmt.backlog(NAME, ENTITY, ALL)).size == 0

        await eventually(caught_up, "offsets of every event stored")
        # Quiet from here: the age must stay 0 (the old "lag" grew by the second).
        for _ in range(8):
            await asyncio.sleep(0.25)
            for status in await mgmt.status(NAME, ENTITY, ranges=4):
                assert status.backlog is not None
                assert status.backlog.age == timedelta(0), status
                assert status.backlog.size == 0 and status.backlog.caught_up
    # Stopped, still quiet: nothing waits, so still 0.
    await asyncio.sleep(0.5)
    backlog = await mgmt.backlog(NAME, ENTITY, ALL)
    assert backlog.age == timedelta(0) and backlog.size == 0


@pytest.mark.timeout(60)
async def test_a_stuck_handler_makes_the_backlog_grow(journal: Journal) -> None:
    j = journal
    mgmt = ProjectionManagement(j)
    pids = pids_in(ALL, 5)
    handled = await write(j, pids)
    handler = Counting()
    async with running(projection(j, handler)):
        await eventually(lambda: handler.seen == handled, "first events handled")

        async def caught_up() -> bool:
            return (await mgmt.backlog(NAME, ENTITY, ALL)).size == 0

        await eventually(caught_up, "caught up")
        handler.gate.clear()
        waiting = await write(j, pids, 2)
        await asyncio.wait_for(handler.blocked.wait(), 10)
        first = await mgmt.backlog(NAME, ENTITY, ALL)
        assert first.size == waiting, first
        await asyncio.sleep(1.0)
        second = await mgmt.backlog(NAME, ENTITY, ALL)
        assert second.size == waiting
        assert second.oldest_unhandled == first.oldest_unhandled
        assert second.age >= first.age + timedelta(seconds=0.9), (first, second)
        assert second.age >= timedelta(seconds=1)
        handler.gate.set()
        await eventually(lambda: handler.seen == handled + waiting, "unblocked")

        async def drained() -> bool:
            b = await mgmt.backlog(NAME, ENTITY, ALL)
            return b.size == 0 and b.age == timedelta(0)

        await eventually(drained, "backlog back to 0 once the handler moves on")


@pytest.mark.timeout(60)
async def test_a_paused_range_accumulates_a_backlog_the_others_do_not(journal: Journal) -> None:
    j = journal
    mgmt = ProjectionManagement(j)
    lower, upper = slice_ranges(2)
    handlers = [Counting(), Counting()]
    first = await write(j, pids_in(ALL, 10))
    async with (
        running(projection(j, handlers[0], lower)),
        running(projection(j, handlers[1], upper)),
    ):
        await eventually(lambda: sum(h.seen for h in handlers) == first, "first events")
        await mgmt.pause(NAME, upper)
        await asyncio.sleep(0.5)  # > management_poll_interval: the instance saw the pause
        before = handlers[0].seen
        in_upper = await write(j, pids_in(upper, 4))
        in_lower = await write(j, pids_in(lower, 4))

        async def lower_caught_up() -> bool:
            [low] = await mgmt.status(NAME, ENTITY, ranges=[lower])
            return low.backlog is not None and low.backlog.size == 0

        await eventually(lower_caught_up, "lower range caught up")
        assert handlers[0].seen == before + in_lower
        low, up = await mgmt.status(NAME, ENTITY, ranges=[lower, upper])
        assert not low.paused and up.paused
        assert up.backlog is not None and up.backlog.size == in_upper
        await asyncio.sleep(0.5)
        [later] = await mgmt.status(NAME, ENTITY, ranges=[upper])
        assert later.backlog is not None and up.backlog is not None
        assert later.backlog.age > up.backlog.age > timedelta(0)
        await mgmt.resume(NAME, upper)

        async def upper_drained() -> bool:
            [u] = await mgmt.status(NAME, ENTITY, ranges=[upper])
            return u.backlog is not None and u.backlog.size == 0

        await eventually(upper_drained, "upper range drained after resume")


@pytest.mark.timeout(60)
async def test_a_range_without_events_has_no_backlog_and_one_never_handled_has_all(
    journal: Journal,
) -> None:
    j = journal
    mgmt = ProjectionManagement(j)
    lower, upper = slice_ranges(2)
    written = await write(j, pids_in(lower, 6), 2)
    await mgmt.resume(NAME)  # known to management, never ran: no offsets at all
    low, up = await mgmt.status(NAME, ENTITY, ranges=[lower, upper])
    # Nothing ever handled: every event of the range waits, the oldest since it was written.
    assert low.backlog is not None and low.backlog.size == written
    assert low.backlog.age > timedelta(0) and low.backlog.oldest_unhandled is not None
    # No event ever in the range: nothing waits, whatever the offsets.
    assert up.backlog is not None
    assert up.backlog.size == 0 and up.backlog.age == timedelta(0)
    assert up.backlog.oldest_unhandled is None
    # Another entity type has no events at all.
    other = await mgmt.backlog(NAME, "Other", ALL)
    assert other.size == 0 and other.age == timedelta(0)
    # The count stops at its cap and says so.
    from projections.aio.offset_dao import read_backlog
    from projections.management_sql import ManagementSql

    async with j.pool.connection() as conn:
        capped = await read_backlog(
            conn, ManagementSql(ProjectionTables(j.tables)), NAME, ENTITY, lower, cap=5
        )
    assert capped.size == 5 and capped.capped

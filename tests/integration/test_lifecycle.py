"""Projection lifecycle on a real PostgreSQL: stops are never lost, failures are never
silent, and every lifecycle event is logged under `slicejournal.projections`."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from journal import Journal, SliceRange
from projections import (
    Projection,
    ProjectionError,
    ProjectionGroup,
    ProjectionManagement,
    RecoveryStrategy,
)
from tests.support import bank
from tests.support.projections import FAST, eventually, whole_range

LOGGER = "slicejournal.projections"


def group_of(j: Journal, handler: Any, n: int = 4, **options: Any) -> ProjectionGroup:
    return ProjectionGroup(
        lambda r: Projection.exactly_once(
            j, name="balances", entity_type=bank.ENTITY, slice_range=r, handler=handler,
            settings=FAST, **options,
        ),
        n,
    )  # fmt: skip


@pytest.mark.timeout(30)
async def test_start_then_stop_at_once_returns(bank_journal: Journal) -> None:
    group = group_of(bank_journal, bank.make_handler(bank_journal))
    await group.start()
    await asyncio.wait_for(group.stop(), 10)
    assert group.projections == []
    # And again, through `async with`, with nothing in between.
    async with group:
        pass


@pytest.mark.timeout(30)
async def test_a_stop_before_the_first_run_is_kept(bank_journal: Journal) -> None:
    p = whole_range(Projection.exactly_once, bank_journal, bank.make_handler(bank_journal))
    await p.stop()
    await asyncio.wait_for(p.run(), 10)
    assert not p.running
    # The stop was consumed: the instance can run again, and stops again.
    task = asyncio.create_task(p.run())
    await asyncio.sleep(0.3)
    assert p.running
    await p.stop()
    await asyncio.wait_for(task, 10)


@pytest.mark.timeout(60)
async def test_a_failing_instance_is_raised_from_async_with(
    bank_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = bank_journal
    await j.append(bank.account(1), [{"amount": 1}], expected_seq_nr=0)

    async def broken(conn: Any, env: Any) -> None:
        raise ValueError("cannot handle this")

    caplog.set_level(logging.INFO, logger=LOGGER)
    group = group_of(j, broken, recovery=RecoveryStrategy.retry_and_fail(1, 0.01))
    with pytest.raises(ProjectionError, match="cannot handle this"):
        async with group:
            await eventually(lambda: group.failed() is not None, "an instance failed")
    failed = [r for r in caplog.records if r.levelno == logging.ERROR and "failed" in r.message]
    assert failed, caplog.text
    # Names the projection, its range and the error.
    assert "balances" in failed[0].message
    assert any(str(r) in failed[0].message for r in ("0-255", "256-511", "512-767", "768-1023"))
    assert "cannot handle this" in failed[0].message
    assert failed[0].name.startswith(LOGGER)


@pytest.mark.timeout(30)
async def test_an_error_in_the_block_wins_over_stopping(bank_journal: Journal) -> None:
    group = group_of(bank_journal, bank.make_handler(bank_journal))
    with pytest.raises(KeyError):
        async with group:
            raise KeyError("mine")
    assert group.projections == []


@pytest.mark.timeout(60)
async def test_lifecycle_events_are_logged(
    bank_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = bank_journal
    caplog.set_level(logging.INFO, logger=LOGGER)
    pid = bank.account(7)
    await j.append(pid, [{"amount": 1}, {"amount": 2}, {"amount": 3}], expected_seq_nr=0)
    inner = bank.make_handler(j)
    attempts = 0

    async def flaky(conn: Any, env: Any) -> None:
        nonlocal attempts
        if env.seq_nr == 3:
            raise ValueError("poison")
        attempts += 1
        if attempts == 1:
            raise RuntimeError("transient")
        await inner(conn, env)

    group = group_of(j, flaky, 2, recovery=RecoveryStrategy.retry_and_skip(2, 0.01))
    mgmt = ProjectionManagement(j)
    async with group:
        await eventually(lambda: sum(s.skipped for s in group.stats()) >= 1, "a skip")
        await mgmt.pause("balances")
        await asyncio.sleep(0.6)
        await mgmt.resume("balances")
        await asyncio.sleep(0.6)
        await group.rescale(4)
    text = "\n".join(r.message for r in caplog.records if r.name.startswith(LOGGER))
    for expected in (
        "started",
        "stopped",
        "paused",
        "resumed",
        "rescaled from 2 to 4",
        "(attempt 1 of",  # a retry
        "skipped 1 envelope",
    ):
        assert expected in text, f"{expected!r} not logged:\n{text}"


@pytest.mark.timeout(60)
async def test_a_filled_gap_is_logged(
    bank_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = bank_journal
    caplog.set_level(logging.INFO, logger=LOGGER)
    pid = bank.account(3)
    await j.append(pid, [{"amount": 1}], expected_seq_nr=0)
    inner = bank.make_handler(j)
    p = whole_range(Projection.exactly_once, j, inner)
    # Start the range just after seq_nr 1 was written: seq_nr 2 arrives with 1 unseen.
    first = await j.load_envelope(pid, 1)
    assert first is not None
    after_first = first.db_timestamp + timedelta(microseconds=1)
    await ProjectionManagement(j).set_offset("balances", after_first, SliceRange(0, 1023))
    await j.append(pid, [{"amount": 2}], expected_seq_nr=1)
    task = asyncio.create_task(p.run())
    try:
        await eventually(lambda: p.stats.accepted >= 1, "an event accepted")
    finally:
        await p.stop()
        await task
    text = "\n".join(r.message for r in caplog.records if r.name.startswith(LOGGER))
    assert "gap before" in text, text

"""The generated sync runners do what the async ones do, on a real PostgreSQL and
without an event loop in their threads: grouped and at-least-once delivery, retry
and dead letters, pause/resume, a thread group rescaled under concurrent writers
(some holding their transactions open), and a range handed between a sync group,
an async group and back through the shared offset store — every event applied
exactly once (the `applied` table has a row per application)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from psycopg import Connection

from journal import EventEnvelope, Journal, SliceRange, SyncJournal
from projections import (
    Projection,
    ProjectionGroup,
    RecoveryStrategy,
    SyncProjection,
    SyncProjectionGroup,
    SyncProjectionManagement,
)
from tests.support import bank
from tests.support.projections import FAST, journal_settings, sync_handler

NAME = "balances"


def grouped(handler: Any) -> Any:
    def apply(conn: Connection[Any], envs: list[EventEnvelope]) -> None:
        for env in envs:
            handler(conn, env)

    return apply


def sync_journal(j: Journal) -> SyncJournal:
    sj = SyncJournal(j.dsn, journal_settings(j.settings.schema), j.serializers)
    sj.open()
    return sj


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_sync_group_rescaled_under_writers_applies_every_event_once(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    sj = await asyncio.to_thread(sync_journal, j)
    handler = grouped(sync_handler(sj.settings))

    def instance(r: SliceRange) -> SyncProjection:
        return SyncProjection.grouped(
            sj, name=NAME, entity_type=bank.ENTITY, slice_range=r, handler=handler, settings=FAST
        )

    group = SyncProjectionGroup(instance, instances=4)
    writers = bank.Writers(j, 150, late_fraction=0.05, seed=7)
    try:
        await asyncio.to_thread(group.start)
        assert {t.name for t in threading.enumerate()} >= {f"projection {r}" for r in ("0-255",)}
        writers.start(writers=4)
        for instances in (8, 2, 4):
            await asyncio.sleep(1.5)
            await asyncio.to_thread(group.rescale, instances)
            assert len(group.projections) == instances
        await writers.stop()
        await bank.assert_applied_exactly_once(j)
        await asyncio.to_thread(group.stop)
    finally:
        await asyncio.to_thread(group.stop)
        await asyncio.to_thread(sj.close)
    accepted = sum(s.accepted for s in group.stats())
    assert accepted == await bank.journal_count(j)


@pytest.mark.timeout(120)
async def test_retry_and_skip_dead_letters_only_the_failing_envelope(bank_journal: Journal) -> None:
    j = bank_journal
    poisoned = bank.account(3)
    for i in range(6):
        await j.append(bank.account(i), [{"amount": 10}, {"amount": 1}], expected_seq_nr=0)
    sj = await asyncio.to_thread(sync_journal, j)
    apply = sync_handler(sj.settings)
    calls: list[str] = []

    def handler(conn: Connection[Any], env: EventEnvelope) -> None:
        calls.append(env.persistence_id)
        if env.persistence_id == poisoned and env.seq_nr == 2:
            raise ValueError("poison")
        apply(conn, env)

    def run() -> Any:
        return SyncProjection.exactly_once(
            sj, name=NAME, entity_type=bank.ENTITY, slice_range=SliceRange.FULL,
            handler=handler, settings=FAST, recovery=RecoveryStrategy.retry_and_skip(2, 0.01),
        ).run(until_caught_up=True)  # fmt: skip

    try:
        stats = await asyncio.to_thread(run)
        letters = await asyncio.to_thread(SyncProjectionManagement(sj).dead_letters, NAME)
    finally:
        await asyncio.to_thread(sj.close)
    assert calls.count(poisoned) == 1 + 3  # seq_nr 1 once, seq_nr 2 three times
    assert [(d.persistence_id, d.seq_nr) for d in letters] == [(poisoned, 2)]
    assert "ValueError: poison" in letters[0].error
    assert (stats.accepted, stats.skipped, stats.retries) == (12, 1, 2)
    balances, applied, distinct = await bank.projected(j)
    assert (applied, distinct) == (11, 11)
    assert balances[poisoned] == 10 and balances[bank.account(0)] == 11


@pytest.mark.timeout(120)
async def test_at_least_once_and_pause_resume_without_an_event_loop(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    for i in range(10):
        await j.append(bank.account(i), [{"amount": 5}], expected_seq_nr=0)
    sj = await asyncio.to_thread(sync_journal, j)
    seen: list[tuple[str, int]] = []
    management = SyncProjectionManagement(sj)

    def handler(env: EventEnvelope) -> None:
        seen.append((env.persistence_id, env.seq_nr))

    projection = SyncProjection.at_least_once(
        sj, name="seen", entity_type=bank.ENTITY, slice_range=SliceRange.FULL,
        handler=handler, settings=FAST,
    )  # fmt: skip
    thread = threading.Thread(target=projection.run, daemon=True)
    try:
        thread.start()
        await _eventually(lambda: len(set(seen)) == 10)
        await asyncio.to_thread(management.pause, "seen")
        await asyncio.sleep(0.6)  # > FAST.management_poll_interval: the instance saw it
        for i in range(10, 15):
            await j.append(bank.account(i), [{"amount": 5}], expected_seq_nr=0)
        await asyncio.sleep(1.0)
        assert len(set(seen)) == 10, "a paused instance handled events"
        await asyncio.to_thread(management.resume, "seen")
        await _eventually(lambda: len(set(seen)) == 15)
    finally:
        projection.stop()
        await asyncio.to_thread(thread.join, 30)
        await asyncio.to_thread(sj.close)
    assert not thread.is_alive()
    assert {pid for pid, _ in seen} == {bank.account(i) for i in range(15)}


@pytest.mark.timeout(180)
async def test_a_range_moves_between_sync_and_async_groups_exactly_once(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    sj = await asyncio.to_thread(sync_journal, j)
    sync_apply = grouped(sync_handler(sj.settings))
    writers = bank.Writers(j, 80, late_fraction=0.0, seed=11)

    def sync_instance(r: SliceRange) -> SyncProjection:
        return SyncProjection.grouped(
            sj, name=NAME, entity_type=bank.ENTITY, slice_range=r, handler=sync_apply,
            settings=FAST,
        )  # fmt: skip

    def async_instance(r: SliceRange) -> Projection:
        return Projection.grouped(
            j, name=NAME, entity_type=bank.ENTITY, slice_range=r,
            handler=bank.make_grouped_handler(j), settings=FAST,
        )  # fmt: skip

    try:
        writers.start(writers=3)
        for _ in range(2):
            sync_group = SyncProjectionGroup(sync_instance, instances=2)
            await asyncio.to_thread(sync_group.start)
            await asyncio.sleep(1.5)
            await asyncio.to_thread(sync_group.stop)
            async with ProjectionGroup(async_instance, instances=8):
                await asyncio.sleep(1.5)
        await writers.stop()
        async with ProjectionGroup(async_instance, instances=4):
            await bank.assert_applied_exactly_once(j)
    finally:
        await writers.stop()
        await asyncio.to_thread(sj.close)


async def _eventually(check: Any, within: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)

"""The telemetry hook (projections/telemetry.py) receives what each runner does, on a real
PostgreSQL: the async and the sync runner (batches, offsets, retries, dead letters,
duplicates, backlog samples, start and stop), the writer (appends, conflicts) and the
fleet worker (leases claimed and released). A `RecordingTelemetry` keeps the calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from journal import ConcurrencyError, Journal, SliceRange, SyncJournal
from journal.model import EventEnvelope
from journal.telemetry import use_telemetry
from projections import (
    FleetWorker,
    Projection,
    ProjectionSettings,
    RecoveryStrategy,
    SyncProjection,
    WorkerSettings,
)
from projections.backlog import Backlog
from projections.telemetry import RecordingTelemetry
from tests.support.projections import eventually

ENTITY = "Meter"
ALL = SliceRange(0, 1023)
SETTINGS = ProjectionSettings(
    management_poll_interval=timedelta(milliseconds=100),
    progress_interval=timedelta(milliseconds=200),
    group_after_duration=timedelta(milliseconds=50),
    backlog_sample_interval=timedelta(milliseconds=100),
)


@contextlib.contextmanager
def installed(telemetry: RecordingTelemetry) -> Iterator[RecordingTelemetry]:
    use_telemetry(telemetry)
    try:
        yield telemetry
    finally:
        use_telemetry(None)


async def write(j: Journal, count: int, prefix: str = "m") -> None:
    for i in range(count):
        await j.append(f"{ENTITY}|{prefix}-{i}", [{"n": i}], expected_seq_nr=0)


class Flaky:
    """Fails on its first call for each of `poison` seq-1 pids; always on `dead`."""

    def __init__(self, dead: str) -> None:
        self.dead = dead
        self.failed_once: set[str] = set()
        self.seen = 0

    def check(self, env: EventEnvelope) -> None:
        pid = env.persistence_id
        if pid == self.dead:
            raise ValueError("poison")
        if pid.endswith("-1") and pid not in self.failed_once:
            self.failed_once.add(pid)
            raise ValueError("once")
        self.seen += 1


def assert_runner_calls(t: RecordingTelemetry, name: str, runner: str, handled: int) -> None:
    [instance] = t.named("instance", name)
    assert instance.args == (runner,) and instance.slice_range == "0-1023"
    assert [c.args for c in t.named("started", name)] == [()]
    ended = t.named("batch_ended", name)
    assert len(t.named("batch_started", name)) == len(ended)
    assert sum(c.args[0] for c in ended) == handled + 1  # + the dead-lettered one
    assert all(c.args[1] is None for c in ended)
    # "m-1" failed once and was retried; the poison pid twice, then dead-lettered.
    errors = [c.args for c in t.named("handler_error", name)]
    assert errors.count(("ValueError", 1, True)) == 2, errors
    assert ("ValueError", 2, False) in errors
    assert t.total("dead_lettered", name) == 1
    assert t.total("offsets_stored", name) >= handled + 1
    samples = [c.args[0] for c in t.named("backlog_sampled", name)]
    assert samples and all(isinstance(b, Backlog) for b in samples)
    assert samples[-1].size == 0 and samples[-1].age == timedelta(0)
    assert [c.args for c in t.named("stopped", name)] == [(None,)]


@pytest.mark.timeout(60)
async def test_the_async_runner_reports_to_the_process_telemetry(journal: Journal) -> None:
    j = journal
    handler = Flaky(dead=f"{ENTITY}|m-4")

    async def handle(conn: Any, env: EventEnvelope) -> None:
        handler.check(env)

    with installed(RecordingTelemetry(samples_backlog=True)) as t:
        await write(j, 10)
        appends = t.named("append")
        assert [c.args for c in appends] == [(ENTITY, 1, "ok")] * 10
        with pytest.raises(ConcurrencyError):
            await j.append(f"{ENTITY}|m-0", [{"n": 0}], expected_seq_nr=0)
        assert t.named("append")[-1].args == (ENTITY, 1, "conflict")

        p = Projection.exactly_once(
            j, name="meters", entity_type=ENTITY, slice_range=ALL, handler=handle,
            settings=SETTINGS, recovery=RecoveryStrategy.retry_and_skip(1, 0.01),
        )  # fmt: skip
        task = asyncio.create_task(p.run())
        await eventually(lambda: handler.seen == 9, "9 events handled, 1 dead-lettered")

        def sampled_caught_up() -> bool:
            samples = t.named("backlog_sampled", "meters")
            return bool(samples) and samples[-1].args[0].size == 0

        await eventually(sampled_caught_up, "a backlog sample of 0")
        await p.stop()
        await asyncio.wait_for(task, 10)
    assert_runner_calls(t, "meters", "async", 9)
    assert t.total("duplicates", "meters") == p.stats.duplicates


@pytest.mark.timeout(60)
async def test_the_sync_runner_reports_to_its_own_telemetry(journal: Journal, pg_dsn: str) -> None:
    await write(journal, 10)
    t = RecordingTelemetry(samples_backlog=True)
    handler = Flaky(dead=f"{ENTITY}|m-4")

    def run() -> None:
        with SyncJournal.connect(pg_dsn, journal.settings) as sj:
            p = SyncProjection.exactly_once(
                sj, name="meters", entity_type=ENTITY, slice_range=ALL,
                handler=lambda conn, env: handler.check(env), settings=SETTINGS,
                recovery=RecoveryStrategy.retry_and_skip(1, 0.01), telemetry=t,
            )  # fmt: skip
            p.run(until_caught_up=True)

    await asyncio.to_thread(run)
    assert handler.seen == 9
    # Until caught up: it may end before a sample reads 0; every sample is a Backlog.
    [instance] = t.named("instance", "meters")
    assert instance.args == ("sync",)
    assert sum(c.args[0] for c in t.named("batch_ended", "meters")) == 10
    assert t.total("dead_lettered", "meters") == 1
    assert t.total("offsets_stored", "meters") >= 10
    assert [c.args for c in t.named("stopped", "meters")] == [(None,)]
    # Nothing of it went to the process's (no-op) telemetry, and no appends were recorded.
    assert t.named("append") == []


@pytest.mark.timeout(60)
async def test_a_runner_with_telemetry_off_reports_nothing(journal: Journal) -> None:
    await write(journal, 3)
    t = RecordingTelemetry()
    p = Projection.exactly_once(
        journal, name="meters", entity_type=ENTITY, slice_range=ALL,
        handler=_ignore, settings=SETTINGS,
    )  # fmt: skip
    await p.run(until_caught_up=True)
    assert p.stats.accepted == 3
    assert t.calls == []


async def _ignore(conn: Any, env: EventEnvelope) -> None:
    return None


def meters(journal: Journal, slice_range: SliceRange) -> Projection:
    return Projection.exactly_once(
        journal, name="meters", entity_type=ENTITY, slice_range=slice_range,
        handler=_ignore, settings=SETTINGS,
    )  # fmt: skip


@pytest.mark.timeout(60)
async def test_the_fleet_worker_reports_leases_and_its_instances(journal: Journal) -> None:
    await write(journal, 20)
    with installed(RecordingTelemetry()) as t:
        worker = FleetWorker(
            journal, meters, WorkerSettings(worker_id="w1", instances=2, lease_ttl=2.0)
        )
        task = asyncio.create_task(worker.run())

        def both_handled() -> bool:
            return len(t.named("stopped")) == 0 and len(t.named("started")) == 2

        await eventually(both_handled, "two instances started")
        await eventually(
            lambda: t.total("offsets_stored", "meters") >= 20, "every event's offset stored"
        )
        worker.stop()
        await asyncio.wait_for(task, 20)
    claimed = t.named("lease_claimed", "meters")
    assert sorted(c.slice_range for c in claimed) == ["0-511", "512-1023"]
    assert all(c.args[0] == "w1" and c.args[1] >= 1 for c in claimed)
    released = t.named("lease_released", "meters")
    assert sorted(c.slice_range for c in released) == ["0-511", "512-1023"]
    assert sorted(c.slice_range for c in t.named("instance", "meters")) == ["0-511", "512-1023"]
    assert [c.args for c in t.named("stopped", "meters")] == [(None,), (None,)]

"""Projections on Spark: exactly once through late commits, a killed worker, restarts,
and a handoff to the in-process runner and back (real local Spark, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import tempfile
from typing import Any

import pytest

from journal import Journal
from journal.slices import SliceRange
from projections import Projection, RecordingTelemetry
from projections.spark import ProjectionBusy, project
from tests.support import bank
from tests.support.spark import bank_handler, dying_handler

NAME = "balances"


def _project(spark: Any, j: Journal, checkpoint: str, handler: Any, **kw: Any) -> Any:
    return project(
        spark,
        dsn=j.dsn,
        name=NAME,
        entity_type=bank.ENTITY,
        handler=handler,
        checkpoint_location=checkpoint,
        settings=j.settings,
        **kw,
    )


async def _stop(query: Any) -> None:
    await asyncio.to_thread(query.stop)


@pytest.mark.timeout(400)
async def test_late_commits_kill_and_restarts_exactly_once(spark: Any, journal: Journal) -> None:
    await bank.create_read_model(journal)
    schema = journal.settings.schema
    workdir = tempfile.mkdtemp(prefix="sj-spark-")
    checkpoint = os.path.join(workdir, "ckpt")
    marker = os.path.join(workdir, "die")
    writers = bank.Writers(journal, accounts=200, late_fraction=0.1)
    writers.start(writers=4)
    try:
        # 1. Live with late commits (10 % of transactions held open 1-5 s).
        query = await asyncio.to_thread(
            _project, spark, journal, checkpoint, dying_handler(schema, marker),
            trigger={"processingTime": "1 second"},
        )  # fmt: skip
        await asyncio.sleep(12)
        # 2. The Python worker is SIGKILLed mid-transaction: the query fails.
        await asyncio.to_thread(pathlib.Path(marker).touch)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(query.awaitTermination, 60)
        assert not query.isActive and query.exception() is not None
        assert not await asyncio.to_thread(os.path.exists, marker)
        # 3. Restart from the checkpoint.
        query = await asyncio.to_thread(
            _project, spark, journal, checkpoint, bank_handler(schema),
            trigger={"processingTime": "1 second"},
        )  # fmt: skip
        await asyncio.sleep(8)
        await _stop(query)
        # 4. Once without a checkpoint: the offset store says where to resume.
        query = await asyncio.to_thread(
            _project, spark, journal, os.path.join(workdir, "fresh"), bank_handler(schema),
            trigger={"processingTime": "1 second"}, max_events_per_trigger=500,
        )  # fmt: skip
        await asyncio.sleep(6)
    finally:
        await writers.stop()
    try:
        await bank.assert_applied_exactly_once(journal, within=90)
        assert writers.late > 0
    finally:
        await _stop(query)


@pytest.mark.timeout(400)
async def test_handoff_to_in_process_runner_and_back(spark: Any, journal: Journal) -> None:
    await bank.create_read_model(journal)
    schema = journal.settings.schema
    workdir = tempfile.mkdtemp(prefix="sj-spark-")
    # 50k events, 100 per account.
    for i in range(500):
        events = [{"amount": (i + k) % 97 - 40} for k in range(100)]
        await journal.append(bank.account(i), events, expected_seq_nr=0)
    # Backfill on Spark; availableNow stops by itself.
    query = await asyncio.to_thread(
        _project, spark, journal, os.path.join(workdir, "a"), bank_handler(schema),
        trigger={"availableNow": True},
    )  # fmt: skip
    await asyncio.to_thread(query.awaitTermination, 200)
    assert query.exception() is None
    _, applied, _ = await bank.projected(journal)
    assert applied == 50_000

    # The in-process runner continues while writers run.
    writers = bank.Writers(journal, accounts=500, late_fraction=0.1, seed=2)
    writers.seq = {p: 100 for p in writers.pids}
    writers.start(writers=4)
    live = Projection.grouped(
        journal, name=NAME, entity_type=bank.ENTITY, slice_range=SliceRange(0, 1023),
        handler=bank.make_grouped_handler(journal),
    )  # fmt: skip
    task = asyncio.create_task(live.run())
    await asyncio.sleep(8)
    # While it runs unleased, Spark may not start over it... the fleet's leases are what
    # exclude; an in-process runner is the operator's to stop. Stop it, then hand back.
    await live.stop()
    await task
    stats = live.stats
    assert stats.accepted > 0

    # And back to Spark (a fresh checkpoint: the offset store decides), writers still on.
    query = await asyncio.to_thread(
        _project, spark, journal, os.path.join(workdir, "b"), bank_handler(schema),
        trigger={"processingTime": "1 second"},
    )  # fmt: skip
    try:
        await asyncio.sleep(6)
        with pytest.raises(ProjectionBusy):  # one owner at a time
            await asyncio.to_thread(
                _project, spark, journal, os.path.join(workdir, "c"), bank_handler(schema)
            )
        await writers.stop()
        await bank.assert_applied_exactly_once(journal, within=90)
    finally:
        await writers.stop()
        await _stop(query)


@pytest.mark.timeout(300)
async def test_a_spark_run_reports_its_batches_and_backlog_from_the_driver(
    spark: Any, journal: Journal
) -> None:
    """The telemetry hook of the application's process sees a Spark projection like any
    other runner: started, each micro-batch with its input rows, backlog samples per
    partition range, stopped."""
    await bank.create_read_model(journal)
    for i in range(40):
        await journal.append(bank.account(i), [{"amount": 1}], expected_seq_nr=0)
    t = RecordingTelemetry(samples_backlog=True)
    checkpoint = os.path.join(tempfile.mkdtemp(prefix="sj-spark-"), "ckpt")
    query = await asyncio.to_thread(
        _project, spark, journal, checkpoint, bank_handler(journal.settings.schema),
        trigger={"processingTime": "1 second"}, telemetry=t, num_partitions=2,
    )  # fmt: skip
    try:
        await bank.wait_until_projected(journal)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while sum(c.args[0] for c in t.named("batch_ended", NAME)) < 40 or not any(
            c.args[0].size == 0 for c in t.named("backlog_sampled", NAME)
        ):
            assert loop.time() < deadline, t.calls
            await asyncio.sleep(0.5)
    finally:
        await _stop(query)
    deadline = asyncio.get_running_loop().time() + 30
    while not t.named("stopped", NAME):
        assert asyncio.get_running_loop().time() < deadline, "no stopped() after the query ended"
        await asyncio.sleep(0.2)
    assert [c.slice_range for c in t.named("started", NAME)] == ["0-1023"]
    assert {c.slice_range for c in t.named("backlog_sampled", NAME)} == {"0-511", "512-1023"}

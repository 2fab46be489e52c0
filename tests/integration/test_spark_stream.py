"""Projections on Spark: exactly once through late commits, a killed worker, restarts,
and a handoff to the in-process runner and back (real local Spark, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

import pytest
from psycopg import sql

from journal import EventFilter, Journal
from journal.slices import SliceRange
from projections import FleetControl, Projection, ProjectionManagement, RecordingTelemetry
from projections.spark import ProjectionBusy, project
from tests.support import bank
from tests.support.long_transactions import HeldTransaction, horizon_settings, short_writes
from tests.support.projections import eventually
from tests.support.spark import bank_handler, dying_handler, recording_handler

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


async def _wait_batches(query: Any, count: int, within: float = 120) -> None:
    """Wait until the query has completed `count` micro-batches."""
    await eventually(
        lambda: (query.lastProgress or {}).get("batchId", -1) >= count - 1,
        f"{count} batches", within, interval=0.5,
    )  # fmt: skip


def _latest_offset(checkpoint: str) -> dict[str, Any] | None:
    """The newest offset Spark logged for our source (its last line is the source's)."""
    logged = [p for p in pathlib.Path(checkpoint, "offsets").glob("*") if p.name.isdigit()]
    if not logged:
        return None
    newest = max(logged, key=lambda p: int(p.name))
    return dict(json.loads(newest.read_text().splitlines()[-1]))


async def _wait_pending(checkpoint: str, count: int, within: float) -> None:
    """Wait until the stream's newest offset holds `count` pending transactions."""
    await eventually(
        lambda: len((_latest_offset(checkpoint) or {}).get("pending") or ()) >= count,
        f"an offset with {count} pending transactions in {checkpoint}", within, interval=0.5,
    )  # fmt: skip


async def _wait_applied(j: Journal, pids: list[str], within: float) -> None:
    """Wait until every event of `pids` in the journal is in the read model."""

    async def applied() -> bool:
        balances, _, _ = await bank.projected(j)
        expected = await bank.expected_balances(j)
        return all(p in expected and balances.get(p) == expected[p] for p in pids)

    await eventually(applied, f"every event of {pids} applied", within, interval=0.5)


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


@pytest.mark.timeout(300)
async def test_delete_all_reaches_a_spark_projection_as_a_tombstone(
    spark: Any, journal: Journal
) -> None:
    """An erased id's tombstone reaches the Spark handler as it reaches in-process ones:
    deleted, at the next seq_nr (the id continues) or at 0 (the id starts again, and its
    new events are not taken for duplicates)."""
    schema = journal.settings.schema
    async with journal.pool.connection() as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (n bigserial PRIMARY KEY, pid text, seq_nr bigint, "
                "deleted boolean)"
            ).format(sql.Identifier(schema, "seen"))
        )
    kept, reset = bank.account(3), bank.account(4)
    for pid in (kept, reset):
        await journal.append(pid, [{"amount": 1}] * 5, expected_seq_nr=0)
    checkpoint = os.path.join(tempfile.mkdtemp(prefix="sj-spark-"), "ckpt")

    async def run_and_read() -> list[tuple[str, int, bool]]:
        query = await asyncio.to_thread(
            _project, spark, journal, checkpoint, recording_handler(schema),
            trigger={"availableNow": True},
        )  # fmt: skip
        await asyncio.to_thread(query.awaitTermination, 200)
        assert query.exception() is None
        async with journal.pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL("DELETE FROM {} RETURNING n, pid, seq_nr, deleted").format(
                    sql.Identifier(schema, "seen")
                )
            )
            return [(p, s, d) for _, p, s, d in sorted(await cur.fetchall())]

    first = await run_and_read()
    assert sorted(first) == sorted((p, s, False) for p in (kept, reset) for s in range(1, 6))
    assert await journal.delete_all(kept, batch_size=2) == 5
    assert await journal.delete_all(reset, reset_sequence_number=True, batch_size=2) == 5
    await journal.append(kept, [{"amount": 1}], expected_seq_nr=6)
    await journal.append(reset, [{"amount": 1}] * 2, expected_seq_nr=0)

    second = await run_and_read()
    assert sorted(second) == sorted(
        [(kept, 6, True), (kept, 7, False), (reset, 0, True), (reset, 1, False), (reset, 2, False)]
    )
    assert [e for e in second if e[0] == reset] == [(reset, 0, True), (reset, 1, False),
                                                    (reset, 2, False)]  # fmt: skip
    assert await run_and_read() == []  # from the checkpoint: nothing again


@pytest.mark.timeout(300)
async def test_a_filtered_spark_projection_stores_every_offset_and_handles_only_matches(
    spark: Any, journal: Journal
) -> None:
    """`project(filter=)`: the handler sees only the matching events (issue 30); the
    others' offsets are stored too (an in-process runner taking over finds no gap and
    nothing to do), the filter is recorded and the backlog counts only what it lets
    through."""
    schema = journal.settings.schema
    async with journal.pool.connection() as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (n bigserial PRIMARY KEY, pid text, seq_nr bigint, "
                "deleted boolean)"
            ).format(sql.Identifier(schema, "seen"))
        )
    expected = set()
    for i in range(8):
        pid = bank.account(i)
        for seq in range(1, 7):
            vip = (i + seq) % 3 == 0
            await journal.append(pid, [{"amount": seq}], expected_seq_nr=seq - 1,
                                 tags=("vip",) if vip else ())  # fmt: skip
            if vip and seq > 1:
                expected.add((pid, seq))
    vip_filter = EventFilter(tags=("vip",), where="seq_nr > 1")
    checkpoint = os.path.join(tempfile.mkdtemp(prefix="sj-spark-"), "ckpt")
    query = await asyncio.to_thread(
        _project, spark, journal, checkpoint, recording_handler(schema),
        trigger={"availableNow": True}, filter=vip_filter,
    )  # fmt: skip
    await asyncio.to_thread(query.awaitTermination, 200)
    assert query.exception() is None
    async with journal.pool.connection() as conn:
        cur = await conn.execute(
            sql.SQL("SELECT pid, seq_nr, deleted FROM {}").format(sql.Identifier(schema, "seen"))
        )
        seen = await cur.fetchall()
    assert sorted((p, s) for p, s, _ in seen) == sorted(expected)
    management = ProjectionManagement(journal)
    assert await management.event_filter(NAME) == vip_filter
    assert (await management.backlog(NAME, bank.ENTITY, SliceRange.FULL)).size == 0
    await journal.append(bank.account(0), [{"amount": 1}] * 3, expected_seq_nr=6)
    assert (await management.backlog(NAME, bank.ENTITY, SliceRange.FULL)).size == 0

    handled: list[tuple[str, int]] = []

    async def handler(conn: Any, env: Any) -> None:
        handled.append((env.persistence_id, env.seq_nr))

    stats = await Projection.exactly_once(
        journal, name=NAME, entity_type=bank.ENTITY, slice_range=SliceRange.FULL,
        handler=handler, filter=vip_filter,
    ).run(until_caught_up=True)  # fmt: skip
    assert handled == [] and stats.gaps_filled == 0


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
    holder = f"spark:{query.id}"
    try:
        await bank.wait_until_projected(journal)
        await eventually(
            lambda: sum(c.args[0] for c in t.named("batch_ended", NAME)) >= 40
            and any(c.args[0].size == 0 for c in t.named("backlog_sampled", NAME)),
            f"40 rows in batches and an empty backlog reported: {t.calls}", 60, interval=0.5,
        )  # fmt: skip
        # One picture whatever runs it: `status` shows the ranges held by the query.
        status = await FleetControl(journal).status(NAME)
        assert status.entity_type == bank.ENTITY
        assert [(str(r.slice_range), r.owner, r.running) for r in status.ranges] == [
            ("0-511", holder, True),
            ("512-1023", holder, True),
        ]
        assert all(r.progress is not None for r in status.ranges)
        shown = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "slicejournal", "status", NAME, "--json",
             "--dsn", journal.dsn, "--schema", journal.settings.schema],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        document = json.loads(shown.stdout)
        assert {r["owner"] for r in document["ranges"]} == {holder}
    finally:
        await _stop(query)
    await eventually(lambda: bool(t.named("stopped", NAME)), "stopped() after the query ended")
    assert [c.slice_range for c in t.named("started", NAME)] == ["0-1023"]
    assert {c.slice_range for c in t.named("backlog_sampled", NAME)} == {"0-511", "512-1023"}
    claimed = [(c.slice_range, c.args[0]) for c in t.named("lease_claimed", NAME)]
    assert claimed == [("0-511", holder), ("512-1023", holder)]
    assert {c.args[0] for c in t.named("lease_released", NAME)} == {holder}
    status = await FleetControl(journal).status(NAME)
    assert all(r.owner is None and not r.running for r in status.ranges)


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_long_transactions_past_the_window_across_restarts_exactly_once(
    spark: Any, pg_dsn: str, schema: str
) -> None:
    """Transactions held open past the 9 s backtracking window, written through
    `append(conn=)` and through Pekko's INSERT, two of them idle past `max_hold` before
    they write (the stream reads past those: they are pending in its offsets). The
    stream is stopped and restarted from its checkpoint while they are open, then once
    without a checkpoint; every event is applied exactly once (primary-key table)."""
    settings = horizon_settings(schema)
    max_hold = settings.query.horizon.max_hold.total_seconds()  # the source's default too
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        await bank.create_read_model(j)
        workdir = tempfile.mkdtemp(prefix="sj-spark-")
        checkpoint = os.path.join(workdir, "ckpt")
        stop = asyncio.Event()
        shorts = [asyncio.create_task(short_writes(j, stop, seed)) for seed in range(2)]
        trigger = {"processingTime": "1 second"}
        handler = bank_handler(schema)
        query = await asyncio.to_thread(_project, spark, j, checkpoint, handler, trigger=trigger)
        try:
            await _wait_batches(query, 2)
            idle = [HeldTransaction(j, pg_dsn, f"idle-{k}", pekko=k == 1) for k in range(2)]
            writing = [HeldTransaction(j, pg_dsn, f"writing-{k}", pekko=k == 1) for k in range(2)]
            for held in idle:
                await held.begin()
            await asyncio.sleep(1)
            for held in writing:  # written at once: the stream waits for them
                await held.begin()
                await held.write()
            # Past max_hold the idle ones are read past: pending in the checkpoint.
            await _wait_pending(checkpoint, 2, within=max_hold + 60)
            await _stop(query)
            query = await asyncio.to_thread(
                _project, spark, j, checkpoint, handler, trigger=trigger
            )
            for held in idle:
                await held.write()
                await held.commit()
            await asyncio.sleep(settings.query.backtracking.window.total_seconds() + 4)
            for held in writing:
                await held.commit()
            await _wait_applied(j, [h.pid for h in idle + writing], within=90)
            # And once without a checkpoint, over one of each kind open across the restart.
            await _stop(query)
            later = [HeldTransaction(j, pg_dsn, f"later-{k}", pekko=k == 1) for k in range(2)]
            await later[0].begin()
            await later[1].begin()
            await later[1].write()
            query = await asyncio.to_thread(
                _project, spark, j, os.path.join(workdir, "fresh"), handler, trigger=trigger
            )
            await asyncio.sleep(max_hold + 2)
            await later[0].write()
            for held in later:
                await held.commit()
            await asyncio.sleep(2)
        finally:
            stop.set()
            written = sum(await asyncio.gather(*shorts))
        try:
            assert written > 0
            await bank.assert_applied_exactly_once(j, within=120)
            balances, _, _ = await bank.projected(j)
            assert {h.pid for h in idle + writing + later} <= set(balances)
        finally:
            await _stop(query)

"""Projections end to end on a real PostgreSQL: exactly-once, grouped, at-least-once,
rescaling under load, crashes, recovery and management."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import warnings
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import (
    DeserializationError,
    Journal,
    SliceRange,
    slice_for,
    slice_ranges,
)
from projections import (
    Projection,
    ProjectionError,
    ProjectionGroup,
    ProjectionManagement,
    ProjectionSettings,
    RecoveryStrategy,
)
from projections.core import Mode
from projections.tables import ProjectionTables
from tests.support import ROOT, bank
from tests.support.projections import (
    FAST,
    assert_exact,
    whole_range,
)


def exactly_once_group(j: Journal, n: int, **options: Any) -> ProjectionGroup:
    handler = bank.make_handler(j)
    return ProjectionGroup(
        lambda r: Projection.exactly_once(
            j,
            name="balances",
            entity_type=bank.ENTITY,
            slice_range=r,
            handler=handler,
            settings=FAST,
            **options,
        ),
        n,
    )


@pytest.mark.slow
async def test_exactly_once_under_late_commits(bank_journal: Journal) -> None:
    j = bank_journal
    writers = bank.Writers(j, 500, late_fraction=0.1)
    writers.start(writers=6, max_batches=60)
    group = exactly_once_group(j, 4)
    await group.start()
    await writers.wait()
    await assert_exact(j)
    assert group.failed() is None
    await group.stop()
    stats = group.stats()
    assert sum(s.accepted for s in stats) == await bank.journal_count(j)
    assert writers.late > 5


@pytest.mark.slow
async def test_grouped_projection_is_exact(bank_journal: Journal) -> None:
    j = bank_journal
    writers = bank.Writers(j, 200, late_fraction=0.05, seed=2)
    writers.start(writers=4, max_batches=60)
    handler = bank.make_grouped_handler(j)
    group = ProjectionGroup(
        lambda r: Projection.grouped(
            j,
            name="balances",
            entity_type=bank.ENTITY,
            slice_range=r,
            handler=handler,
            settings=FAST,
        ),
        2,
    )
    async with group:
        await writers.wait()
        await assert_exact(j)
    assert sum(s.transactions for s in group.stats()) < await bank.journal_count(j)


@pytest.mark.slow
async def test_rescale_under_load_with_a_lagging_range(bank_journal: Journal) -> None:
    j = bank_journal
    mgmt = ProjectionManagement(j)
    writers = bank.Writers(j, 500, late_fraction=0.05, seed=3)
    writers.start(writers=4)
    group = exactly_once_group(j, 4)
    await group.start()
    try:
        for n in (8, 2, 1, 4):
            # Let one range fall behind before every change.
            lagging = slice_ranges(group.instances)[0]
            await mgmt.pause("balances", lagging)
            await asyncio.sleep(1.5)
            await group.rescale(n)
            await mgmt.resume("balances", lagging)
            await asyncio.sleep(1.5)
            assert group.failed() is None
    finally:
        await writers.stop()
    await assert_exact(j)
    await group.stop()
    assert sum(s.duplicates for s in group.stats()) > 0


async def project_with_retries(j: Journal, factory: Any, handler: Any, seed: int) -> Projection:
    """Write a backlog, then project it with `handler` under retry_and_fail(3) until exact."""
    writers = bank.Writers(j, 50, late_fraction=0.0, seed=seed)
    writers.start(writers=2, max_batches=50)
    await writers.wait()
    p = whole_range(factory, j, handler, recovery=RecoveryStrategy.retry_and_fail(3, 0.01))
    task = asyncio.create_task(p.run())
    await assert_exact(j)
    await p.stop()
    await task
    return p


async def test_handler_failures_are_retried_and_stay_exact(bank_journal: Journal) -> None:
    j = bank_journal
    inner = bank.make_handler(j)
    calls = 0

    async def flaky(conn: Any, env: Any) -> None:
        nonlocal calls
        calls += 1
        await inner(conn, env)  # written, then rolled back by the failure
        if calls % 7 == 0:
            raise RuntimeError("flaky handler")

    p = await project_with_retries(j, Projection.exactly_once, flaky, seed=4)
    assert p.stats.retries > 0


@pytest.mark.slow
async def test_batches_failing_on_the_server_roll_back_and_stay_exact(
    bank_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    """A grouped batch whose statement fails on the server, in the middle of the
    pipelined transaction (writes before it, more statements after it): nothing of
    the batch commits, the retry applies it once, and every connection goes back to
    the pool clean (psycopg and the pool log no warning about one left open)."""
    j = bank_journal
    inner = bank.make_grouped_handler(j)
    calls = 0

    async def flaky(conn: Any, envs: Any) -> None:
        nonlocal calls
        calls += 1
        await inner(conn, envs[: len(envs) // 2])
        if calls % 3 == 0:
            await conn.execute("SELECT 1 / 0")  # fails on the server, not in Python
        await inner(conn, envs[len(envs) // 2 :])
        if calls % 5 == 0:  # the last statement before the offsets and COMMIT
            await conn.execute("SELECT 1 / 0")

    p = await project_with_retries(j, Projection.grouped, flaky, seed=5)
    assert p.stats.retries > 0
    noisy = [r for r in caplog.records if r.name.startswith("psycopg") and r.levelno >= 30]
    assert not noisy, [r.getMessage() for r in noisy]


async def test_failing_handler_fails_the_projection(bank_journal: Journal) -> None:
    j = bank_journal
    await j.append(bank.account(1), [{"amount": 1}], expected_seq_nr=0)

    async def broken(conn: Any, env: Any) -> None:
        raise ValueError("cannot handle")

    p = whole_range(
        Projection.exactly_once,
        j,
        broken,
        name="b",
        recovery=RecoveryStrategy.retry_and_fail(2, 0.01),
    )
    with pytest.raises(ProjectionError, match="cannot handle"):
        await asyncio.wait_for(p.run(), 30)
    assert p.stats.retries == 2


async def test_retry_then_skip_writes_a_dead_letter(bank_journal: Journal) -> None:
    j = bank_journal
    bad = bank.account(9)
    await j.append(bad, [{"amount": 1}, {"amount": 2}], expected_seq_nr=0)
    await j.append(bank.account(10), [{"amount": 5}], expected_seq_nr=0)
    inner = bank.make_handler(j)

    async def picky(conn: Any, env: Any) -> None:
        if env.persistence_id == bad and env.seq_nr == 2:
            raise ValueError("poison event")
        await inner(conn, env)

    p = whole_range(
        Projection.exactly_once, j, picky, recovery=RecoveryStrategy.retry_and_skip(1, 0.01)
    )
    task = asyncio.create_task(p.run())
    for _ in range(200):
        _, applied, _ = await bank.projected(j)
        if applied == 2 and p.stats.skipped == 1:
            break
        await asyncio.sleep(0.05)
    await p.stop()
    await task
    letters = await ProjectionManagement(j).dead_letters("balances")
    assert [(d.persistence_id, d.seq_nr) for d in letters] == [(bad, 2)]
    assert "poison event" in letters[0].error
    balances, applied, _ = await bank.projected(j)
    assert balances == {bad: 1, bank.account(10): 5}


async def insert_from_a_jvm(j: Journal, pid: str, seq_nr: int) -> None:
    """A row whose serializer id (a JVM service's protobuf, say) is not registered here."""
    insert = sql.SQL(
        "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
        "event_ser_id, event_ser_manifest, event_payload, writer) "
        "VALUES (%s, %s, %s, %s, transaction_timestamp(), 2, 'com.example.Proto', '\\x0801', "
        "'jvm')"
    ).format(j.tables.journal)
    async with await psycopg.AsyncConnection.connect(j.dsn, autocommit=True) as conn:
        await conn.execute(insert, (slice_for(pid), bank.ENTITY, pid, seq_nr))


async def test_an_undecodable_event_fails_the_projection_loudly(bank_journal: Journal) -> None:
    j = bank_journal
    pid = bank.account(3)
    await j.append(pid, [{"amount": 1}], expected_seq_nr=0)
    await insert_from_a_jvm(j, pid, 2)
    handled: list[int] = []
    inner = bank.make_handler(j)

    async def handler(conn: Any, env: Any) -> None:
        handled.append(env.seq_nr)
        await inner(conn, env)

    p = whole_range(Projection.exactly_once, j, handler, name="strict")
    with pytest.raises(ProjectionError) as info:
        await asyncio.wait_for(p.run(), 30)
    assert f"{pid!r} seq_nr 2" in str(info.value)
    assert isinstance(info.value.__cause__, DeserializationError)
    assert handled == [1]  # the handler never saw the event it could not read


async def test_an_undecodable_event_is_dead_lettered_with_its_error(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    pid = bank.account(4)
    await j.append(pid, [{"amount": 1}], expected_seq_nr=0)
    await insert_from_a_jvm(j, pid, 2)
    await j.append(pid, [{"amount": 5}], expected_seq_nr=2)
    p = whole_range(
        Projection.exactly_once,
        j,
        bank.make_handler(j),
        recovery=RecoveryStrategy.retry_and_skip(1, 0.01),
    )
    task = asyncio.create_task(p.run())
    for _ in range(200):
        if p.stats.skipped == 1 and (await bank.projected(j))[1] == 2:
            break
        await asyncio.sleep(0.05)
    await p.stop()
    await task
    letters = await ProjectionManagement(j).dead_letters("balances")
    assert [(d.persistence_id, d.seq_nr) for d in letters] == [(pid, 2)]
    assert letters[0].error.startswith("DeserializationError")
    balances, applied, _ = await bank.projected(j)
    assert (balances, applied) == ({pid: 6}, 2)


async def test_at_least_once_never_loses_events(bank_journal: Journal) -> None:
    j = bank_journal
    writers = bank.Writers(j, 100, late_fraction=0.0, seed=5)
    writers.start(writers=2, max_batches=40)
    await writers.wait()
    seen: list[tuple[str, int]] = []

    async def handler(env: Any) -> None:
        seen.append((env.persistence_id, env.seq_nr))

    p = whole_range(Projection.at_least_once, j, handler, name="alo")
    task = asyncio.create_task(p.run())
    total = await bank.journal_count(j)
    for _ in range(300):
        if len(set(seen)) >= total:
            break
        await asyncio.sleep(0.05)
    # Crash without saving: cancel the task instead of stop().
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    first_run = set(seen)
    assert len(first_run) == total
    seen.clear()
    await j.append(bank.account(100_000), [{"amount": 1}], expected_seq_nr=0)
    p2 = whole_range(Projection.at_least_once, j, handler, name="alo")
    task = asyncio.create_task(p2.run())
    for _ in range(300):
        if (bank.account(100_000), 1) in seen:
            break
        await asyncio.sleep(0.05)
    await p2.stop()
    await task
    assert (bank.account(100_000), 1) in seen


@pytest.mark.slow
async def test_sigkill_mid_batch_then_restart_is_exact(bank_journal: Journal, pg_dsn: str) -> None:
    j = bank_journal
    writers = bank.Writers(j, 300, late_fraction=0.0, seed=6)
    writers.start(writers=4, max_batches=80)
    await writers.wait()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "tests.support.projection_worker", pg_dsn, j.settings.schema]
    for _ in range(3):
        proc = await asyncio.create_subprocess_exec(*args, env=env, cwd=ROOT)
        # Kill it once it has applied something but before it is done.
        for _ in range(400):
            _, applied, _ = await bank.projected(j)
            if applied > 0 and applied % 50 != 0:
                break
            await asyncio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    proc = await asyncio.create_subprocess_exec(*args, env=env, cwd=ROOT)
    try:
        await assert_exact(j)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def test_offset_table_stays_bounded_under_steady_load(bank_journal: Journal) -> None:
    j = bank_journal
    settings = ProjectionSettings(
        time_window=1.0, cleanup_interval=0.3, management_poll_interval=0.2, progress_interval=0.5
    )
    p = whole_range(Projection.exactly_once, j, bank.make_handler(j), settings=settings)
    task = asyncio.create_task(p.run())
    writers = bank.Writers(j, 50, late_fraction=0.0, seed=7)
    writers.start(writers=2)
    sizes = []
    try:
        for _ in range(8):
            await asyncio.sleep(0.5)
            async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
                cur = await conn.execute(
                    sql.SQL(
                        "SELECT count(*) FILTER (WHERE persistence_id <> ''), "
                        "count(*) FILTER (WHERE persistence_id = '') FROM {}"
                    ).format(ProjectionTables(j.tables).offset_store)
                )
                row = await cur.fetchone()
                assert row is not None
                sizes.append(int(row[0]))
                assert row[1] <= 1024  # at most one progress marker per slice
    finally:
        await writers.stop()
    await assert_exact(j)
    await p.stop()
    await task
    assert p.stats.cleaned_up > 0
    written = await bank.journal_count(j)
    # Bounded: the event rows plateau at about a window's worth (plus each slice's latest)
    # while the journal keeps growing.
    print(f"\noffset rows over time: {sizes}; events written: {written}")
    assert max(sizes[-3:]) < written / 2


async def test_the_deprecated_constructor_warns_naming_the_factories_and_still_projects(
    bank_journal: Journal,
) -> None:
    """0.2.0's `Projection(..., mode=...)` works until 0.4.0, with a warning; the
    factories (which type the handler by mode) do not warn."""
    j = bank_journal
    writers = bank.Writers(j, 50, late_fraction=0.0, seed=7)
    writers.start(writers=2, max_batches=10)
    await writers.wait()
    with pytest.warns(DeprecationWarning, match=r"Projection\.exactly_once") as caught:
        projection = Projection(
            j, name="balances", entity_type=bank.ENTITY, slice_range=SliceRange(0, 1023),
            mode=Mode.EXACTLY_ONCE, handler=bank.make_handler(j), settings=FAST,
        )  # fmt: skip
    assert [w.filename for w in caught] == [__file__]  # the caller's line, not ours
    assert projection.mode is Mode.EXACTLY_ONCE
    await projection.run(until_caught_up=True)
    await assert_exact(j)

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        grouped = Projection.grouped(
            j, name="balances-2", entity_type=bank.ENTITY, slice_range=SliceRange(0, 1023),
            handler=bank.make_grouped_handler(j), settings=FAST,
        )  # fmt: skip
    assert grouped.mode is Mode.GROUPED and type(grouped) is Projection

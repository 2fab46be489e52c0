"""Rebuilding a read model on Spark and swapping it in, then the live projection continues."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import Journal
from journal.errors import InvalidArgument
from journal.slices import SliceRange
from projections import Projection
from projections.spark import RebuildResult, rebuild
from tests.support import bank
from tests.support.spark import totals_handler, unqualified_handler


@pytest.mark.timeout(300)
async def test_rebuild_swaps_read_model_and_offsets(spark: Any, journal: Journal) -> None:
    await bank.create_read_model(journal)
    schema = journal.settings.schema
    for i in range(300):
        await journal.append(bank.account(i), [{"amount": i % 13}] * 5, expected_seq_nr=0)
    # A wrong read model: the rebuild replaces it whole.
    async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("INSERT INTO {} VALUES ('garbage', 42)").format(bank.table(journal, "balances"))
        )

    result = await asyncio.to_thread(
        rebuild, spark, dsn=journal.dsn, name="balances", entity_type=bank.ENTITY,
        handler=unqualified_handler(), read_models=[f"{schema}.balances", f"{schema}.applied"],
        settings=journal.settings,
    )  # fmt: skip
    assert result.events == 1500
    balances, applied, distinct = await bank.projected(journal)
    assert (applied, distinct) == (1500, 1500) and "garbage" not in balances
    # No staging schema is left behind.
    async with await psycopg.AsyncConnection.connect(journal.dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'slicejournal_rebuild_%'"
        )
        assert (await cur.fetchone()) == (0,)

    # The live projection continues from the rebuild's offsets while writers write.
    writers = bank.Writers(journal, accounts=300, late_fraction=0.1, seed=3)
    writers.seq = {p: 5 for p in writers.pids}
    writers.start(writers=3)
    live = Projection.grouped(
        journal, name="balances", entity_type=bank.ENTITY, slice_range=SliceRange(0, 1023),
        handler=bank.make_grouped_handler(journal),
    )  # fmt: skip
    task = asyncio.create_task(live.run())
    try:
        await asyncio.sleep(5)
        await writers.stop()
        await bank.assert_applied_exactly_once(journal, within=60)
        # It continued after the rebuild: nothing the rebuild applied was applied again.
        assert live.stats.accepted == writers.written
    finally:
        await writers.stop()
        await live.stop()
        await task


@pytest.mark.timeout(300)
async def test_rebuild_from_snapshots_reads_less_and_builds_the_same_read_model(
    spark: Any, journal: Journal
) -> None:
    schema = journal.settings.schema
    totals = sql.Identifier(schema, "totals")
    async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (pid text PRIMARY KEY, balance bigint NOT NULL, "
                "seq_nr bigint NOT NULL)"
            ).format(totals)
        )
    expected: dict[str, tuple[int, int]] = {}
    shipped = 0
    for i in range(40):
        pid = bank.account(i)
        amounts = [i % 7 + 1] * (5 + i % 6)
        await journal.append(pid, [{"amount": a} for a in amounts], expected_seq_nr=0)
        if i % 2 == 0:  # half the ids have a snapshot at seq_nr 3
            await journal.save_snapshot(pid, 3, {"balance": sum(amounts[:3])})
        expected[pid] = (sum(amounts), len(amounts))
        shipped += len(amounts) - (2 if i % 2 == 0 else 0)  # a snapshot for 3 events
    async with await psycopg.AsyncConnection.connect(journal.dsn) as conn:
        cur = await conn.execute("SELECT now()")
        (up_to,) = await cur.fetchone() or (None,)
    # After the rebuild's end: a later event and a snapshot at it, which must not stand
    # for the events before it (the rebuild does not read it).
    late = bank.account(0)
    await journal.append(late, [{"amount": 100}], expected_seq_nr=5)
    await journal.save_snapshot(late, 6, {"balance": 105})
    shipped += 2  # the late id's first 3 events are read again, not its snapshot

    async def rebuilt(name: str, **options: Any) -> tuple[int, dict[str, tuple[int, int]]]:
        result = await asyncio.to_thread(
            rebuild, spark, dsn=journal.dsn, name=name, entity_type=bank.ENTITY,
            handler=totals_handler(), read_models=[f"{schema}.totals"], up_to=up_to,
            settings=journal.settings, **options,
        )  # fmt: skip
        async with await psycopg.AsyncConnection.connect(journal.dsn) as conn:
            cur = await conn.execute(sql.SQL("SELECT pid, balance, seq_nr FROM {}").format(totals))
            return result.events, {p: (int(b), int(n)) for p, b, n in await cur.fetchall()}

    every_event, full = await rebuilt("totals-replay")
    from_snapshots, started = await rebuilt("totals", from_snapshots=True)
    assert full == expected and started == expected
    assert every_event == sum(n for _, n in expected.values())
    assert from_snapshots == shipped < every_event


async def test_rebuild_refuses_unknown_tables(spark: Any, journal: Journal) -> None:
    with pytest.raises(InvalidArgument, match="no table"):
        await asyncio.to_thread(
            rebuild, spark, dsn=journal.dsn, name="balances", entity_type=bank.ENTITY,
            handler=unqualified_handler(), read_models=["no_such_table"], settings=journal.settings,
        )  # fmt: skip


@pytest.mark.timeout(60)
def test_rebuild_tables_is_the_deprecated_name_of_read_models() -> None:
    result = RebuildResult(3, datetime.now(UTC), ("s.balances",))
    with pytest.warns(DeprecationWarning, match="read_models"):
        assert result.tables == ("s.balances",)
    # Refused before anything is read: both names at once.
    with (
        pytest.warns(DeprecationWarning, match=r"rebuild\(read_models=\.\.\.\)"),
        pytest.raises(InvalidArgument, match="read_models= only"),
    ):
        rebuild(
            None,  # type: ignore[arg-type]
            dsn="postgresql://unused", name="p", entity_type="Account",
            handler=lambda conn, envs: None, read_models=["a"], tables=["a"],
        )  # fmt: skip

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
from tests.support.spark import unqualified_handler


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

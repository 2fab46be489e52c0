"""A projection over the durable state on Spark (`project_changes`, issue #31): racing
upserts with optimistic revisions, deletions, transactions held open across several
micro-batches and a restart from the checkpoint; every id ends at its latest revision,
revisions of an id are applied in increasing order and none twice (real local Spark,
real PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import DurableStateStore, Journal
from projections import ProjectionManagement
from projections.spark import project_changes
from tests.integration.test_durable_state_projections import ENTITY, Writers, stored_states
from tests.support.projections import eventually
from tests.support.spark import state_handler

NAME = "carts"


async def create_model(j: Journal) -> None:
    async with await psycopg.AsyncConnection.connect(j.dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {model} (pid TEXT PRIMARY KEY, revision BIGINT NOT NULL, "
                "deleted BOOLEAN NOT NULL);"
                "CREATE TABLE {applied} (n BIGSERIAL, pid TEXT, revision BIGINT, "
                "PRIMARY KEY (pid, revision))"
            ).format(
                model=sql.Identifier(j.settings.schema, "state_model"),
                applied=sql.Identifier(j.settings.schema, "state_applied"),
            )
        )


async def model_of(j: Journal) -> dict[str, tuple[int, bool]]:
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT pid, revision, deleted FROM {}").format(
                sql.Identifier(j.settings.schema, "state_model")
            )
        )
        return {p: (int(r), bool(d)) for p, r, d in await cur.fetchall()}


async def applied_in_order(j: Journal) -> list[tuple[str, int]]:
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT pid, revision FROM {} ORDER BY n").format(
                sql.Identifier(j.settings.schema, "state_applied")
            )
        )
        return [(p, int(r)) for p, r in await cur.fetchall()]


def start(spark: Any, j: Journal, checkpoint: str) -> Any:
    return project_changes(
        spark, dsn=j.dsn, name=NAME, entity_type=ENTITY, handler=state_handler(j.settings.schema),
        checkpoint_location=checkpoint, settings=j.settings,
        trigger={"processingTime": "1 second"}, num_partitions=4,
    )  # fmt: skip


@pytest.mark.timeout(300)
async def test_project_changes_applies_every_ids_latest_revision_once_in_order(
    spark: Any, journal: Journal
) -> None:
    j = journal
    await create_model(j)
    store = DurableStateStore(j)
    pids = [f"{ENTITY}|c{i}" for i in range(120)]
    writers = Writers(store, j.dsn, pids)
    checkpoint = os.path.join(tempfile.mkdtemp(prefix="sj-spark-state-"), "ckpt")
    # An upsert of an id of its own held open across several micro-batches.
    held = await psycopg.AsyncConnection.connect(j.dsn)
    await held.execute("SELECT 1")  # its transaction, and its db_timestamp, start here
    await store.upsert(f"{ENTITY}|held", {"rev": 1}, revision=1, conn=held)
    tasks = [asyncio.create_task(writers.run(seed)) for seed in range(4)]
    try:
        query = await asyncio.to_thread(start, spark, j, checkpoint)
        await asyncio.sleep(8)
        await held.commit()  # committed 8 s and several batches after its start
        await asyncio.to_thread(query.stop)
        assert query.exception() is None
        # Restarted from the checkpoint while the writers go on.
        query = await asyncio.to_thread(start, spark, j, checkpoint)
        await asyncio.sleep(6)
    finally:
        writers.stop.set()
        await asyncio.gather(*tasks)
        await held.close()
    try:
        expected = await stored_states(j)

        async def caught_up() -> bool:
            assert query.exception() is None, query.exception()
            return await model_of(j) == expected

        await eventually(caught_up, "every id's latest revision applied", 90, interval=0.5)
    finally:
        await asyncio.to_thread(query.stop)
    assert query.exception() is None
    assert expected[f"{ENTITY}|held"] == (1, False)
    assert writers.refused > 0 and writers.held > 0 and writers.deleted > 0
    # Revisions of an id were applied in increasing order (gaps are normal), none twice.
    last: dict[str, int] = {}
    for pid, revision in await applied_in_order(j):
        assert revision > last.get(pid, 0), (pid, revision, last.get(pid))
        last[pid] = revision
    assert {p: r for p, (r, _) in expected.items()} == last
    # The projection's status measures it against the durable state (what it recorded
    # it reads), not the journal's events: nothing left.
    [status] = await ProjectionManagement(j).status(NAME, ENTITY)
    assert status.backlog is not None and status.backlog.size == 0, status
    assert status.journal_head is not None

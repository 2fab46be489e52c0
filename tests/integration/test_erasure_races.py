"""`delete_all` racing other deleters and retention, on a real PostgreSQL (issue 27).

An erasure is what a team runs when a user asks to be forgotten; retention and
`delete_events_to` delete rows of the same ids meanwhile. These tests make them
meet with real concurrent transactions and check the journal row by row:

* an erasure whose batch finds its rows already deleted by another transaction
  does not stop early: it ends only when nothing of the id is left below (or,
  reset, above) its tombstone, and counts only what it removed itself;
* retention never deletes a reset tombstone no registered projection has
  handled, so every projection still learns of the erasure.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import Journal, SliceRange
from projections import Projection
from projections.aio.retention import Retention
from projections.retention import RetentionPolicy
from tests.support.pg import fetch
from tests.support.projections import FAST

ENTITY = "Forget"


async def rows(j: Journal, pid: str) -> list[tuple[int, bool]]:
    found = await fetch(
        j.dsn,
        sql.SQL("SELECT seq_nr, deleted FROM {} WHERE persistence_id = %s ORDER BY seq_nr").format(
            j.tables.journal
        ),
        (pid,),
    )
    return [(int(s), bool(d)) for s, d in found]


async def hold_delete(j: Journal, pid: str, below: int) -> psycopg.AsyncConnection[Any]:
    """Another transaction that deletes the id's rows below `below` and stays open."""
    conn = await psycopg.AsyncConnection.connect(j.dsn)
    await conn.execute(
        sql.SQL("DELETE FROM {} WHERE persistence_id = %s AND seq_nr < %s").format(
            j.tables.journal
        ),
        (pid, below),
    )
    return conn


async def blocked(j: Journal) -> None:
    """Until some backend waits on a lock (the erasure behind the held delete)."""
    query = sql.SQL("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
    for _ in range(200):
        if (await fetch(j.dsn, query))[0][0] > 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the erasure never waited on the other transaction")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reset", [True, False])
async def test_an_erasure_whose_batch_lost_its_rows_to_another_delete_still_finishes(
    journal: Journal, reset: bool
) -> None:
    pid = f"{ENTITY}|raced-{reset}"
    await journal.append(pid, [{"n": n} for n in range(10)], expected_seq_nr=0)
    other = await hold_delete(journal, pid, below=5)  # rows 1..4 locked, deleted on commit
    try:
        erasure = asyncio.create_task(
            journal.delete_all(pid, reset_sequence_number=reset, batch_size=1)
        )
        await blocked(journal)
        await other.commit()  # the erasure's batch now finds its row gone: 0 deleted
        removed = await asyncio.wait_for(erasure, 30)
    finally:
        await other.close()
    if reset:
        assert await rows(journal, pid) == [(0, True)]
        assert await journal.highest_seq_nr(pid) == 0
        await journal.append(pid, [{"n": 0}], expected_seq_nr=0)  # the documented next step
    else:
        assert await rows(journal, pid) == [(11, True)]
        assert await journal.highest_seq_nr(pid) == 11
    # What the other transaction deleted is not the erasure's: rows 5..10 are.
    assert removed == 6


def consumer(j: Journal, seen: list[tuple[str, int, bool]]) -> Projection:
    async def handler(conn: Any, env: Any) -> None:
        seen.append((env.persistence_id, env.seq_nr, env.deleted))

    return Projection.exactly_once(
        j, name="forgets", entity_type=ENTITY, slice_range=SliceRange.FULL, handler=handler,
        settings=FAST,
    )  # fmt: skip


@pytest.mark.timeout(120)
async def test_retention_racing_an_erasure_with_reset_leaves_only_the_tombstone(
    journal: Journal,
) -> None:
    """The operator's cron and the application's erasure request, 20 rounds: every
    round ends with the tombstone alone and the id ready to start again at 1."""
    retention = Retention(journal)
    await retention.register("forgets", ENTITY)
    policy = RetentionPolicy(ENTITY, keep_last=2)
    seen: list[tuple[str, int, bool]] = []
    pids = [f"{ENTITY}|round-{r}" for r in range(20)]
    for p in pids:
        await journal.append(p, [{"n": n} for n in range(20)], expected_seq_nr=0)
    await consumer(journal, seen).run(until_caught_up=True)  # everything consumed
    for p in pids:
        await asyncio.gather(retention.apply(policy), journal.delete_all(p, True, batch_size=3))
        assert await rows(journal, p) == [(0, True)], p
        assert await journal.highest_seq_nr(p) == 0
        await journal.append(p, [{"n": 0}], expected_seq_nr=0)


@pytest.mark.timeout(120)
async def test_retention_keeps_an_unhandled_reset_tombstone_and_the_projection_gets_it(
    journal: Journal,
) -> None:
    retention = Retention(journal)
    await retention.register("forgets", ENTITY)
    seen: list[tuple[str, int, bool]] = []
    projection = consumer(journal, seen)
    pid = f"{ENTITY}|interrupted"
    await journal.append(pid, [{"n": n} for n in range(50)], expected_seq_nr=0)
    await projection.run(until_caught_up=True)
    assert len(seen) == 50

    # An erasure interrupted after its tombstone: its first batch waits behind a lock
    # and is cancelled, as a crashed process would leave it.
    lock = await psycopg.AsyncConnection.connect(journal.dsn)
    try:
        await lock.execute(
            sql.SQL("SELECT 1 FROM {} WHERE persistence_id = %s AND seq_nr = 1 FOR UPDATE")
            .format(journal.tables.journal),
            (pid,),
        )  # fmt: skip
        erasure = asyncio.create_task(journal.delete_all(pid, True, batch_size=1))
        await blocked(journal)
        erasure.cancel()
        with pytest.raises(asyncio.CancelledError):
            await erasure
    finally:
        await lock.close()
    assert (await rows(journal, pid))[:2] == [(0, True), (1, False)]

    # The events below are all consumed, the tombstone is not: retention keeps off.
    report = await retention.apply(RetentionPolicy(ENTITY, keep_last=2))
    assert report.events == 0
    assert await rows(journal, pid) == [(0, True)] + [(n, False) for n in range(1, 51)]

    seen.clear()
    await projection.run(until_caught_up=True)
    assert seen == [(pid, 0, True)]  # the erasure reached the projection
    # Running the erasure again finishes it.
    await journal.delete_all(pid, True, batch_size=7)
    assert await rows(journal, pid) == [(0, True)]


@pytest.mark.timeout(120)
async def test_retention_never_deletes_a_reset_tombstone_moved_on_while_it_ran(
    journal: Journal,
) -> None:
    """A second reset moves the id's tombstone (seq_nr 0) to a new db_timestamp. When
    that commits while a retention statement, which saw the old, handled tombstone, is
    deleting below its target, the statement re-checks the moved row: it must keep it,
    or the projection never learns of the second erasure (and the new lifetime's seq_nr
    1 meets the old one's in its read model)."""
    retention = Retention(journal)
    await retention.register("forgets", ENTITY)
    seen: list[tuple[str, int, bool]] = []
    projection = consumer(journal, seen)
    pid = f"{ENTITY}|moved"
    await journal.append(pid, [{"n": 0}], expected_seq_nr=0)
    await journal.delete_all(pid, True)  # the first reset: its tombstone, then 1..6
    await journal.append(pid, [{"n": n} for n in range(6)], expected_seq_nr=0)
    await projection.run(until_caught_up=True)
    assert seen[-7:] == [(pid, 0, True)] + [(pid, n, False) for n in range(1, 7)]

    # The second reset's tombstone write, held open: the row is locked, not yet moved.
    move = await psycopg.AsyncConnection.connect(journal.dsn)
    try:
        cur = await move.execute(
            sql.SQL(
                "UPDATE {} SET db_timestamp = clock_timestamp() WHERE persistence_id = %s "
                "AND seq_nr = 0 RETURNING db_timestamp"
            ).format(journal.tables.journal),
            (pid,),
        )
        (moved_to,) = await cur.fetchone() or (None,)
        applying = asyncio.create_task(retention.apply(RetentionPolicy(ENTITY, keep_last=2)))
        await blocked(journal)  # its delete below the target waits for the row
        await move.commit()
        await asyncio.wait_for(applying, 30)
    finally:
        await move.close()
    found = await fetch(
        journal.dsn,
        sql.SQL("SELECT db_timestamp FROM {} WHERE persistence_id = %s AND seq_nr = 0").format(
            journal.tables.journal
        ),
        (pid,),
    )
    assert found == [(moved_to,)]  # kept, where the second reset put it
    seen.clear()
    await projection.run(until_caught_up=True)
    assert seen == [(pid, 0, True)]  # the second erasure reaches the projection

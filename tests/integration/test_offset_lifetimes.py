"""Issue 27, part 3, on a real PostgreSQL: after a reset tombstone, the id's previous
lifetime, still visible while the erasure's batches have not removed it, is never
applied again, and a single instance never reports `OffsetConflict` for its own
earlier delivery — live (backtracking) or on a restart. The rule is in
`projections/offset_store.py`; its model tests in tests/unit/test_offset_lifetimes.py.
"""

from __future__ import annotations

import asyncio

from journal import Journal
from journal.erasure import ErasureSql, check_erasure
from tests.integration.test_offset_lifecycle import EVENT, Seen, recording
from tests.support import bank
from tests.support.projections import eventually


async def write_tombstone_only(j: Journal, pid: str) -> None:
    """`delete_all(pid, reset_sequence_number=True)` stopped after its first
    transaction: the tombstone (seq_nr 0) is there, the events above it still are."""
    statement, params = ErasureSql.of(j.tables).tombstone_statement(
        check_erasure(pid, True, 1000), "test"
    )
    async with j.pool.connection() as conn:
        await conn.execute(statement, params)


async def test_a_previous_lifetime_still_visible_after_its_tombstone_is_never_applied_again(
    bank_journal: Journal,
) -> None:
    j = bank_journal
    pid = bank.account(7)
    await j.append(pid, [EVENT] * 3, expected_seq_nr=0)
    seen: Seen = []
    projection = recording(j, seen, name="lifetimes")
    run = asyncio.create_task(projection.run())
    try:
        await eventually(lambda: len(seen) == 3, "the first lifetime applied")
        await write_tombstone_only(j, pid)
        await eventually(lambda: len(seen) == 4, "the tombstone applied")
        # Backtracking (behind_current_time 6 s) reads seq_nr 1-3 again: still there.
        await eventually(
            lambda: projection.stats.duplicates >= 3 or run.done(), "backtracking", within=30
        )
        assert not run.done(), "the projection stopped (OffsetConflict?)"
    finally:
        await projection.stop()
        await run  # raises what stopped it
    assert seen == [(pid, 1, False), (pid, 2, False), (pid, 3, False), (pid, 0, True)]
    # A restart reads the backtracking window behind its offsets: duplicates only.
    seen.clear()
    await projection.run(until_caught_up=True)
    assert seen == []
    # The new lifetime, once the erasure is done, is applied.
    await j.delete_all(pid, reset_sequence_number=True)
    await j.append(pid, [EVENT], expected_seq_nr=0)
    await projection.run(until_caught_up=True)
    assert seen == [(pid, 0, True), (pid, 1, False)]
    await projection.run(until_caught_up=True)
    assert seen == [(pid, 0, True), (pid, 1, False)]

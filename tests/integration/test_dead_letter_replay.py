"""Dead-letter replay on a real PostgreSQL (issue 30).

A handler fails on chosen ids under `retry_and_skip`, so their events land in
the dead-letter table; the bug is fixed, an operator asks for a replay, and the
instance owning each letter's slice (in this process, or a `slicejournal
worker` process) hands the event to the handler again, exactly once (the read
model's primary key), marking the letter replayed. A replay that fails again
keeps the letter parked with the new error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from psycopg import sql

from journal import InvalidArgument, InvalidPersistenceId, Journal
from projections import ProjectionGroup, ProjectionManagement, UnknownProjection
from projections.aio.fleet_control import FleetControl
from slicejournal.examples.worker_processes import WorkerProcesses
from tests.support import ROOT
from tests.support.pg import fetch
from tests.support.projections import eventually
from tests.support.replay import ENTITY, NAME, TARGET, create_tables, projection, table


async def applied(j: Journal) -> set[tuple[str, int]]:
    rows = await fetch(
        j.dsn, sql.SQL("SELECT pid, seq_nr FROM {}").format(table(j, "replay_applied"))
    )
    return {(str(p), int(s)) for p, s in rows}


async def set_broken(j: Journal, pids: list[str]) -> None:
    async with j.pool.connection() as conn:
        await conn.execute(sql.SQL("DELETE FROM {}").format(table(j, "replay_broken")))
        for pid in pids:
            await conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s)").format(table(j, "replay_broken")), (pid,)
            )


async def write(j: Journal, pids: list[str]) -> set[tuple[str, int]]:
    for pid in pids:
        await j.append(pid, [{"n": 1}, {"n": 2}], expected_seq_nr=0)
    return {(p, s) for p in pids for s in (1, 2)}


async def scenario(j: Journal, management: ProjectionManagement) -> None:
    """Letters parked, the bug fixed for all but one id, replay: all but that id's
    events applied once; that id's letters parked again with the new error."""
    pids = [f"{ENTITY}|id-{i}" for i in range(8)]
    bad, stubborn = pids[:3], pids[2]
    await set_broken(j, bad)
    written = await write(j, pids)

    async def parked() -> bool:
        good = {(p, s) for p, s in written if p not in bad}
        return len(await management.dead_letters(NAME)) == 6 and await applied(j) == good

    await eventually(parked, "six letters parked, the other events applied", within=30)
    assert {d.status for d in await management.dead_letters(NAME)} == {"parked"}

    await set_broken(j, [stubborn])  # the fix, except for one id
    asked = await management.replay_dead_letters(NAME)
    assert asked == sorted((p, s) for p in bad for s in (1, 2))

    async def settled() -> bool:
        letters = await management.dead_letters(NAME)
        return all(d.status != "pending" for d in letters)

    await eventually(settled, "every requested replay ran", within=30)
    assert await applied(j) == {(p, s) for p, s in written if p != stubborn}
    letters = {(d.persistence_id, d.seq_nr): d for d in await management.dead_letters(NAME)}
    for (pid, _), letter in letters.items():
        if pid == stubborn:
            assert letter.status == "parked" and letter.replay_failures == 1
            assert letter.error.startswith("replay failed: RuntimeError: bug on")
        else:
            assert letter.status == "replayed" and letter.replayed_at is not None

    # Fixed at last: replaying the named letters applies them; replayed ones are not asked again.
    await set_broken(j, [])
    stubborn_letters = [(stubborn, 1), (stubborn, 2)]
    assert await management.replay_dead_letters(NAME, stubborn_letters) == stubborn_letters
    assert await management.replay_dead_letters(NAME, [(pids[0], 1)]) == []

    async def all_applied() -> bool:
        return await applied(j) == written

    await eventually(all_applied, "every event applied", within=30)
    await eventually(settled, "the last replays ran", within=30)
    assert {d.status for d in await management.dead_letters(NAME)} == {"replayed"}


@pytest.mark.timeout(120)
async def test_letters_replay_in_a_group_after_the_fix_exactly_once(journal: Journal) -> None:
    await create_tables(journal)
    management = ProjectionManagement(journal)
    async with ProjectionGroup(lambda r: projection(journal, r), 4):
        await scenario(journal, management)


@pytest.mark.timeout(60)
async def test_replay_checks_its_input(journal: Journal) -> None:
    management = ProjectionManagement(journal)
    with pytest.raises(UnknownProjection):
        await management.replay_dead_letters("nobody")
    for letters in ("Letter|a", [("Letter|a", "1")], [("Letter|a",)], [("", 1)]):
        with pytest.raises((InvalidArgument, InvalidPersistenceId)):
            await management.replay_dead_letters(NAME, letters)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_letters_replay_in_fleet_worker_processes(
    journal: Journal, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    await create_tables(journal)
    workers = WorkerProcesses(
        TARGET, dsn=pg_dsn, schema=schema, lease_ttl=2.0, logs=tmp_path, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        workers.start("w1")
        workers.start("w2")
        await FleetControl(journal).wait_converged(NAME, timeout=60, interval=0.2)
        await scenario(journal, ProjectionManagement(journal))
    finally:
        workers.kill_all()

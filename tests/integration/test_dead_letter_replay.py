"""Dead-letter replay on a real PostgreSQL (issue 30).

A handler fails on chosen ids under `retry_and_skip`, so their events land in
the dead-letter table; the bug is fixed, an operator asks for a replay, and the
instance owning each letter's slice (in this process, or a `slicejournal
worker` process) hands the event to the handler again, exactly once (the read
model's primary key), marking the letter replayed. A replay that fails again
keeps the letter parked with the new error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
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


@pytest.mark.timeout(120)
async def test_a_letter_of_an_erased_lifetime_is_not_replayed_with_the_next_ones_event(
    journal: Journal,
) -> None:
    """Its id was reset by `delete_all` and written again: the letter's seq_nr now holds
    another event, which the replay must not hand to the handler as the letter's."""
    await create_tables(journal)
    management = ProjectionManagement(journal)
    pid = f"{ENTITY}|reset"
    async with ProjectionGroup(lambda r: projection(journal, r), 2):
        await set_broken(journal, [pid])
        await write(journal, [pid])

        async def parked() -> bool:
            return len(await management.dead_letters(NAME)) == 2

        await eventually(parked, "both events parked", within=30)
        await set_broken(journal, [])
        await journal.delete_all(pid, reset_sequence_number=True)
        await write(journal, [pid])  # the next lifetime: seq_nr 1 and 2 again

        async def next_lifetime_applied() -> bool:
            return await applied(journal) == {(pid, 0), (pid, 1), (pid, 2)}

        await eventually(next_lifetime_applied, "the tombstone and the next lifetime", within=30)
        assert await management.replay_dead_letters(NAME) == [(pid, 1), (pid, 2)]

        async def settled() -> bool:
            letters = await management.dead_letters(NAME)
            return all(d.status != "pending" for d in letters)

        await eventually(settled, "the replays ran", within=30)
        letters = await management.dead_letters(NAME)
        assert [d.status for d in letters] == ["parked", "parked"]
        assert all("erased" in d.error and d.replay_failures == 1 for d in letters), letters
        assert await applied(journal) == {(pid, 0), (pid, 1), (pid, 2)}


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


async def cli(*args: str, dsn: str, schema: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "slicejournal.cli", *args, "--dsn", dsn, "--schema", schema,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@pytest.mark.timeout(120)
async def test_the_cli_lists_and_replays_letters(
    journal: Journal, pg_dsn: str, schema: str
) -> None:
    await create_tables(journal)
    pids = [f"{ENTITY}|cli-{i}" for i in range(3)]
    await set_broken(journal, pids[:2])
    written = await write(journal, pids)
    management = ProjectionManagement(journal)
    async with ProjectionGroup(lambda r: projection(journal, r), 2):

        async def parked() -> bool:
            return len(await management.dead_letters(NAME)) == 4

        await eventually(parked, "four letters parked", within=30)
        code, out = await cli("dead-letters", NAME, "--json", dsn=pg_dsn, schema=schema)
        assert code == 0, out
        assert {(d["persistence_id"], d["status"]) for d in json.loads(out)} == {
            (p, "parked") for p in pids[:2]
        }
        for bad in (["replay", NAME], ["replay", NAME, "--all", f"{pids[0]}:1"],
                    ["replay", NAME, "no-seq-nr"], ["a", "b"]):  # fmt: skip
            code, out = await cli("dead-letters", *bad, dsn=pg_dsn, schema=schema)
            assert code != 0 and "dead-letters" in out, out
        await set_broken(journal, [])
        code, out = await cli("dead-letters", "replay", NAME, f"{pids[0]}:1", f"{pids[0]}:2",
                              "--json", dsn=pg_dsn, schema=schema)  # fmt: skip
        assert code == 0, out
        assert json.loads(out)["requested"] == [
            {"persistence_id": pids[0], "seq_nr": 1},
            {"persistence_id": pids[0], "seq_nr": 2},
        ]

        async def first_replayed() -> bool:
            letters = await management.dead_letters(NAME)
            return sum(d.status == "replayed" for d in letters) == 2

        await eventually(first_replayed, "the two named letters replayed", within=30)
        code, out = await cli("dead-letters", "replay", NAME, "--all", dsn=pg_dsn, schema=schema)
        assert code == 0 and "replay requested for 2 letter(s)" in out, out

        async def done() -> bool:
            return await applied(journal) == written

        await eventually(done, "every letter replayed", within=30)
    code, out = await cli("dead-letters", NAME, dsn=pg_dsn, schema=schema)
    assert code == 0 and out.count("replayed") == 4, out

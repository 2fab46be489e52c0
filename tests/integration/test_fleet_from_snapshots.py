"""A projection started from snapshots, run by real `slicejournal worker` processes, one
of them SIGKILLed mid-run (issue 31 with the fleet).

Three hundred `Till` ids have a history before the fleet starts: most have a snapshot
below their last event, half of those with the events under it deleted (the
snapshot is then the only record of them), the rest none. Three workers run
`tills`, this module's grouped projection with `from_snapshots=True`, whose handler
folds a total per id (a snapshot replaces it, an event adds to it) and records every
envelope it applies in `till_applied` (no key: an envelope applied twice is a second
row). Writers keep appending and snapshotting (half the time deleting the events
under the new snapshot) while one worker is SIGKILLed, the others take its ranges
over and a fourth joins; then every id gets one more event.

At the end each id's total equals the one computed from the journal's own tables (the
snapshot's state, plus the events after it); nothing was applied twice or out of
order; each id snapshotted before the start began from a snapshot; the killed worker
and the one that joined both applied some. Before the kill, after it, after the join
and at the end, read in one snapshot of the database, each id's stored offset is the
seq_nr its read model row was last updated to: never ahead of what was applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import BacktrackingSettings, EventEnvelope, Journal, SliceRange
from projections import FleetControl, FleetStatus, Projection, ProjectionSettings
from projections.tables import ProjectionTables
from tests.support.fleet import Fleet
from tests.support.pg import fast_query_settings, fetch
from tests.support.projections import eventually, journal_settings

ENTITY = "Till"
NAME = "tills"
TARGET = "tests.integration.test_fleet_from_snapshots:tills"
IDS = 300


# -- what every worker process runs: `slicejournal worker <this module>:tills` ------------


def tables(schema: str) -> tuple[sql.Identifier, sql.Identifier]:
    """The read model: `till_totals (pid, total, seq_nr)` and `till_applied`, a row per
    envelope applied (which process applied it, in `process`)."""
    return sql.Identifier(schema, "till_totals"), sql.Identifier(schema, "till_applied")


def tills(journal: Journal, slice_range: SliceRange) -> Projection:
    totals, applied = tables(journal.settings.schema)
    upsert = sql.SQL(
        "INSERT INTO {t} (pid, total, seq_nr) VALUES (%s, %s, %s) ON CONFLICT (pid) DO UPDATE "
        "SET total = CASE WHEN %s THEN excluded.total ELSE {t}.total + excluded.total END, "
        "seq_nr = excluded.seq_nr"
    ).format(t=totals)
    record = sql.SQL(
        "INSERT INTO {} (pid, seq_nr, from_snapshot, process) VALUES (%s, %s, %s, %s)"
    ).format(applied)

    async def handle(conn: psycopg.AsyncConnection[Any], envs: list[EventEnvelope]) -> None:
        for env in envs:
            value = env.event["total"] if env.from_snapshot else env.event["amount"]
            pid, seq_nr, snap = env.persistence_id, env.seq_nr, env.from_snapshot
            await conn.execute(upsert, (pid, value, seq_nr, snap))
            await conn.execute(record, (pid, seq_nr, snap, os.getpid()))

    return Projection.grouped(
        journal,
        name=NAME,
        entity_type=ENTITY,
        slice_range=slice_range,
        handler=handle,
        settings=ProjectionSettings(
            group_after_envelopes=20, group_after_duration=0.1, management_poll_interval=0.5
        ),
        query_settings=fast_query_settings(
            buffer_size=100, backtracking=BacktrackingSettings(window=20, behind_current_time=6)
        ),
        from_snapshots=True,
    )


# -- the test's side ----------------------------------------------------------------------


class Tills:
    """The ids' histories as the test wrote them: (total, seq_nr) per id."""

    def __init__(self, j: Journal, seed: int) -> None:
        self.j = j
        self.rng = random.Random(seed)
        self.state: dict[str, tuple[int, int]] = {}
        self.snapshotted_before_start: dict[str, int] = {}  # pid -> the snapshot's seq_nr
        self.snapshots_while_running = 0
        self.stop = asyncio.Event()

    async def append(self, pid: str, count: int) -> None:
        amounts = [self.rng.randint(1, 99) for _ in range(count)]
        total, seq = self.state.get(pid, (0, 0))
        await self.j.append(pid, [{"amount": a} for a in amounts], expected_seq_nr=seq)
        self.state[pid] = (total + sum(amounts), seq + count)

    async def history(self, i: int) -> None:
        """Id i: 4-8 events; two ids in three a snapshot 1-3 events below the last (and of
        those, one in two with the events up to it deleted)."""
        pid = f"{ENTITY}|{i}"
        count = self.rng.randint(4, 8)
        amounts = [self.rng.randint(1, 99) for _ in range(count)]
        await self.j.append(pid, [{"amount": a} for a in amounts], expected_seq_nr=0)
        self.state[pid] = (sum(amounts), count)
        if i % 3:
            at = count - self.rng.randint(1, 3)
            await self.j.save_snapshot(pid, at, {"total": sum(amounts[:at])})
            self.snapshotted_before_start[pid] = at
            if i % 3 == 1:
                assert await self.j.delete_events_to(pid, at) == at

    async def write(self, pids: list[str]) -> None:
        """Until `stop`: 1-3 events to one of `pids`; one time in six a snapshot of the id
        at its new last event, one time in two with the events up to it deleted (a
        worker that has not read them yet gets the snapshot instead)."""
        while not self.stop.is_set():
            pid = self.rng.choice(pids)
            await self.append(pid, self.rng.randint(1, 3))
            if self.rng.random() < 1 / 6:
                total, seq = self.state[pid]
                await self.j.save_snapshot(pid, seq, {"total": total})
                self.snapshots_while_running += 1
                if self.rng.random() < 0.5:  # and the events it stands for deleted
                    assert await self.j.delete_events_to(pid, seq) == seq
            await asyncio.sleep(0.01)


async def create_read_model(dsn: str, schema: str) -> None:
    totals, applied = tables(schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (pid text PRIMARY KEY, total bigint NOT NULL, "
                "seq_nr bigint NOT NULL)"
            ).format(totals)
        )
        # No key on (pid, seq_nr): an envelope applied twice shows as a second row.
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (n bigserial PRIMARY KEY, pid text NOT NULL, "
                "seq_nr bigint NOT NULL, from_snapshot boolean NOT NULL, process int NOT NULL)"
            ).format(applied)
        )


async def expected_from_journal(j: Journal) -> dict[str, tuple[int, int]]:
    """(total, seq_nr) per id from the journal's tables themselves: the id's snapshot
    (its state stands for every event up to its seq_nr), plus the events after it."""
    snapshots = {
        pid: (int(seq), json.loads(bytes(payload))["total"])
        for pid, seq, payload in await fetch(
            j.dsn,
            sql.SQL("SELECT persistence_id, seq_nr, snapshot FROM {}").format(j.tables.snapshot),
        )
    }
    expected = {pid: (total, seq) for pid, (seq, total) in snapshots.items()}
    rows = await fetch(
        j.dsn,
        sql.SQL(
            "SELECT persistence_id, seq_nr, deleted, event_payload FROM {} "
            "WHERE entity_type = %s ORDER BY persistence_id, seq_nr"
        ).format(j.tables.journal),
        (ENTITY,),
    )
    for pid, seq, deleted, payload in rows:
        covered, _ = snapshots.get(pid, (0, 0))
        total, last = expected.get(pid, (0, 0))
        if seq <= covered:
            continue
        assert not deleted, f"{pid}: event {seq} deleted above its snapshot at {covered}"
        expected[pid] = (total + json.loads(bytes(payload))["amount"], max(last, int(seq)))
    return expected


async def read_model(dsn: str, schema: str) -> dict[str, tuple[int, int]]:
    totals, _ = tables(schema)
    rows = await fetch(dsn, sql.SQL("SELECT pid, total, seq_nr FROM {}").format(totals))
    return {pid: (int(total), int(seq)) for pid, total, seq in rows}


async def offsets_and_read_model(j: Journal) -> tuple[dict[str, int], dict[str, int]]:
    """In one snapshot of the database: the highest stored offset seq_nr per id, and the
    seq_nr of each id's read model row."""
    totals, _ = tables(j.settings.schema)
    offsets = ProjectionTables(j.tables).offset_store
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur = await conn.execute(
            sql.SQL(
                "SELECT persistence_id, max(seq_nr) FROM {} WHERE projection_name = %s "
                "AND persistence_id <> '' GROUP BY persistence_id"
            ).format(offsets),
            (NAME,),
        )
        stored = {pid: int(seq) for pid, seq in await cur.fetchall()}
        cur = await conn.execute(sql.SQL("SELECT pid, seq_nr FROM {}").format(totals))
        model = {pid: int(seq) for pid, seq in await cur.fetchall()}
        await conn.rollback()
    return stored, model


async def assert_offsets_match_read_model(j: Journal, when: str) -> int:
    stored, model = await offsets_and_read_model(j)
    differ = {p: (s, model.get(p)) for p, s in stored.items() if s != model.get(p)}
    assert not differ, f"{when}: offset seq_nr != read model seq_nr (offset, model): {differ}"
    assert set(model) == set(stored), f"{when}: read model rows without an offset"
    return len(model)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_fleet_from_snapshots_with_a_worker_killed_applies_every_id_once(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    fleet = Fleet(pg_dsn, schema, tmp_path, target=TARGET)
    try:
        async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
            await create_read_model(pg_dsn, schema)
            book = Tills(j, seed=31)
            for start in range(0, IDS, 20):
                await asyncio.gather(*(book.history(i) for i in range(start, start + 20)))
            before = dict(book.snapshotted_before_start)
            assert 150 < len(before) < IDS
            control = FleetControl(j)

            async def converge(without: str | None = None, workers: int = 3) -> FleetStatus:
                """Converged and balanced over `workers` live workers, `without` owning
                nothing (bounded: wait_converged's timeout, 300 polls)."""
                for _ in range(300):
                    fleet.check()
                    status = await control.wait_converged(NAME, timeout=60, interval=0.2)
                    owners = [r.owner for r in status.ranges]
                    counts = [owners.count(w) for w in status.workers]
                    if (
                        without not in owners
                        and len(status.workers) == workers
                        and max(counts) - min(counts) <= 1
                    ):
                        return status
                    await asyncio.sleep(0.2)
                raise AssertionError(f"not converged and balanced: {status}")

            for worker_id in ("w1", "w2", "w3"):
                fleet.start(worker_id)
            pids = sorted(book.state)
            writers = [asyncio.create_task(book.write(pids[w::2])) for w in range(2)]
            try:
                await converge()

                async def under_way() -> bool:
                    fleet.check()
                    return len(await read_model(pg_dsn, schema)) >= IDS // 3

                await eventually(under_way, "the workers applying the history", within=30)
                seen = [await assert_offsets_match_read_model(j, "before the kill")]
                status = await control.status(NAME)
                victim = status.ranges[0].owner
                assert victim is not None
                victim_process = fleet.procs[victim].pid
                fleet.kill(victim)
                seen.append(await assert_offsets_match_read_model(j, "after the kill"))
                await converge(without=victim, workers=2)
                fleet.start("w4")
                await converge(without=victim, workers=3)
                await asyncio.sleep(1)
                seen.append(await assert_offsets_match_read_model(j, "after w4 joined"))
            finally:
                book.stop.set()
                await asyncio.gather(*writers)
            for pid in pids:  # one more event for every id, after the takeover
                await book.append(pid, 1)

            expected = await expected_from_journal(j)
            assert expected == book.state  # the oracle agrees with what was written

            async def caught_up() -> bool:
                fleet.check()
                model = await read_model(pg_dsn, schema)
                return {p: s for p, (_, s) in model.items()} == {
                    p: s for p, (_, s) in expected.items()
                }

            await eventually(caught_up, "every id at its last seq_nr", within=60)
            model = await read_model(pg_dsn, schema)
            off = {p: (model[p], want) for p, want in expected.items() if model[p] != want}
            assert not off, f"{len(off)} ids off (read model, journal): {list(off.items())[:5]}"
            seen.append(await assert_offsets_match_read_model(j, "caught up"))
            assert seen[-1] == IDS, seen

            _, applied_table = tables(schema)
            applied = await fetch(
                pg_dsn,
                sql.SQL("SELECT pid, seq_nr, from_snapshot, process FROM {} ORDER BY n").format(
                    applied_table
                ),
            )
            twice = [k for k, n in Counter((p, s) for p, s, _, _ in applied).items() if n > 1]
            assert not twice, f"applied twice: {twice[:10]}"
            by_pid: dict[str, list[tuple[int, bool]]] = {}
            for pid, seq, snap, _ in applied:
                by_pid.setdefault(pid, []).append((int(seq), bool(snap)))
            wrong = []
            for pid, envelopes in by_pid.items():
                last = 0
                for seq, snap in envelopes:
                    # An event follows the previous envelope; a snapshot may jump over
                    # events it stands for, never back.
                    if (snap and seq <= last) or (not snap and seq != last + 1):
                        wrong.append(f"{pid}: {'snapshot' if snap else 'event'} {seq} after {last}")
                    last = seq
            assert not wrong, wrong[:10]
            # Each id snapshotted before the start began with a snapshot, not its events:
            # that one, or one the writers saved before the id's range got to it.
            firsts = {pid: envelopes[0] for pid, envelopes in by_pid.items()}
            not_from_snapshot = {
                p: firsts[p]
                for p, at in before.items()
                if not (firsts[p][1] and firsts[p][0] >= at)
            }
            assert not not_from_snapshot, list(not_from_snapshot.items())[:10]
            processes = {process for _, _, _, process in applied}
            survivors = {fleet.procs[w].pid for w in fleet.procs if w != victim}
            assert victim_process in processes, "the killed worker applied nothing"
            assert fleet.procs["w4"].pid in processes, "the worker that joined applied nothing"
            assert processes <= survivors | {victim_process}
            assert book.snapshots_while_running > 0

            codes = fleet.stop_all()
            assert codes[victim] == -signal.SIGKILL
            assert all(code == 0 for w, code in codes.items() if w != victim), codes
            assert fleet.count("ERROR") == 0, "\n".join(fleet.tail(w, 30) for w in fleet.procs)
    finally:
        with contextlib.suppress(Exception):
            fleet.kill_all()

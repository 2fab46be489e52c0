"""Erasures, retention, late commits and a rescaled projection together (issue 27).

Each part holds on its own; this run makes them meet the way production does:
writers append (some holding their transaction open for a while, so events
commit late with old timestamps), each id is now and then erased by its owner
with or without a sequence reset, retention (keep the last 2, projection
registered) runs in a loop, and an exactly-once projection group is rescaled
4 → 8 → 2 meanwhile. The read model deletes an id's rows when it receives the
id's tombstone. At the end every read model row is exactly what the journal's
last lifetime of each id holds, every event applied once (primary key), and no
erased event is left live in the journal or in the read model.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from psycopg import sql

from journal import Journal
from projections import Projection, ProjectionGroup
from projections.aio.retention import Retention
from projections.retention import RetentionPolicy, RetentionSettings
from tests.support.pg import fetch
from tests.support.projections import FAST, eventually, journal_settings

ENTITY = "Soak"
IDS = 24


class Owner:
    """Writes and erases a share of the ids; knows each id's current lifetime."""

    def __init__(self, j: Journal, pids: list[str], seed: int) -> None:
        self.j = j
        self.pids = pids
        self.rng = random.Random(seed)
        self.highest = dict.fromkeys(pids, 0)
        self.first = dict.fromkeys(pids, 1)  # the current lifetime's first seq_nr
        self.erasures = {"reset": 0, "kept": 0}
        self.late = 0
        self.busy: set[str] = set()
        self.held: list[asyncio.Task[None]] = []
        # What happened to each id, in order, for the failure report.
        self.history: dict[str, list[str]] = {p: [] for p in pids}

    async def step(self) -> None:
        free = [p for p in self.pids if p not in self.busy]
        if not free:
            return
        pid = self.rng.choice(free)
        roll = self.rng.random()
        # Erasures are frequent (12% of steps, half with a reset): the races between
        # a second reset, retention and a lagging projection need several of them per id.
        if roll < 0.12 and self.highest[pid] > 0:
            reset = self.rng.random() < 0.5
            # One row per batch: the erasure runs long enough for retention's batches and the
            # projection's re-reads to meet it.
            self.history[pid].append(f"erase reset={reset} after {self.highest[pid]}")
            await self.j.delete_all(pid, reset_sequence_number=reset, batch_size=1)
            self.history[pid].append("erased")
            if reset:
                self.highest[pid], self.first[pid] = 0, 1
            else:
                self.highest[pid] += 1  # the tombstone
                self.first[pid] = self.highest[pid] + 1
            self.erasures["reset" if reset else "kept"] += 1
            return
        events = [{"n": self.rng.random()} for _ in range(self.rng.randint(1, 5))]
        if roll < 0.18:
            # Held open beside the other writes: the events commit late, with a
            # timestamp from before others. The id waits for it.
            self.busy.add(pid)
            self.held.append(asyncio.create_task(self.held_open(pid, events)))
            return
        stored = await self.j.append(pid, events, expected_seq_nr=self.highest[pid])
        self.record(pid, "append", stored)
        self.highest[pid] += len(events)

    async def held_open(self, pid: str, events: list[Any]) -> None:
        async with self.j.pool.connection() as conn, conn.transaction():
            stored = await self.j.append(pid, events, expected_seq_nr=self.highest[pid], conn=conn)
            self.record(pid, "held", stored)
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        self.highest[pid] += len(events)
        self.late += 1
        self.busy.discard(pid)

    def record(self, pid: str, how: str, stored: list[Any]) -> None:
        first, last = stored[0], stored[-1]
        self.history[pid].append(
            f"{how} {first.seq_nr}..{last.seq_nr} at {first.db_timestamp:%H:%M:%S.%f}"
        )

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
            await asyncio.sleep(0.005)
        await asyncio.gather(*self.held)

    def expected(self) -> set[tuple[str, int]]:
        return {(p, s) for p in self.pids for s in range(self.first[p], self.highest[p] + 1)}


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_erasures_retention_late_commits_and_a_rescale_leave_exact_read_models(
    pg_dsn: str, schema: str
) -> None:
    async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        table = sql.Identifier(schema, "soak_model")
        pids = [f"{ENTITY}|id-{i}" for i in range(IDS)]
        async with j.pool.connection() as conn:
            await conn.execute(
                sql.SQL("CREATE TABLE {} (pid text, seq_nr bigint, PRIMARY KEY (pid, seq_nr))")
                .format(table)
            )  # fmt: skip
        insert = sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table)
        forget = sql.SQL("DELETE FROM {} WHERE pid = %s AND seq_nr < %s").format(table)
        forget_all = sql.SQL("DELETE FROM {} WHERE pid = %s").format(table)

        handled: dict[str, list[str]] = {p: [] for p in pids}

        async def handler(conn: Any, env: Any) -> None:
            handled[env.persistence_id].append(
                f"{'D' if env.deleted else ''}{env.seq_nr}@{env.db_timestamp:%S.%f}"
            )
            if env.deleted:  # the id was erased: so is what was derived from it
                if env.seq_nr == 0:
                    await conn.execute(forget_all, (env.persistence_id,))
                else:
                    await conn.execute(forget, (env.persistence_id, env.seq_nr))
            else:
                await conn.execute(insert, (env.persistence_id, env.seq_nr))

        group = ProjectionGroup(
            lambda r: Projection.exactly_once(
                j, name="soak", entity_type=ENTITY, slice_range=r, handler=handler,
                settings=FAST,
            ),
            4,
        )  # fmt: skip
        retention = Retention(j, RetentionSettings(batch_size=20))
        await retention.register("soak", ENTITY)
        owners = [Owner(j, pids[k::4], seed=k) for k in range(4)]
        stop = asyncio.Event()
        writers = [asyncio.create_task(o.run(stop)) for o in owners]
        await group.start()
        deleted = 0
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n in (8, 2):
            until = loop.time() + 6
            while loop.time() < until:
                deleted += (await retention.apply(RetentionPolicy(ENTITY, keep_last=2))).events
                assert group.failed() is None, group.failed()
                await asyncio.sleep(0.05)
            await group.rescale(n)
        stop.set()
        await asyncio.gather(*writers)
        assert loop.time() - started < 60

        expected = set().union(*(o.expected() for o in owners))

        async def model() -> set[tuple[str, int]]:
            return {
                (p, int(s))
                for p, s in await fetch(j.dsn, sql.SQL("SELECT * FROM {}").format(table))
            }

        async def exact() -> bool:
            return await model() == expected

        try:
            await eventually(exact, "the read model holds every id's last lifetime", within=60)
        except BaseException:
            found = await model()
            missing, extra = sorted(expected - found), sorted(found - expected)
            bad = (missing or extra)[0][0]
            journal_rows = await fetch(
                j.dsn,
                sql.SQL(
                    "SELECT seq_nr, deleted, event_ser_manifest FROM {} "
                    "WHERE persistence_id = %s ORDER BY seq_nr"
                ).format(j.tables.journal),
                (bad,),
            )
            offsets = await fetch(
                j.dsn,
                sql.SQL(
                    "SELECT seq_nr, timestamp_offset FROM {} WHERE persistence_id = %s "
                    "ORDER BY timestamp_offset"
                ).format(sql.Identifier(schema, "projection_timestamp_offset_store")),
                (bad,),
            )
            owner = next(o for o in owners if bad in o.pids)
            raise AssertionError(
                f"missing {missing[:20]}, extra {extra[:20]}; {bad}: owner's lifetime "
                f"{owner.first[bad]}..{owner.highest[bad]}, journal {journal_rows[:5]} .. "
                f"{journal_rows[-3:]}, model {sorted(s for p, s in found if p == bad)[:5]}; "
                f"what the owner did: {owner.history[bad][-40:]}; what the handler got (D: "
                f"deleted): {handled[bad][-80:]}; offset rows: {offsets}"
            ) from None
        assert group.failed() is None, group.failed()
        await group.stop()
        # Retention after the projection caught up, then the journal itself: nothing of
        # an erased lifetime is left live.
        await retention.apply(RetentionPolicy(ENTITY, keep_last=2))
        live = {
            (p, int(s))
            for p, s in await fetch(
                j.dsn,
                sql.SQL("SELECT persistence_id, seq_nr FROM {} WHERE NOT deleted").format(
                    j.tables.journal
                ),
            )
        }
        assert live <= expected
        assert await model() == expected
        erasures = {k: sum(o.erasures[k] for o in owners) for k in ("reset", "kept")}
        assert erasures["reset"] > 0 and erasures["kept"] > 0, erasures
        assert sum(o.late for o in owners) > 0 and deleted > 0

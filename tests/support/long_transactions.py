"""Long transactions against the journal, held open for real, beside short writes.

The case Pekko's query misses: an event whose transaction commits after
backtracking has passed its timestamp. Shared by the horizon tests of the live
query and of the Spark stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from journal import BacktrackingSettings, HorizonSettings, Journal, JournalSettings
from tests.support import bank
from tests.support.pekko import PekkoEvent, pekko_insert
from tests.support.pg import fast_query_settings

# Backtracking re-reads 9 s: every long transaction below outlasts it.
BACKTRACKING = BacktrackingSettings(window=6, behind_current_time=3)


def horizon_settings(schema: str, **horizon: Any) -> JournalSettings:
    return JournalSettings(
        schema=schema,
        pool_max_size=40,
        query=fast_query_settings(
            buffer_size=100, backtracking=BACKTRACKING, horizon=HorizonSettings(**horizon)
        ),
    )


class LongWriters:
    """Transactions open for 15-25 s, written by us and Pekko-style, some idle first."""

    def __init__(self, j: Journal, pg_dsn: str) -> None:
        self.j = j
        self.pg_dsn = pg_dsn
        self.pids: list[str] = []

    async def _hold(
        self,
        name: str,
        after: float,
        idle: float,
        held: float,
        write: Callable[[Any, str], Awaitable[None]],
    ) -> None:
        pid = f"{bank.ENTITY}|long-{name}"
        self.pids.append(pid)
        await asyncio.sleep(after)
        async with await psycopg.AsyncConnection.connect(self.pg_dsn) as conn:
            await conn.execute("SELECT 1")  # the transaction (and its timestamp) starts here
            await asyncio.sleep(idle)
            await write(conn, pid)
            await asyncio.sleep(held)
            await conn.commit()

    async def _ours(self, conn: Any, pid: str) -> None:
        await self.j.append(pid, [{"amount": 7}, {"amount": 3}], expected_seq_nr=0, conn=conn)

    async def _pekko(self, conn: Any, pid: str) -> None:
        events = [PekkoEvent("", '{"amount": 5}'), PekkoEvent("", '{"amount": 1}')]
        await pekko_insert(conn, self.j.settings.schema, pid, 1, events)

    async def run(self) -> None:
        await asyncio.gather(
            # Idle past max_hold, then they write: not waited for, re-read once they end.
            self._hold("ours-idle-15", 0, 15, 0, self._ours),
            self._hold("pekko-idle-12-held-10", 0, 12, 10, self._pekko),
            # Writing at once: the tail waits for them.
            self._hold("ours-25", 16, 0, 25, self._ours),
            self._hold("pekko-18", 18, 0, 18, self._pekko),
        )


async def short_writes(j: Journal, stop: asyncio.Event, seed: int) -> int:
    rng = random.Random(seed)
    pids = [bank.account(seed * 1000 + i) for i in range(50)]
    seq = dict.fromkeys(pids, 0)
    written = 0
    while not stop.is_set():
        pid = rng.choice(pids)
        n = rng.randint(1, 2)
        await j.append(pid, [{"amount": rng.randint(1, 9)}] * n, expected_seq_nr=seq[pid])
        seq[pid] += n
        written += n
        await asyncio.sleep(rng.uniform(0.01, 0.05))
    return written


async def stop_all(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


class HeldTransaction:
    """One transaction the test opens, writes into and commits when it says so: through
    `append(conn=)` (ours) or Pekko's INSERTs, two events of a persistence id of its own."""

    def __init__(self, j: Journal, pg_dsn: str, name: str, *, pekko: bool) -> None:
        self.j = j
        self.pg_dsn = pg_dsn
        self.pid = f"{bank.ENTITY}|held-{name}"
        self.pekko = pekko
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def begin(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(self.pg_dsn)
        await self._conn.execute("SELECT 1")  # the transaction (and its timestamp) starts here

    async def write(self) -> None:
        assert self._conn is not None
        if self.pekko:
            events = [PekkoEvent("", '{"amount": 5}'), PekkoEvent("", '{"amount": 1}')]
            await pekko_insert(self._conn, self.j.settings.schema, self.pid, 1, events)
        else:
            events_ = [{"amount": 7}, {"amount": 3}]
            await self.j.append(self.pid, events_, expected_seq_nr=0, conn=self._conn)

    async def commit(self) -> None:
        assert self._conn is not None
        await self._conn.commit()
        await self._conn.close()

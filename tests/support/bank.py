"""The projection tests' bank workload, on the shared example domain.

The read model and its handlers are `slicejournal.examples.bank.BalancesReadModel`'s
(the demo's): `balances (pid, balance)` and a row per applied event in
`applied`, whose primary key (pid, seq_nr) — unless a test asks for none —
makes applying any event twice an error the test sees. The tests' writers
append untyped JSON `{"amount": +n | -n}` to their own entity type, on
accounts spread over every slice, some holding their transaction open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from typing import Any

import psycopg
from psycopg import sql

from journal import Journal
from slicejournal.examples.bank import BalancesReadModel

ENTITY = "Bank"


def account(i: int) -> str:
    return f"{ENTITY}|account-{i * 7919 % 100003}"


def read_model(j: Journal) -> BalancesReadModel:
    return BalancesReadModel(j.settings.schema)


async def create_read_model(j: Journal, *, with_primary_key: bool = True) -> None:
    async with await psycopg.AsyncConnection.connect(j.dsn, autocommit=True) as conn:
        await read_model(j).create(conn, applied_key=with_primary_key)


def table(j: Journal, name: str) -> sql.Identifier:
    return sql.Identifier(j.settings.schema, name)


def make_handler(j: Journal) -> Any:
    """The read model's handler of one envelope (exactly-once, at-least-once)."""
    return read_model(j).handle_one


def make_grouped_handler(j: Journal) -> Any:
    """The read model's handler of a batch (grouped delivery)."""
    return read_model(j).handle


class Writers:
    """Concurrent writers over `accounts` accounts; some hold their transaction open."""

    def __init__(
        self, j: Journal, accounts: int = 500, *, late_fraction: float = 0.1, seed: int = 1
    ) -> None:
        self.j = j
        self.pids = [account(i) for i in range(accounts)]
        self.seq = dict.fromkeys(self.pids, 0)
        self.rng = random.Random(seed)
        self.late_fraction = late_fraction
        self.late = 0
        self.written = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _writer(self, w: int, writers: int, max_batches: int | None) -> None:
        mine = self.pids[w::writers]
        n = 0
        while not self._stop.is_set() and (max_batches is None or n < max_batches):
            n += 1
            pid = self.rng.choice(mine)
            events = [{"amount": self.rng.randint(-50, 100)} for _ in range(self.rng.randint(1, 3))]
            if self.rng.random() < self.late_fraction:
                async with await psycopg.AsyncConnection.connect(self.j.dsn) as conn:
                    await self.j.append(pid, events, expected_seq_nr=self.seq[pid], conn=conn)
                    self.seq[pid] += len(events)
                    self.late += 1
                    await asyncio.sleep(self.rng.uniform(1, 5))
                    await conn.commit()
            else:
                await self.j.append(pid, events, expected_seq_nr=self.seq[pid])
                self.seq[pid] += len(events)
            self.written += len(events)
            await asyncio.sleep(self.rng.uniform(0, 0.02))

    def start(self, writers: int = 6, max_batches: int | None = None) -> None:
        self._tasks = [
            asyncio.get_running_loop().create_task(self._writer(w, writers, max_batches))
            for w in range(writers)
        ]

    async def wait(self) -> None:
        await asyncio.gather(*self._tasks)

    async def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks)


async def expected_balances(j: Journal) -> dict[str, int]:
    """Balances recomputed from the journal itself."""
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT persistence_id, event_payload FROM {} WHERE NOT deleted").format(
                j.tables.journal
            )
        )
        out: dict[str, int] = {}
        for pid, payload in await cur.fetchall():
            out[pid] = out.get(pid, 0) + json.loads(bytes(payload))["amount"]
        return out


async def journal_count(j: Journal) -> int:
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(j.tables.journal))
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def projected(j: Journal) -> tuple[dict[str, int], int, int]:
    """(balances, applied rows, distinct applied (pid, seq_nr))."""
    model = read_model(j)
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        balances = await model.balances(conn)
        applied, distinct = await model.applied(conn)
        return balances, applied, distinct


async def assert_applied_exactly_once(j: Journal, *, within: float = 90.0) -> None:
    """Every journal event applied, none twice (`applied` without a key shows doubles as
    second rows), and balances equal to the journal's."""
    await wait_until_projected(j, within)
    balances, applied, distinct = await projected(j)
    total = await journal_count(j)
    assert (applied, distinct) == (total, total), "an event was applied twice or not at all"
    assert balances == await expected_balances(j)


async def wait_until_projected(j: Journal, within: float = 60.0) -> None:
    """Wait until every journal event has been applied (distinct), or time out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    total = await journal_count(j)
    while loop.time() < deadline:
        _, _, distinct = await projected(j)
        if distinct >= total:
            return
        await asyncio.sleep(0.2)

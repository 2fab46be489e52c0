"""A bank-account workload and read model shared by the projection tests.

Events are JSON dicts `{"amount": +n | -n}`; the read model is a balances
table plus an `applied` table whose primary key (pid, seq_nr) makes applying
any event twice an error the test sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from journal import EventEnvelope, Journal

ENTITY = "Bank"


def account(i: int) -> str:
    return f"{ENTITY}|account-{i * 7919 % 100003}"


async def create_read_model(j: Journal, *, with_primary_key: bool = True) -> None:
    pk = "PRIMARY KEY (pid, seq_nr)" if with_primary_key else "n serial"
    async with await psycopg.AsyncConnection.connect(j.dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {b} (pid text PRIMARY KEY, balance bigint NOT NULL);"
                "CREATE TABLE {a} (pid text NOT NULL, seq_nr bigint NOT NULL, " + pk + ")"
            ).format(b=table(j, "balances"), a=table(j, "applied"))
        )


def table(j: Journal, name: str) -> sql.Identifier:
    return sql.Identifier(j.settings.schema, name)


def make_handler(j: Journal) -> Any:
    applied = sql.SQL("INSERT INTO {} (pid, seq_nr) VALUES (%s, %s)").format(table(j, "applied"))
    balance = sql.SQL(
        "INSERT INTO {b} (pid, balance) VALUES (%s, %s) "
        "ON CONFLICT (pid) DO UPDATE SET balance = {b}.balance + excluded.balance"
    ).format(b=table(j, "balances"))

    async def handler(conn: AsyncConnection[Any], env: EventEnvelope) -> None:
        await conn.execute(applied, (env.persistence_id, env.seq_nr))
        await conn.execute(balance, (env.persistence_id, env.event["amount"]))

    return handler


def make_grouped_handler(j: Journal) -> Any:
    single = make_handler(j)

    async def handler(conn: AsyncConnection[Any], envs: list[EventEnvelope]) -> None:
        for env in envs:
            await single(conn, env)

    return handler


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
        import json

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
    async with await psycopg.AsyncConnection.connect(j.dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT pid, balance FROM {}").format(table(j, "balances"))
        )
        balances = {p: b for p, b in await cur.fetchall()}
        cur = await conn.execute(
            sql.SQL("SELECT count(*), count(DISTINCT (pid, seq_nr)) FROM {}").format(
                table(j, "applied")
            )
        )
        row = await cur.fetchone()
        assert row is not None
        return balances, int(row[0]), int(row[1])


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

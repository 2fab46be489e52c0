"""The bank-account example: the one domain of the demo, the Spark demo and the tests.

- Events `Deposited` / `Withdrawn` (typed, registered as `bank.Deposited` and
  `bank.Withdrawn`) and the aggregate state `Account` with `evolve` and a
  random command `decide`. Writers that append untyped JSON `{"amount": ±n}`
  instead (the tests' raw writers) are understood too: `amount_of` reads both.
- `BalancesReadModel`: the projection's target, a row per account in
  `balances (pid, balance)` and a row per applied event in `applied (pid,
  seq_nr, db_timestamp, applied_at)`, with handlers for grouped and
  single-envelope delivery, async and sync. `applied` has no key by default, so
  an event applied twice shows as a second row; `create(applied_key=True)`
  makes it a primary key instead, so applying one twice fails its transaction.
- `BankWorkload`: concurrent aggregates writing commands, and the balances they
  say they hold, checked against the read model and a replay of the journal.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import psycopg
from psycopg import AsyncConnection, sql

from journal.aio.aggregate import AggregateRepository
from journal.aio.journal import Journal
from journal.model import EventEnvelope
from journal.serialization import SerializerRegistry
from journal.slices import PersistenceId, slice_ranges

ENTITY_TYPE = "Account"
BALANCES_TABLE = "balances"
APPLIED_TABLE = "applied"


@attrs.frozen
class Deposited:
    amount: int


@attrs.frozen
class Withdrawn:
    amount: int


@attrs.frozen
class Account:
    balance: int = 0


def amount_of(event: Any) -> int:
    """The change an event makes to its account's balance: typed events, or the
    untyped JSON `{"amount": n}` (negative for a withdrawal)."""
    if isinstance(event, Deposited):
        return event.amount
    if isinstance(event, Withdrawn):
        return -event.amount
    if isinstance(event, Mapping):
        return int(event["amount"])
    raise TypeError(f"unknown event {event!r}")


def evolve(state: Account, event: Any) -> Account:
    if isinstance(event, Deposited):
        return Account(state.balance + event.amount)
    if isinstance(event, Withdrawn):
        return Account(state.balance - event.amount)
    raise TypeError(f"unknown event {event!r}")


def bank_serializers() -> SerializerRegistry:
    registry = SerializerRegistry()
    registry.register(Deposited, "bank.Deposited")
    registry.register(Withdrawn, "bank.Withdrawn")
    registry.register(Account, "bank.Account")
    return registry


def decide(rng: random.Random) -> Any:
    """A random command: withdraw (if the balance allows, 40 %) or deposit 1..100."""

    def command(state: Account) -> list[Any]:
        amount = rng.randint(1, 100)
        if state.balance >= amount and rng.random() < 0.4:
            return [Withdrawn(amount)]
        return [Deposited(amount)]

    return command


class BalancesReadModel:
    """The projection's target: a row per account, and a row per applied event."""

    def __init__(self, schema: str | None) -> None:
        # schema None: unqualified names, resolved by search_path (what a rebuild needs).
        qualify = (schema,) if schema is not None else ()
        self.balances_table = sql.Identifier(*qualify, BALANCES_TABLE)
        self.applied_table = sql.Identifier(*qualify, APPLIED_TABLE)
        self.upsert = sql.SQL(
            "INSERT INTO {t} (pid, balance) VALUES (%s, %s) ON CONFLICT (pid) "
            "DO UPDATE SET balance = {t}.balance + excluded.balance"
        ).format(t=self.balances_table)
        self.insert_applied = sql.SQL(
            "INSERT INTO {} (pid, seq_nr, db_timestamp) VALUES (%s, %s, %s)"
        ).format(self.applied_table)
        # A batch in two statements (one round trip each, never pipelined: a fenced
        # transaction must sync every statement for its idle timeout to hold).
        self.upsert_batch = sql.SQL(
            "INSERT INTO {t} (pid, balance) SELECT * FROM unnest(%s::text[], %s::bigint[]) "
            "ON CONFLICT (pid) DO UPDATE SET balance = {t}.balance + excluded.balance"
        ).format(t=self.balances_table)
        self.insert_applied_batch = sql.SQL(
            "INSERT INTO {} (pid, seq_nr, db_timestamp) "
            "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::timestamptz[])"
        ).format(self.applied_table)

    async def create(self, conn: AsyncConnection[Any], *, applied_key: bool = False) -> None:
        """The two tables; `applied_key`: (pid, seq_nr) is `applied`'s primary key."""
        key = ", PRIMARY KEY (pid, seq_nr)" if applied_key else ""
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {b} (pid text PRIMARY KEY, balance bigint NOT NULL);"
                "CREATE TABLE IF NOT EXISTS {a} (pid text NOT NULL, seq_nr bigint NOT NULL, "
                "db_timestamp timestamptz, "
                "applied_at timestamptz NOT NULL DEFAULT clock_timestamp()" + key + ")"
            ).format(b=self.balances_table, a=self.applied_table)
        )

    def rows(self, envelopes: list[EventEnvelope]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """The parameters of `upsert_batch` (one delta per account) and
        `insert_applied_batch` (one row per event), as arrays."""
        deltas: dict[str, int] = {}
        for env in envelopes:
            pid = env.persistence_id
            deltas[pid] = deltas.get(pid, 0) + amount_of(env.event)
        applied = (
            [e.persistence_id for e in envelopes],
            [e.seq_nr for e in envelopes],
            [e.db_timestamp for e in envelopes],
        )
        return (list(deltas), list(deltas.values())), applied

    async def handle(self, conn: AsyncConnection[Any], envelopes: list[EventEnvelope]) -> None:
        """A batch of events, in the transaction that also stores their offsets."""
        upserts, applied = self.rows(envelopes)
        await conn.execute(self.upsert_batch, upserts)
        await conn.execute(self.insert_applied_batch, applied)

    async def handle_one(self, conn: AsyncConnection[Any], envelope: EventEnvelope) -> None:
        """One event (exactly-once or at-least-once delivery of single envelopes)."""
        env = envelope
        await conn.execute(self.insert_applied, (env.persistence_id, env.seq_nr, env.db_timestamp))
        await conn.execute(self.upsert, (env.persistence_id, amount_of(env.event)))

    def handle_sync(self, conn: psycopg.Connection[Any], envelopes: list[EventEnvelope]) -> None:
        """`handle` for a synchronous connection (the Spark executors)."""
        upserts, applied = self.rows(envelopes)
        conn.execute(self.upsert_batch, upserts)
        conn.execute(self.insert_applied_batch, applied)

    async def balances(self, conn: AsyncConnection[Any]) -> dict[str, int]:
        cur = await conn.execute(sql.SQL("SELECT pid, balance FROM {}").format(self.balances_table))
        return {a: b for a, b in await cur.fetchall()}

    async def applied(self, conn: AsyncConnection[Any]) -> tuple[int, int]:
        """(rows, distinct events) in the applied table."""
        cur = await conn.execute(
            sql.SQL("SELECT count(*), count(DISTINCT (pid, seq_nr)) FROM {}").format(
                self.applied_table
            )
        )
        rows, distinct = await cur.fetchone() or (0, 0)
        return int(rows), int(distinct)

    async def missing(
        self, conn: AsyncConnection[Any], journal: sql.Identifier, entity_type: str = ENTITY_TYPE
    ) -> int:
        """Journal events of `entity_type` that were never applied."""
        cur = await conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {j} e WHERE e.entity_type = %s AND NOT e.deleted "
                "AND NOT EXISTS (SELECT 1 FROM {a} a WHERE a.pid = e.persistence_id "
                "AND a.seq_nr = e.seq_nr)"
            ).format(j=journal, a=self.applied_table),
            (entity_type,),
        )
        return int((await cur.fetchone() or (0,))[0])

    async def lag_ms(self, conn: AsyncConnection[Any]) -> tuple[float, float]:
        """p50 and p99 of applied_at - db_timestamp, in milliseconds."""
        cur = await conn.execute(
            sql.SQL(
                "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY "
                "extract(epoch FROM applied_at - db_timestamp) * 1000) FROM {}"
            ).format(self.applied_table)
        )
        row = await cur.fetchone()
        values = row[0] if row and row[0] else [0.0, 0.0]
        return float(values[0]), float(values[1])


@attrs.frozen
class Verification:
    """The read model checked against the aggregates and a replay of the journal."""

    missing: int
    mismatches: int
    replay_events: int
    replay_seconds: float


class BankWorkload:
    """Concurrent bank-account aggregates and the balances they say they hold."""

    def __init__(self, journal: Journal, accounts: int) -> None:
        self.repo: AggregateRepository[Account, Any] = AggregateRepository(
            journal, initial=Account, evolve=evolve, snapshot_every=20
        )
        self.pids = [PersistenceId.of(ENTITY_TYPE, f"acc-{i}").id for i in range(accounts)]
        self.expected: dict[str, int] = {}
        self.written = 0

    async def write(
        self,
        count: int,
        writers: int,
        *,
        seed: int = 0,
        on_write: Callable[[int], None] | None = None,
    ) -> None:
        """`count` commands spread over `writers` concurrent writers; `on_write(written)`
        after each."""

        async def writer(rng: random.Random, n: int) -> None:
            for _ in range(n):
                pid = rng.choice(self.pids)
                loaded = await self.repo.update(pid, decide(rng))
                self.expected[pid] = loaded.state.balance
                self.written += 1
                if on_write is not None:
                    on_write(self.written)

        shares = split_evenly(count, writers)
        await asyncio.gather(*(writer(random.Random(seed + i), n) for i, n in enumerate(shares)))

    async def verify(self, journal: Journal, model: BalancesReadModel) -> Verification:
        async with journal.pool.connection() as conn:
            balances = await model.balances(conn)
            missing = await model.missing(conn, journal.tables.journal)
        replayed, replay_events, replay_s = await replay(journal)
        mismatches = sum(
            1
            for pid, balance in self.expected.items()
            if balances.get(pid) != balance or replayed.get(pid) != balance
        )
        return Verification(missing, mismatches, replay_events, replay_s)


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` as `parts` counts that differ by at most one."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def replay(journal: Journal) -> tuple[dict[str, int], int, float]:
    """Balances replayed from the journal by slice (4 ranges): (balances, events, seconds)."""
    replayed: dict[str, int] = {}
    started = time.perf_counter()
    events = 0
    for r in slice_ranges(4):
        async for env in journal.current_events_by_slices(ENTITY_TYPE, r.min_slice, r.max_slice):
            replayed[env.persistence_id] = evolve(
                Account(replayed.get(env.persistence_id, 0)), env.event
            ).balance
            events += 1
    return replayed, events, time.perf_counter() - started

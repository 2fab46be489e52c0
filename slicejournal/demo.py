"""`slicejournal demo`: the whole pipeline on a real (embedded) PostgreSQL.

Concurrent bank-account aggregates persist deposits and withdrawals with
optimistic concurrency and snapshots, while a grouped exactly-once projection keeps
a balances table up to date over 4 slice ranges — rescaled to 8 and then to 2
while the writers run. At the end the read model is checked against the
aggregates and against a replay of the journal by slice.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import attrs
import psycopg
from psycopg import AsyncConnection, sql

from journal.aggregate import AggregateRepository
from journal.dsn import display_dsn
from journal.errors import JournalError
from journal.journal import Journal
from journal.model import EventEnvelope
from journal.serialization import SerializerRegistry
from journal.settings import JournalSettings
from journal.slices import PersistenceId, slice_ranges
from slicejournal.demo_schema import claim_demo_schema

ENTITY_TYPE = "Account"
READ_MODEL_TABLE = "balances"


@attrs.frozen
class Deposited:
    amount: int


@attrs.frozen
class Withdrawn:
    amount: int


@attrs.frozen
class Account:
    balance: int = 0


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
    def command(state: Account) -> list[Any]:
        amount = rng.randint(1, 100)
        if state.balance >= amount and rng.random() < 0.4:
            return [Withdrawn(amount)]
        return [Deposited(amount)]

    return command


class BalancesReadModel:
    """The projection's target: one row per account, updated in the offset transaction."""

    def __init__(self, schema: str) -> None:
        self.table = sql.Identifier(schema, READ_MODEL_TABLE)
        self.lags: list[float] = []
        self._upsert = sql.SQL(
            "INSERT INTO {t} (account, balance) VALUES (%s, %s) ON CONFLICT (account) "
            "DO UPDATE SET balance = {t}.balance + excluded.balance"
        ).format(t=self.table)

    async def create(self, conn: AsyncConnection[Any]) -> None:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (account text PRIMARY KEY, balance bigint NOT NULL)"
            ).format(self.table)
        )

    async def handle(self, conn: AsyncConnection[Any], envelopes: list[EventEnvelope]) -> None:
        """A batch of events, in the transaction that also stores their offsets."""
        deltas: dict[str, int] = {}
        for env in envelopes:
            event = env.event
            delta = event.amount if isinstance(event, Deposited) else -event.amount
            deltas[env.persistence_id] = deltas.get(env.persistence_id, 0) + delta
        async with conn.cursor() as cur:
            await cur.executemany(self._upsert, list(deltas.items()))
        now = datetime.now(UTC)
        self.lags.extend((now - env.db_timestamp).total_seconds() for env in envelopes)

    async def balances(self, conn: AsyncConnection[Any]) -> dict[str, int]:
        cur = await conn.execute(sql.SQL("SELECT account, balance FROM {}").format(self.table))
        return {a: b for a, b in await cur.fetchall()}


# A demo that stalls says so instead of hanging (every step normally takes < 1 s).
STALL_LIMIT = 60.0


async def _bounded(step: Coroutine[Any, Any, None], what: str) -> None:
    try:
        async with asyncio.timeout(STALL_LIMIT):
            await step
    except TimeoutError:
        raise JournalError(f"{what} did not finish within {STALL_LIMIT:.0f} s") from None


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` as `parts` counts that differ by at most one."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def run_demo(dsn: str | None, settings: JournalSettings, args: argparse.Namespace) -> int:
    from projections import Projection, ProjectionGroup

    # The schema is checked (and claimed) below, before anything is written.
    async with Journal.connect(
        dsn, settings, serializers=bank_serializers(), check_schema=False
    ) as journal:
        print(f"journal  PostgreSQL at {display_dsn(journal.dsn)}, schema {settings.schema!r}")
        async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
            await claim_demo_schema(conn, settings, (READ_MODEL_TABLE,))
        await journal.create_schema()
        model = BalancesReadModel(settings.schema)
        async with journal.pool.connection() as conn:
            await model.create(conn)

        repo: AggregateRepository[Account, Any] = AggregateRepository(
            journal, initial=Account, evolve=evolve, snapshot_every=20
        )
        pids = [PersistenceId.of(ENTITY_TYPE, f"acc-{i}").id for i in range(args.accounts)]
        expected: dict[str, int] = {}
        written = 0
        total = args.events
        # Rescale after a third and after two thirds of the events are written.
        milestones = [(total // 3, asyncio.Event()), (2 * total // 3, asyncio.Event())]

        async def writer(seed: int, count: int) -> None:
            nonlocal written
            rng = random.Random(seed)
            for _ in range(count):
                pid = rng.choice(pids)
                loaded = await repo.update(pid, decide(rng))
                expected[pid] = loaded.state.balance
                written += 1
                for threshold, reached in milestones:
                    if written >= threshold:
                        reached.set()

        group = ProjectionGroup(
            lambda r: Projection.grouped(
                journal,
                name="balances",
                entity_type=ENTITY_TYPE,
                slice_range=r,
                handler=model.handle,
            ),
            4,
        )
        started = time.perf_counter()
        await group.start()
        writers = asyncio.gather(
            *(writer(i, n) for i, n in enumerate(split_evenly(total, args.writers)))
        )
        for (_, milestone), instances in zip(milestones, (8, 2), strict=True):
            reached: asyncio.Future[Any] = asyncio.ensure_future(milestone.wait())
            await asyncio.wait([reached, writers], return_when=asyncio.FIRST_COMPLETED)
            reached.cancel()
            if writers.done() and writers.exception() is not None:
                await group.stop()
                await writers  # raises the writer's error
            await _bounded(group.rescale(instances), f"rescaling to {instances} instances")
            print(
                f"rescale  {written} events written: projection now runs "
                f"{instances} instances over slice ranges of {1024 // instances}"
            )
        await writers
        write_s = time.perf_counter() - started
        projected, progressed_at = 0, time.monotonic()
        while projected < written:
            if (failure := group.failed()) is not None:
                raise failure
            if time.monotonic() - progressed_at > STALL_LIMIT:
                raise JournalError(
                    f"the projection made no progress for {STALL_LIMIT:.0f} s "
                    f"({projected} of {written} events projected)"
                )
            await asyncio.sleep(0.05)
            now_projected = sum(s.accepted for s in group.stats())
            if now_projected > projected:
                projected, progressed_at = now_projected, time.monotonic()
        project_s = time.perf_counter() - started
        await _bounded(group.stop(), "stopping the projection")
        duplicates = sum(s.duplicates for s in group.stats())

        async with journal.pool.connection() as conn:
            balances = await model.balances(conn)
        replayed: dict[str, int] = {}
        replay_started = time.perf_counter()
        replay_events = 0
        for r in slice_ranges(4):
            async for env in journal.current_events_by_slices(
                ENTITY_TYPE, r.min_slice, r.max_slice
            ):
                replayed[env.persistence_id] = evolve(
                    Account(replayed.get(env.persistence_id, 0)), env.event
                ).balance
                replay_events += 1
        replay_s = time.perf_counter() - replay_started
        mismatches = sum(
            1
            for pid, balance in expected.items()
            if balances.get(pid) != balance or replayed.get(pid) != balance
        )
        lags = sorted(model.lags)
        p50 = statistics.median(lags) * 1000
        p99 = lags[int(len(lags) * 0.99) - 1] * 1000 if lags else 0.0
        print(
            f"write    {written} events, {len(expected)} accounts, {args.writers} concurrent "
            f"writers: {written / write_s:.0f} events/s, {repo.snapshots_saved} snapshots"
        )
        print(
            f"project  grouped exactly-once over 4 -> 8 -> 2 instances: "
            f"{projected / project_s:.0f} events/s, lag p50 {p50:.0f} ms, p99 {p99:.0f} ms"
        )
        print(
            f"replay   {replay_events} events by slice (4 ranges): "
            f"{replay_events / max(replay_s, 1e-9):.0f} events/s"
        )
        print(
            f"verify   events written={written} projected={projected} "
            f"duplicates dropped={duplicates} mismatches={mismatches}"
        )
        ok = mismatches == 0 and projected == written == replay_events
        print("OK" if ok else "FAILED")
        return 0 if ok else 1

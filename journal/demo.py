"""`slicejournal demo`: bank accounts written concurrently, then replayed by slice.

It shows the whole write side on a real (embedded) PostgreSQL: concurrent
aggregates with optimistic concurrency, snapshots, and a replay through
`current_events_by_slices` over four slice ranges that must add up to exactly
what was written.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import attrs
import psycopg
from psycopg import sql

from journal.aggregate import AggregateRepository
from journal.journal import Journal
from journal.serialization import SerializerRegistry
from journal.settings import JournalSettings
from journal.slices import PersistenceId, slice_ranges

ENTITY_TYPE = "Account"


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


async def _reset(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


async def run_demo(dsn: str | None, settings: JournalSettings, args: argparse.Namespace) -> int:
    if settings.schema == "public":
        settings = attrs.evolve(settings, schema="slicejournal_demo")
    async with Journal.connect(dsn, settings, serializers=bank_serializers()) as journal:
        await _reset(journal.dsn, settings.schema)
        await journal.create_schema()
        repo: AggregateRepository[Account, Any] = AggregateRepository(
            journal, initial=Account, evolve=evolve, snapshot_every=20
        )
        pids = [PersistenceId.of(ENTITY_TYPE, f"acc-{i}").id for i in range(args.accounts)]
        expected: dict[str, int] = {}
        conflicts = 0
        written = 0

        async def writer(seed: int, count: int) -> None:
            nonlocal conflicts, written
            rng = random.Random(seed)
            for _ in range(count):
                pid = rng.choice(pids)
                before = repo_conflicts()
                loaded = await repo.update(pid, decide(rng))
                conflicts += repo_conflicts() - before
                expected[pid] = loaded.state.balance
                written += 1

        def repo_conflicts() -> int:
            return 0

        started = time.perf_counter()
        per_writer = args.events // args.writers
        await asyncio.gather(*(writer(i, per_writer) for i in range(args.writers)))
        write_s = time.perf_counter() - started

        started = time.perf_counter()
        replayed: dict[str, int] = {}
        events = 0
        for r in slice_ranges(4):
            async for env in journal.current_events_by_slices(
                ENTITY_TYPE, r.min_slice, r.max_slice
            ):
                balance = replayed.get(env.persistence_id, 0)
                replayed[env.persistence_id] = evolve(Account(balance), env.event).balance
                events += 1
        replay_s = time.perf_counter() - started
        mismatches = sum(1 for pid, bal in expected.items() if replayed.get(pid) != bal)
        print(
            f"wrote    {written} events for {len(expected)} accounts with {args.writers} "
            f"concurrent writers in {write_s:.2f}s ({written / write_s:.0f} events/s), "
            f"{repo.snapshots_saved} snapshots"
        )
        print(
            f"replayed {events} events over 4 slice ranges in {replay_s:.2f}s "
            f"({events / max(replay_s, 1e-9):.0f} events/s)"
        )
        print(f"verify   events written={written} replayed={events} mismatches={mismatches}")
        return 0 if mismatches == 0 and events == written else 1

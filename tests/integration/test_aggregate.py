"""`AggregateRepository` with a bank account: load, persist, snapshots, retries."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from journal import (
    AggregateRepository,
    ConcurrencyError,
    InvalidArgument,
    Journal,
    JournalSettings,
    Loaded,
    SerializerRegistry,
    slice_for,
)
from slicejournal.examples.bank import Deposited, Withdrawn
from tests.support.pg import Row, fetch

Event = Deposited | Withdrawn


@attrs.frozen
class Account:
    balance: int = 0
    events: int = 0  # how many events were folded in: must always equal the seq_nr


class InsufficientFunds(Exception):
    pass


def evolve(state: Account, event: Event) -> Account:
    if isinstance(event, Deposited):
        return Account(state.balance + event.amount, state.events + 1)
    return Account(state.balance - event.amount, state.events + 1)


def withdraw(amount: int) -> Any:
    def decide(state: Account) -> list[Event]:
        if state.balance < amount:
            raise InsufficientFunds(f"balance {state.balance} < {amount}")
        return [Withdrawn(amount)]

    return decide


Repo = AggregateRepository[Account, Event]


@pytest.fixture
async def bank(pg_dsn: str, schema: str) -> AsyncIterator[Journal]:
    registry = SerializerRegistry()
    registry.register(Deposited, "bank.Deposited")
    registry.register(Withdrawn, "bank.Withdrawn")
    registry.register(Account, "bank.Account")
    settings = JournalSettings(schema=schema, pool_max_size=20)
    async with Journal.connect(pg_dsn, settings, serializers=registry, create_schema=True) as j:
        yield j


def repo(journal: Journal, snapshot_every: int | None = None, evolve_fn: Any = evolve) -> Repo:
    return AggregateRepository(
        journal, initial=Account, evolve=evolve_fn, snapshot_every=snapshot_every
    )


async def stored_events(journal: Journal, pid: str) -> list[Any]:
    return [env.event async for env in journal.current_events_by_persistence_id(pid)]


async def snapshot_rows(pg_dsn: str, schema: str, pid: str) -> list[Row]:
    return await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT seq_nr, ser_manifest, convert_from(snapshot, 'UTF8') FROM {} "
            "WHERE persistence_id = %s"
        ).format(sql.Identifier(schema, "snapshot")),
        (pid,),
    )


async def test_load_and_persist(bank: Journal, pg_dsn: str, schema: str) -> None:
    accounts = repo(bank)
    pid = "Account|1"
    fresh = await accounts.load(pid)
    assert fresh == Loaded(pid, Account(0, 0), 0)

    after = await accounts.persist(fresh, [Deposited(10), Deposited(5)])
    assert after == Loaded(pid, Account(15, 2), 2)
    after = await accounts.persist(after, [Withdrawn(4)])
    assert after == Loaded(pid, Account(11, 3), 3)
    assert await accounts.load(pid) == after
    assert await stored_events(bank, pid) == [Deposited(10), Deposited(5), Withdrawn(4)]

    # persisting from a stale load conflicts and writes nothing
    with pytest.raises(ConcurrencyError):
        await accounts.persist(fresh, [Deposited(1000)])
    assert await accounts.persist(after, []) is after  # nothing to do
    assert await stored_events(bank, pid) == [Deposited(10), Deposited(5), Withdrawn(4)]
    assert await snapshot_rows(pg_dsn, schema, pid) == []  # snapshots disabled

    rows = await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT seq_nr, event_ser_manifest, convert_from(event_payload, 'UTF8') FROM {} "
            "WHERE persistence_id = %s ORDER BY seq_nr"
        ).format(sql.Identifier(schema, "event_journal")),
        (pid,),
    )
    assert rows == [
        (1, "bank.Deposited", '{"amount":10}'),
        (2, "bank.Deposited", '{"amount":5}'),
        (3, "bank.Withdrawn", '{"amount":4}'),
    ]


async def test_snapshot_every_n_and_load_from_snapshot(
    bank: Journal, pg_dsn: str, schema: str
) -> None:
    accounts = repo(bank, snapshot_every=3)
    pid = "Account|snap"
    loaded = await accounts.load(pid)
    for amount in (1, 2):
        loaded = await accounts.persist(loaded, [Deposited(amount)])
    assert await snapshot_rows(pg_dsn, schema, pid) == []
    loaded = await accounts.persist(loaded, [Deposited(3)])  # seq_nr 3
    assert await snapshot_rows(pg_dsn, schema, pid) == [
        (3, "bank.Account", '{"balance":6,"events":3}')
    ]
    for amount in (4, 5):
        loaded = await accounts.persist(loaded, [Deposited(amount)])  # seq_nr 4, 5
    assert [r[0] for r in await snapshot_rows(pg_dsn, schema, pid)] == [3]
    loaded = await accounts.persist(loaded, [Withdrawn(1), Deposited(6)])  # crosses 6 -> 7
    assert await snapshot_rows(pg_dsn, schema, pid) == [
        (7, "bank.Account", '{"balance":20,"events":7}')
    ]
    assert accounts.snapshots_saved == 2
    loaded = await accounts.persist(loaded, [Deposited(100)])  # seq_nr 8, no snapshot
    assert loaded == Loaded(pid, Account(120, 8), 8)

    snap = await bank.load_snapshot(pid)
    assert snap is not None and (snap.seq_nr, snap.state) == (7, Account(20, 7))

    # Remove the events the snapshot covers: only the snapshot can restore them now.
    assert await bank.delete_events_to(pid, 7) == 7
    assert await stored_events(bank, pid) == [Deposited(100)]
    assert await accounts.load(pid) == Loaded(pid, Account(120, 8), 8)
    # ... which a repository ignoring snapshots cannot:
    without = await repo(bank, snapshot_every=None).load(pid)
    assert without.state == Account(100, 1) and without.seq_nr == 8

    # and it continues correctly from there
    loaded = await accounts.update(pid, withdraw(20))
    assert loaded == Loaded(pid, Account(100, 9), 9)
    assert [r[0] for r in await snapshot_rows(pg_dsn, schema, pid)] == [9]


async def test_concurrent_updates_retry_until_all_deposits_are_stored(bank: Journal) -> None:
    accounts = repo(bank, snapshot_every=4)
    pid = "Account|busy"
    amounts = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    attempts: list[int] = []

    def deposit(amount: int) -> Any:
        def decide(state: Account) -> list[Event]:
            attempts.append(amount)
            return [Deposited(amount)]

        return decide

    results = await asyncio.gather(*(accounts.update(pid, deposit(a)) for a in amounts))
    assert len(attempts) > len(amounts), "no updater ever had to retry"
    assert sorted(r.seq_nr for r in results) == list(range(1, 11))
    for r in results:
        assert r.state.events == r.seq_nr  # each result is a consistent state

    final = await accounts.load(pid)
    assert final == Loaded(pid, Account(sum(amounts), 10), 10)
    events = await stored_events(bank, pid)
    assert sorted(e.amount for e in events) == amounts
    assert await repo(bank, snapshot_every=None).load(pid) == final


async def test_decide_that_raises_writes_nothing(bank: Journal, pg_dsn: str, schema: str) -> None:
    accounts = repo(bank, snapshot_every=1)
    pid = "Account|poor"
    await accounts.update(pid, lambda state: [Deposited(5)])
    with pytest.raises(InsufficientFunds, match="balance 5 < 6"):
        await accounts.update(pid, withdraw(6))

    async def async_reject(state: Account) -> list[Event]:
        await asyncio.sleep(0)
        raise InsufficientFunds("async no")

    with pytest.raises(InsufficientFunds, match="async no"):
        await accounts.update(pid, async_reject)
    assert await stored_events(bank, pid) == [Deposited(5)]
    assert [r[0] for r in await snapshot_rows(pg_dsn, schema, pid)] == [1]
    assert await accounts.update(pid, withdraw(5)) == Loaded(pid, Account(0, 2), 2)


async def test_update_gives_up_after_max_attempts(bank: Journal) -> None:
    accounts = repo(bank)
    pid = "Account|contended"
    calls = 0

    async def decide_while_someone_else_writes(state: Account) -> list[Event]:
        nonlocal calls
        calls += 1
        # another writer gets in between this load and the persist, every time
        highest = await bank.highest_seq_nr(pid)
        await bank.append(pid, [Deposited(1)], expected_seq_nr=highest)
        return [Withdrawn(1)]

    with pytest.raises(ConcurrencyError) as info:
        await accounts.update(pid, decide_while_someone_else_writes, max_attempts=3)
    assert calls == 3
    assert (info.value.expected_seq_nr, info.value.actual_seq_nr) == (2, 3)
    assert await stored_events(bank, pid) == [Deposited(1)] * 3

    calls = 0
    with pytest.raises(ConcurrencyError):
        await accounts.update(pid, decide_while_someone_else_writes, max_attempts=1)
    assert calls == 1
    assert await accounts.load(pid) == Loaded(pid, Account(4, 4), 4)


async def test_load_is_consistent_when_a_writer_commits_during_the_load(
    bank: Journal, pg_dsn: str, schema: str
) -> None:
    """The loaded seq_nr must be the one the loaded state reflects, never a later one."""
    pid = "Account|racy"
    plain = repo(bank)
    await plain.persist(await plain.load(pid), [Deposited(10)])
    insert = sql.SQL(
        "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, "
        "event_ser_id, event_ser_manifest, event_payload) "
        "VALUES (%s, 'Account', %s, 2, now(), 'other-service', 31, 'bank.Deposited', %s)"
    ).format(sql.Identifier(schema, "event_journal"))
    interfered = False

    def evolve_while_another_service_writes(state: Account, event: Event) -> Account:
        nonlocal interfered
        if not interfered:
            interfered = True
            # another process commits seq_nr 2 while this load is still folding
            with psycopg.connect(pg_dsn, autocommit=True) as other:
                other.execute(insert, (slice_for(pid), pid, json.dumps({"amount": 1}).encode()))
        return evolve(state, event)

    racy = repo(bank, evolve_fn=evolve_while_another_service_writes)
    loaded = await racy.load(pid)
    assert interfered
    assert loaded.state.events == loaded.seq_nr, loaded
    if loaded.seq_nr == 1:
        # the load missed seq_nr 2, so persisting from it must conflict
        with pytest.raises(ConcurrencyError):
            await racy.persist(loaded, [Withdrawn(11)])
    assert await plain.load(pid) == Loaded(pid, Account(11, 2), 2)


async def test_persist_in_caller_transaction(bank: Journal, pg_dsn: str) -> None:
    accounts = repo(bank, snapshot_every=1)
    pid = "Account|tx"
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        loaded = await accounts.persist(await accounts.load(pid), [Deposited(3)], conn=conn)
        assert loaded == Loaded(pid, Account(3, 1), 1)
        await conn.rollback()
    assert await accounts.load(pid) == Loaded(pid, Account(0, 0), 0)
    assert await bank.load_snapshot(pid) is None  # no snapshot for an uncommitted write

    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await accounts.persist(await accounts.load(pid), [Deposited(4)], tags=["t"], conn=conn)
        await conn.commit()
    assert await accounts.load(pid) == Loaded(pid, Account(4, 1), 1)
    envs = [e async for e in bank.current_events_by_persistence_id(pid)]
    assert [e.tags for e in envs] == [("t",)]


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "3"])
async def test_snapshot_every_is_validated(bank: Journal, bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        AggregateRepository(bank, initial=Account, evolve=evolve, snapshot_every=bad)

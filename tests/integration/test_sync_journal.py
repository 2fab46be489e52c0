"""`SyncJournal` on a real PostgreSQL: the same behaviour as `Journal`, blocking, and
both drivers read each other's writes (one journal of each kind on one schema)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator

import attrs
import psycopg
import pytest

from journal import (
    ConcurrencyError,
    EventEnvelope,
    InvalidArgument,
    Journal,
    JournalError,
    JournalSettings,
    SchemaNotInitialized,
    SerializerRegistry,
    SyncAggregateRepository,
    SyncJournal,
    slice_for,
)
from slicejournal.examples.bank import Deposited, Withdrawn
from tests.support.pg import fresh_schema_name

ENTITY = "Sync"


def pid(name: str = "") -> str:
    return f"{ENTITY}|{name or uuid.uuid4().hex[:10]}"


def registry() -> SerializerRegistry:
    r = SerializerRegistry()
    r.register(Deposited, "bank.Deposited")
    r.register(Withdrawn, "bank.Withdrawn")
    return r


@pytest.fixture
def sync_journal(pg_dsn: str, settings: JournalSettings) -> Iterator[SyncJournal]:
    with SyncJournal.connect(pg_dsn, settings, serializers=registry(), create_schema=True) as j:
        yield j


def test_append_and_read_back(sync_journal: SyncJournal) -> None:
    p = pid()
    stored = sync_journal.append(p, [Deposited(5), Withdrawn(2)], expected_seq_nr=0)
    assert [e.seq_nr for e in stored] == [1, 2]
    assert sync_journal.highest_seq_nr(p) == 2
    read = list(sync_journal.current_events_by_persistence_id(p))
    assert [e.event for e in read] == [Deposited(5), Withdrawn(2)]
    assert read[0].db_timestamp == stored[0].db_timestamp
    s = slice_for(p)
    by_slice = [
        e for e in sync_journal.current_events_by_slices(ENTITY, s, s) if e.persistence_id == p
    ]
    assert [(e.seq_nr, e.event) for e in by_slice] == [(1, Deposited(5)), (2, Withdrawn(2))]
    assert sync_journal.load_envelope(p, 2) is not None
    assert sync_journal.timestamp_of(p, 1) == stored[0].db_timestamp
    assert p in set(sync_journal.current_persistence_ids(ENTITY))


def test_conflicting_append_raises_and_writes_nothing(sync_journal: SyncJournal) -> None:
    p = pid()
    sync_journal.append(p, [Deposited(1)], expected_seq_nr=0)
    with pytest.raises(ConcurrencyError) as caught:
        sync_journal.append(p, [Deposited(2), Deposited(3)], expected_seq_nr=0)
    assert caught.value.actual_seq_nr == 1
    assert [e.event for e in sync_journal.current_events_by_persistence_id(p)] == [Deposited(1)]


def test_bad_input_is_rejected_before_any_io(sync_journal: SyncJournal) -> None:
    with pytest.raises(InvalidArgument):
        sync_journal.append(pid(), [], expected_seq_nr=0)
    with pytest.raises(JournalError):
        sync_journal.current_events_by_slices(ENTITY, 5, 2)
    with pytest.raises(JournalError):
        sync_journal.current_events_by_persistence_id("")


def test_append_in_the_callers_transaction(pg_dsn: str, sync_journal: SyncJournal) -> None:
    rolled_back, committed = pid(), pid()
    with psycopg.connect(pg_dsn) as conn:
        sync_journal.append(rolled_back, [Deposited(1)], expected_seq_nr=0, conn=conn)
        conn.rollback()
        sync_journal.append(committed, [Deposited(2)], expected_seq_nr=0, conn=conn)
        assert sync_journal.highest_seq_nr(committed) == 0  # not visible before commit
        conn.commit()
    assert sync_journal.highest_seq_nr(rolled_back) == 0
    assert sync_journal.highest_seq_nr(committed) == 1


def test_missing_schema_is_a_typed_error(pg_dsn: str) -> None:
    with (
        pytest.raises(SchemaNotInitialized, match="slicejournal migrate"),
        SyncJournal.connect(pg_dsn, JournalSettings(schema=fresh_schema_name())),
    ):
        pass


def test_snapshots_and_the_aggregate_repository(sync_journal: SyncJournal) -> None:
    def evolve(balance: int, event: object) -> int:
        match event:
            case Deposited(amount):
                return balance + amount
            case Withdrawn(amount):
                return balance - amount
        raise TypeError(event)

    accounts: SyncAggregateRepository[int, object] = SyncAggregateRepository(
        sync_journal, initial=int, evolve=evolve, snapshot_every=3
    )
    p = pid()
    for amount in range(1, 6):
        accounts.update(p, lambda state, a=amount: [Deposited(a)])
    loaded = accounts.update(p, lambda state: [Withdrawn(state // 2)])
    assert (loaded.state, loaded.seq_nr) == (15 - 7, 6)
    assert accounts.snapshots_saved == 2
    snapshot = sync_journal.load_snapshot(p)
    assert snapshot is not None and (snapshot.seq_nr, snapshot.state) == (6, 8)
    assert accounts.load(p) == loaded
    sync_journal.delete_snapshot(p)
    assert accounts.load(p) == loaded  # folded from the events alone
    assert sync_journal.delete_events_to(p, 2) == 2
    assert [e.seq_nr for e in sync_journal.current_events_by_persistence_id(p)] == [3, 4, 5, 6]


@pytest.mark.timeout(60)
async def test_both_drivers_read_each_others_writes(
    pg_dsn: str, settings: JournalSettings, journal: Journal
) -> None:
    def sync_side() -> tuple[list[EventEnvelope], list[EventEnvelope]]:
        with SyncJournal.connect(pg_dsn, settings, serializers=registry()) as sj:
            p = pid("from-sync")
            written = sj.append(p, [Deposited(7)], expected_seq_nr=0)
            return written, list(sj.current_events_by_persistence_id(pid("from-async")))

    async with Journal.connect(pg_dsn, settings, serializers=registry()) as typed:
        await typed.append(pid("from-async"), [Deposited(3)], expected_seq_nr=0)
        written, seen_by_sync = await asyncio.to_thread(sync_side)
        assert [e.event for e in seen_by_sync] == [Deposited(3)]
        read = [e async for e in typed.current_events_by_persistence_id(pid("from-sync"))]
    assert read == [attrs.evolve(written[0], source="persistence_id")]
    assert journal.settings.schema == settings.schema


@pytest.mark.timeout(60)
def test_live_stream_delivers_a_late_commit(pg_dsn: str, sync_journal: SyncJournal) -> None:
    """A transaction held open while later ones commit: the blocking stream gets every event."""
    late, early = pid("late"), [pid(f"early-{i}") for i in range(5)]
    expected = {(p, 1) for p in [late, *early]}
    got: set[tuple[str, int]] = set()
    done = threading.Event()

    def consume() -> None:
        stream = sync_journal.events_by_slices(ENTITY, 0, 1023)
        with contextlib.closing(stream):
            for env in stream:
                got.add((env.persistence_id, env.seq_nr))
                if expected <= got:
                    done.set()
                    return

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    with psycopg.connect(pg_dsn) as held:
        sync_journal.append(late, [Deposited(1)], expected_seq_nr=0, conn=held)
        for p in early:
            sync_journal.append(p, [Deposited(2)], expected_seq_nr=0)
        time.sleep(1.0)  # the later events are delivered first
        held.commit()
    assert done.wait(45), f"missing {expected - got}"
    reader.join(5)

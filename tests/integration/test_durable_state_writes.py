"""What a durable state write can carry in its own transaction (Akka's options): a change
event appended to the id's events in the journal, and the store's change handler; both
commit with the state or not at all (real PostgreSQL, both flavours)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection, Connection, sql

from journal import (
    ConcurrencyError,
    DurableStateChange,
    DurableStateStore,
    InvalidArgument,
    Journal,
    JournalSettings,
    SliceRange,
    SyncDurableStateStore,
    SyncJournal,
)

ENTITY = "Cart"
ALL = SliceRange(0, 1023)


async def create_model(pg_dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (pid TEXT, revision BIGINT, items INT, deleted BOOLEAN, "
                "source TEXT, PRIMARY KEY (pid, revision))"
            ).format(sql.Identifier(schema, "cart_log"))
        )


def log_insert(schema: str) -> sql.Composed:
    return sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s)").format(
        sql.Identifier(schema, "cart_log")
    )


def log_row(change: DurableStateChange) -> tuple[Any, ...]:
    items = None if change.deleted else len(change.value["items"])
    return (change.persistence_id, change.revision, items, change.deleted, change.source)


async def log_of(pg_dsn: str, schema: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT * FROM {} ORDER BY pid, revision").format(
                sql.Identifier(schema, "cart_log")
            )
        )
        return [tuple(r) for r in await cur.fetchall()]


async def test_change_events_go_into_the_journal_with_the_write_or_not_at_all(
    pg_dsn: str, settings: JournalSettings
) -> None:
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        store = DurableStateStore(j)
        pid = f"{ENTITY}|1"
        await store.upsert(pid, {"items": ["a"]}, revision=1, change_event={"added": "a"})
        await store.upsert(pid, {"items": ["a", "b"]}, revision=2, tags=["t"],
                           change_event={"added": "b"})  # fmt: skip
        await store.delete(pid, revision=3, change_event={"cleared": True})
        # A stale revision: refused, and neither the state nor an event is written; the
        # message names the revision the write asked for and the one stored.
        with pytest.raises(
            ConcurrencyError,
            match="revision 3 needs the stored revision to be 2, but the durable state store has 3",
        ):
            await store.upsert(pid, {"items": []}, revision=3, change_event={"stale": 1})
        # A write without one, then one with: the events stay gap-free.
        await store.upsert(pid, {"items": ["c"]}, revision=4)
        await store.upsert(pid, {"items": ["c", "d"]}, revision=5, change_event={"added": "d"})

        events = [e async for e in j.current_events_by_slices(ENTITY, 0, 1023)]
        assert [(e.persistence_id, e.seq_nr, e.event, e.tags) for e in events] == [
            (pid, 1, {"added": "a"}, ()),
            (pid, 2, {"added": "b"}, ("t",)),
            (pid, 3, {"cleared": True}, ()),
            (pid, 4, {"added": "d"}, ()),
        ]
        state = await store.get(pid)
        assert state is not None and state.revision == 5 and state.value == {"items": ["c", "d"]}

        # In a caller's transaction: both visible only at its commit, both gone at rollback.
        other = f"{ENTITY}|2"
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            await store.upsert(other, {"items": ["x"]}, revision=1, conn=conn,
                               change_event={"added": "x"})  # fmt: skip
            assert await store.get(other) is None and await j.highest_seq_nr(other) == 0
            await conn.rollback()
        assert await store.get(other) is None and await j.highest_seq_nr(other) == 0
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            await store.upsert(other, {"items": ["x"]}, revision=1, conn=conn,
                               change_event={"added": "x"})  # fmt: skip
            await conn.commit()
        assert await j.highest_seq_nr(other) == 1
        assert (await store.get(other)) is not None


async def test_a_change_handler_writes_with_the_state_and_its_failure_undoes_the_write(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    insert = log_insert(schema)
    fail_on: set[int] = set()

    async def handler(conn: AsyncConnection[Any], change: DurableStateChange) -> None:
        if change.revision in fail_on:
            raise RuntimeError(f"refused revision {change.revision}")
        await conn.execute(insert, log_row(change))

    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        await create_model(pg_dsn, schema)
        store = DurableStateStore(j, change_handler=handler)
        pid = f"{ENTITY}|h"
        await store.upsert(pid, {"items": ["a"]}, revision=1)
        await store.upsert(pid, {"items": ["a", "b"]}, revision=2, change_event={"b": 1})
        fail_on.add(3)
        with pytest.raises(RuntimeError, match="refused revision 3"):
            await store.delete(pid, revision=3, change_event={"cleared": True})
        state = await store.get(pid)
        assert state is not None and state.revision == 2  # the write was undone
        assert await j.highest_seq_nr(pid) == 1  # and its change event
        fail_on.clear()
        await store.delete(pid, revision=3)
        with pytest.raises(ConcurrencyError):  # refused before the handler runs
            await store.upsert(pid, {"items": []}, revision=3)
        # In a caller's transaction the handler's failure undoes only the write (a
        # savepoint): the caller's own work goes on and commits.
        fail_on.add(4)
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            await conn.execute(insert, ("caller", 1, 0, False, "caller"))
            with pytest.raises(RuntimeError):
                await store.upsert(pid, {"items": ["z"]}, revision=4, conn=conn)
            await conn.commit()
        assert (await store.get(pid)).revision == 3  # type: ignore[union-attr]
    assert await log_of(pg_dsn, schema) == [
        (f"{ENTITY}|h", 1, 1, False, "write"),
        (f"{ENTITY}|h", 2, 2, False, "write"),
        (f"{ENTITY}|h", 3, None, True, "write"),
        ("caller", 1, 0, False, "caller"),
    ]


async def test_a_change_handler_of_the_wrong_flavour_is_refused_when_the_store_is_built(
    pg_dsn: str, settings: JournalSettings
) -> None:
    def blocking(conn: Any, change: DurableStateChange) -> None:
        pass

    async def awaiting(conn: Any, change: DurableStateChange) -> None:
        pass

    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        with pytest.raises(InvalidArgument, match="not an async function"):
            DurableStateStore(j, change_handler=blocking)  # type: ignore[arg-type]
        # A lambda may return an awaitable (as for projection handlers); one that does not
        # is refused at the write, naming the handler, and the write is undone.
        lazy = DurableStateStore(j, change_handler=lambda conn, change: None)  # type: ignore[arg-type,return-value]
        with pytest.raises(InvalidArgument, match="change_handler returned None"):
            await lazy.upsert(f"{ENTITY}|lambda", {"items": []}, revision=1)
        assert await lazy.get(f"{ENTITY}|lambda") is None
        with pytest.raises(InvalidArgument, match="must be callable"):
            DurableStateStore(j, change_handler="nope")  # type: ignore[arg-type]
    with SyncJournal.connect(pg_dsn, settings) as sj:
        with pytest.raises(InvalidArgument, match="is an async function"):
            SyncDurableStateStore(sj, change_handler=awaiting)  # type: ignore[arg-type]
        # A lambda returning a coroutine to the sync store: refused, not silently lost.
        sync_lambda = SyncDurableStateStore(sj, change_handler=lambda c, ch: awaiting(c, ch))
        with pytest.raises(InvalidArgument, match="returned an awaitable"):
            sync_lambda.upsert(f"{ENTITY}|sync-lambda", {"items": []}, revision=1)
        assert sync_lambda.get(f"{ENTITY}|sync-lambda") is None


def test_the_sync_store_carries_change_events_and_its_handler(
    pg_dsn: str, settings: JournalSettings, schema: str
) -> None:
    insert = log_insert(schema)

    def handler(conn: Connection[Any], change: DurableStateChange) -> None:
        conn.execute(insert, log_row(change))

    with SyncJournal.connect(pg_dsn, settings, create_schema=True) as j:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE TABLE {} (pid TEXT, revision BIGINT, items INT, deleted BOOLEAN, "
                        "source TEXT, PRIMARY KEY (pid, revision))").format(
                    sql.Identifier(schema, "cart_log"))
            )  # fmt: skip
        store = SyncDurableStateStore(j, change_handler=handler)
        pid = f"{ENTITY}|s"
        store.upsert(pid, {"items": ["a"]}, revision=1, change_event={"added": "a"})
        store.delete(pid, revision=2, change_event={"cleared": True})
        assert [(e.seq_nr, e.event) for e in j.current_events_by_slices(ENTITY, 0, 1023)] == [
            (1, {"added": "a"}), (2, {"cleared": True}),
        ]  # fmt: skip
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(
                sql.SQL("SELECT pid, revision, items, deleted FROM {} ORDER BY revision").format(
                    sql.Identifier(schema, "cart_log")
                )
            ).fetchall()
        assert rows == [(pid, 1, 1, False), (pid, 2, None, True)]


@pytest.mark.timeout(60)
async def test_a_change_event_racing_an_append_to_the_same_id_refuses_the_whole_write(
    pg_dsn: str, settings: JournalSettings
) -> None:
    """The id's events moved while the write ran (another transaction appended the same
    seq_nr and committed first): `ConcurrencyError`, and neither the state nor the change
    event is written; in a caller's transaction only the write's savepoint is undone."""
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        store = DurableStateStore(j)
        pid = f"{ENTITY}|race"
        async with await psycopg.AsyncConnection.connect(pg_dsn) as other:
            # Holds seq_nr 1 of the id, uncommitted: the write's append waits on it.
            await j.append(pid, [{"by": "other"}], expected_seq_nr=0, conn=other)
            write = asyncio.create_task(
                store.upsert(pid, {"items": ["a"]}, revision=1, change_event={"added": "a"})
            )
            await asyncio.sleep(0.5)
            assert not write.done()  # blocked behind the other transaction's seq_nr 1
            await other.commit()
            with pytest.raises(ConcurrencyError):
                await write
        assert await store.get(pid) is None
        assert [e.event async for e in j.current_events_by_slices(ENTITY, 0, 1023)] == [
            {"by": "other"}
        ]
        # Again inside a caller's transaction: the caller's own work survives.
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            await j.append(f"{ENTITY}|caller", [{"n": 1}], expected_seq_nr=0, conn=conn)
            async with await psycopg.AsyncConnection.connect(pg_dsn) as other:
                await j.append(pid, [{"by": "other"}], expected_seq_nr=1, conn=other)
                write = asyncio.create_task(
                    store.upsert(pid, {"items": ["b"]}, revision=1, conn=conn,
                                 change_event={"added": "b"})
                )  # fmt: skip
                await asyncio.sleep(0.5)
                await other.commit()
                with pytest.raises(ConcurrencyError):
                    await write
            await conn.commit()
        assert await store.get(pid) is None
        assert await j.highest_seq_nr(f"{ENTITY}|caller") == 1
        assert await j.highest_seq_nr(pid) == 2


async def test_a_write_with_an_autocommit_callers_connection_commits_at_once(
    pg_dsn: str, settings: JournalSettings
) -> None:
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        store = DurableStateStore(j)
        pid = f"{ENTITY}|auto"
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            await store.upsert(pid, {"items": ["a"]}, revision=1, conn=conn,
                               change_event={"added": "a"})  # fmt: skip
            # Visible at once, state and event together (no transaction left open).
            state = await store.get(pid)
            assert state is not None and state.revision == 1
            assert await j.highest_seq_nr(pid) == 1
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

"""The durable state store on a real server: optimistic revisions, and changes by slices
through the journal's slice machine, with transactions really held open."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from journal import (
    ConcurrencyError,
    DurableStateChange,
    DurableStateStore,
    HorizonSettings,
    InvalidArgument,
    Journal,
    JournalSettings,
    SerializerRegistry,
    SyncDurableStateStore,
    SyncJournal,
    slice_for,
    slice_ranges,
)
from tests.support.long_transactions import horizon_settings, stop_all

ENTITY = "Cart"


@attrs.frozen
class Cart:
    items: tuple[str, ...]


def registry() -> SerializerRegistry:
    r = SerializerRegistry()
    r.register(Cart)
    return r


async def test_upsert_get_delete_with_optimistic_revisions(
    pg_dsn: str, settings: JournalSettings
) -> None:
    async with Journal.connect(pg_dsn, settings, serializers=registry(), create_schema=True) as j:
        store = DurableStateStore(j)
        assert await store.get("Cart|1") is None
        await store.upsert("Cart|1", Cart(("apple",)), revision=1, tags=["t"])
        got = await store.get("Cart|1")
        assert got is not None
        assert (got.value, got.revision, got.tags, got.deleted) == (
            Cart(("apple",)),
            1,
            ("t",),
            False,
        )
        await store.upsert("Cart|1", Cart(("apple", "pear")), revision=2)
        for stale in (1, 2, 4):  # taken, taken, skipped
            with pytest.raises(ConcurrencyError) as caught:
                await store.upsert("Cart|1", Cart(("x",)), revision=stale)
            assert caught.value.actual_seq_nr == 2
            assert "revision" in str(caught.value)
        with pytest.raises(ConcurrencyError):
            await store.upsert("Cart|new", {"a": 1}, revision=2)  # no revision 1
        assert await store.get("Cart|new") is None
        got = await store.get("Cart|1")
        assert got is not None and (got.value, got.revision) == (Cart(("apple", "pear")), 2)
        with pytest.raises(InvalidArgument):
            await store.upsert("Cart|1", Cart(()), revision=0)
        with pytest.raises(InvalidArgument):
            await store.upsert("Cart|1", None, revision=3)
        with pytest.raises(ConcurrencyError):
            await store.delete("Cart|1", revision=2)
        await store.delete("Cart|1", revision=3)
        got = await store.get("Cart|1")
        assert got is not None and (got.value, got.revision, got.deleted) == (None, 3, True)
        await store.upsert("Cart|1", Cart(("again",)), revision=4)
        assert await store.revision("Cart|1") == 4

        # Inside a caller's transaction: visible on commit, nothing on rollback.
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            await store.upsert("Cart|tx", {"n": 1}, revision=1, conn=conn)
            assert await store.get("Cart|tx") is None
            await conn.rollback()
        assert await store.get("Cart|tx") is None


async def test_current_changes_deliver_the_latest_revision_of_each_id(
    pg_dsn: str, settings: JournalSettings
) -> None:
    async with Journal.connect(pg_dsn, settings, serializers=registry(), create_schema=True) as j:
        store = DurableStateStore(j)
        for i in range(20):
            for rev in range(1, 4):
                await store.upsert(f"Cart|{i}", Cart((str(rev),)), revision=rev)
        await store.delete("Cart|0", revision=4)
        await store.upsert("Other|1", {"x": 1}, revision=1)
        # A journal event of the same entity type is not a state change.
        await j.append("Cart|0", [{"e": 1}], expected_seq_nr=0)
        changes = [c async for c in store.current_changes_by_slices(ENTITY, 0, 1023)]
        assert sorted((c.persistence_id, c.revision) for c in changes) == sorted(
            [("Cart|0", 4)] + [(f"Cart|{i}", 3) for i in range(1, 20)]
        )
        by_pid = {c.persistence_id: c for c in changes}
        assert by_pid["Cart|0"].deleted and by_pid["Cart|0"].value is None
        assert by_pid["Cart|5"].value == Cart(("3",)) and not by_pid["Cart|5"].deleted
        assert by_pid["Cart|5"].slice == slice_for("Cart|5") and by_pid["Cart|5"].seq_nr == 3
        stamps = [(c.db_timestamp, c.revision) for c in changes]
        assert stamps == sorted(stamps)
        # Resuming from a change's offset continues right after it.
        rest = [
            c async for c in store.current_changes_by_slices(ENTITY, 0, 1023, changes[9].offset)
        ]

        def keys(cs: list[DurableStateChange]) -> list[tuple[str, int, Any]]:
            return [(c.persistence_id, c.revision, c.value) for c in cs]

        assert keys(rest) == keys(changes[10:])
        # A later upsert is a new change; an older revision of it is never delivered again.
        await store.upsert("Cart|7", Cart(("4",)), revision=4)
        after = [
            c async for c in store.current_changes_by_slices(ENTITY, 0, 1023, changes[-1].offset)
        ]
        assert [(c.persistence_id, c.revision) for c in after] == [("Cart|7", 4)]
        # The events' query sees none of the state rows.
        events = [e async for e in j.current_events_by_slices(ENTITY, 0, 1023)]
        assert [(e.persistence_id, e.seq_nr) for e in events] == [("Cart|0", 1)]


def test_the_sync_store(pg_dsn: str, settings: JournalSettings) -> None:
    with SyncJournal.connect(pg_dsn, settings, create_schema=True) as j:
        store = SyncDurableStateStore(j)
        store.upsert("Cart|s", {"n": 1}, revision=1)
        store.upsert("Cart|s", {"n": 2}, revision=2)
        with pytest.raises(ConcurrencyError):
            store.upsert("Cart|s", {"n": 3}, revision=2)
        got = store.get("Cart|s")
        assert got is not None and (got.value, got.revision) == ({"n": 2}, 2)
        changes = list(store.current_changes_by_slices(ENTITY, 0, 1023))
        assert [(c.persistence_id, c.revision, c.value) for c in changes] == [
            ("Cart|s", 2, {"n": 2})
        ]


# Pekko Persistence R2DBC's durable state writes (PostgresDurableStateDao), in its order.
PEKKO_STATE_INSERT = """
INSERT INTO {t} (slice, entity_type, persistence_id, revision, state_ser_id,
  state_ser_manifest, state_payload, tags, db_timestamp)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, CURRENT_TIMESTAMP)
"""
PEKKO_STATE_UPDATE = """
UPDATE {t} SET revision = %s, state_ser_id = %s, state_ser_manifest = %s,
  state_payload = %s, tags = %s,
  db_timestamp = GREATEST(CURRENT_TIMESTAMP, (SELECT db_timestamp + '1 microsecond'::interval
                 FROM {t} WHERE persistence_id = %s AND revision = %s))
WHERE persistence_id = %s AND revision = %s
"""


async def pekko_upsert(conn: Any, schema: str, pid: str, revision: int, json: str) -> None:
    t = sql.Identifier(schema, "durable_state")
    payload = json.encode()
    if revision == 1:
        await conn.execute(
            sql.SQL(PEKKO_STATE_INSERT).format(t=t),
            (slice_for(pid), pid.split("|")[0], pid, 1, 31, "", payload, None),
        )
    else:
        cur = await conn.execute(
            sql.SQL(PEKKO_STATE_UPDATE).format(t=t),
            (revision, 31, "", payload, None, pid, revision - 1, pid, revision - 1),
        )
        assert cur.rowcount == 1


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_live_changes_see_every_final_revision_through_long_transactions(
    pg_dsn: str, schema: str
) -> None:
    # Pekko's jackson-json id (31) with no manifest reads as plain JSON.
    async with Journal.connect(
        pg_dsn, horizon_settings(schema, max_hold=4), create_schema=True
    ) as j:
        store = DurableStateStore(j)
        ranges = slice_ranges(4)
        outs: list[list[DurableStateChange]] = [[] for _ in ranges]

        async def collect(stream: Any, out: list[DurableStateChange]) -> None:
            async for change in stream:
                out.append(change)

        readers = [
            asyncio.create_task(
                collect(store.changes_by_slices(ENTITY, r.min_slice, r.max_slice), out)
            )
            for r, out in zip(ranges, outs, strict=True)
        ]
        # The same changes read behind the clock without the horizon (Pekko's way).
        behind_clock: list[DurableStateChange] = []
        pekko_query = attrs.evolve(j.settings.query, horizon=HorizonSettings(enabled=False))
        readers.append(
            asyncio.create_task(
                collect(
                    store.changes_by_slices(ENTITY, 0, 1023, query_settings=pekko_query),
                    behind_clock,
                )
            )
        )
        stop = asyncio.Event()
        pids = [f"{ENTITY}|{i}" for i in range(30)]
        refused = 0

        async def racer(seed: int) -> None:
            # Writers racing on the same ids, each with the revision it read + 1.
            nonlocal refused
            rng = random.Random(seed)
            while not stop.is_set():
                pid = rng.choice(pids)
                current = await store.get(pid)
                revision = 1 if current is None else current.revision + 1
                try:
                    await store.upsert(pid, {"by": seed, "rev": revision}, revision=revision)
                except ConcurrencyError:
                    refused += 1
                await asyncio.sleep(rng.uniform(0.005, 0.03))

        async def hold(pid: str, after: float, held: float, *, pekko: bool) -> None:
            await asyncio.sleep(after)
            async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
                await conn.execute("SELECT 1")  # the transaction (and its timestamp) starts
                if pekko:
                    await pekko_upsert(conn, schema, pid, 1, '{"pekko": 1}')
                    await pekko_upsert(conn, schema, pid, 2, '{"pekko": 2}')
                else:
                    await store.upsert(pid, {"ours": 1}, revision=1, conn=conn)
                await asyncio.sleep(held)
                await conn.commit()

        racers = [asyncio.create_task(racer(seed)) for seed in range(4)]
        await asyncio.gather(
            hold(f"{ENTITY}|pekko-held", 1, 17, pekko=True),
            hold(f"{ENTITY}|ours-held", 3, 15, pekko=False),
        )
        stop.set()
        await asyncio.gather(*racers)
        assert refused > 0, "the writers never raced"

        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            cur = await conn.execute(
                sql.SQL("SELECT persistence_id, revision FROM {}").format(j.tables.durable_state)
            )
            final = dict(await cur.fetchall())
        assert final[f"{ENTITY}|pekko-held"] == 2

        def highest() -> dict[str, int]:
            seen: dict[str, int] = {}
            for out in outs:
                for c in out:
                    seen[c.persistence_id] = max(seen.get(c.persistence_id, 0), c.revision)
            return seen

        for _ in range(300):
            if highest() == final:
                break
            await asyncio.sleep(0.1)
        await stop_all(readers)
        assert highest() == final
        for r, out in zip(ranges, outs, strict=True):
            assert all(r.min_slice <= c.slice <= r.max_slice for c in out)
            latest: dict[str, int] = {}
            for c in out:
                if c.source == "query":
                    assert c.revision > latest.get(c.persistence_id, 0), c
                latest[c.persistence_id] = max(latest.get(c.persistence_id, 0), c.revision)
        for pid, revision in final.items():
            got = await store.get(pid)
            assert got is not None and got.revision == revision
        # Without the horizon, the long transactions' changes are lost: the scenario is
        # the one that loses changes.
        long = {f"{ENTITY}|pekko-held", f"{ENTITY}|ours-held"}
        assert not long & {c.persistence_id for c in behind_clock}
        held = await store.get(f"{ENTITY}|pekko-held")
        assert held is not None and held.value == {"pekko": 2}

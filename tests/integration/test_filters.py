"""Event filters on a real PostgreSQL (issue 30): queries and projections that read
only what they need.

Ten event types, some tagged, written by concurrent writers of which some hold
their transaction open for a while (late commits). A finite filtered query
returns exactly the matching events; exactly-once projections filtered by
manifest and by tag over four ranges apply every matching event once and
nothing else, and every range's backlog reads caught up. The server evaluates
the filter: a filtered-out row comes back without its payload (checked on the
rows and in the plan), and values are bound parameters.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
from psycopg import AsyncConnection, sql

from journal import (
    EventEnvelope,
    EventFilter,
    InvalidArgument,
    Journal,
    SerializerRegistry,
    SliceRange,
    slice_ranges,
)
from journal.query import sql as q
from journal.query.by_slice import RowsQuery
from projections import Projection, ProjectionGroup, ProjectionManagement
from tests.support.pg import fetch
from tests.support.projections import FAST, eventually, journal_settings

ENTITY = "Shop"
TYPES = [attrs.make_class(f"E{i}", {"n": attrs.field()}, frozen=True) for i in range(10)]


def registry() -> SerializerRegistry:
    r = SerializerRegistry()
    for i, cls in enumerate(TYPES):
        r.register(cls, f"shop.E{i}")
    return r


@attrs.frozen
class Written:
    pid: str
    seq_nr: int
    manifest: str
    tags: tuple[str, ...]


async def write(j: Journal, ids: int, per_id: int, seed: int) -> list[Written]:
    """Events of the ten types, every third one tagged "vip" (every fifth also "eu"),
    from 4 concurrent writers; one append in ten held open 0.3-1.5 s."""
    rng = random.Random(seed)
    written: list[Written] = []

    async def writer(w: int) -> None:
        for i in range(w, ids, 4):
            pid = f"{ENTITY}|{seed}-{i}"
            seq = 0
            while seq < per_id:
                k = rng.randrange(10)
                tags = tuple(t for t, every in (("vip", 3), ("eu", 5)) if (seq + i) % every == 0)
                event = TYPES[k](seq)
                if rng.random() < 0.1:
                    async with j.pool.connection() as conn, conn.transaction():
                        await j.append(pid, [event], expected_seq_nr=seq, tags=tags, conn=conn)
                        await asyncio.sleep(rng.uniform(0.3, 1.5))
                else:
                    await j.append(pid, [event], expected_seq_nr=seq, tags=tags)
                seq += 1
                written.append(Written(pid, seq, f"shop.E{k}", tags))

    await asyncio.gather(*(writer(w) for w in range(4)))
    return written


@pytest.mark.timeout(120)
async def test_a_finite_filtered_query_returns_exactly_the_matching_events(
    pg_dsn: str, schema: str
) -> None:
    async with Journal.connect(
        pg_dsn, journal_settings(schema), serializers=registry(), create_schema=True
    ) as j:
        written = await write(j, ids=12, per_id=15, seed=1)
        erased = f"{ENTITY}|1-0"
        await j.delete_all(erased)  # a tombstone passes every filter
        for event_filter, wanted in (
            (EventFilter(manifests=("shop.E3",)), lambda w: w.manifest == "shop.E3"),
            (EventFilter(manifests=("shop.E1", "shop.E2")), lambda w: w.manifest in
             ("shop.E1", "shop.E2")),
            (EventFilter(tags=("eu",)), lambda w: "eu" in w.tags),
            (EventFilter(manifests=("shop.E0", "shop.E5"), tags=("vip",)),
             lambda w: w.manifest in ("shop.E0", "shop.E5") and "vip" in w.tags),
            # A literal % in the trusted SQL part, and a column of the row.
            (EventFilter(where="seq_nr % 4 = 0"), lambda w: w.seq_nr % 4 == 0),
        ):  # fmt: skip
            found = []
            for r in slice_ranges(4):
                async for env in j.current_events_by_slices(
                    ENTITY, r.min_slice, r.max_slice, filter=event_filter
                ):
                    found.append(env)
            expected = {(w.pid, w.seq_nr) for w in written if wanted(w) and w.pid != erased}
            tombstones = [e for e in found if e.deleted]
            assert [e.persistence_id for e in tombstones] == [erased], event_filter
            events = [e for e in found if not e.deleted]
            assert {(e.persistence_id, e.seq_nr) for e in events} == expected, event_filter
            assert len(events) == len(expected)
            assert all(not e.filtered and e.event_loaded for e in events)
        # Keys only, with filtered_envelopes: every row of the range, the others marked.
        everything = [
            env
            async for env in j.current_events_by_slices(
                ENTITY, 0, 1023, filter=EventFilter(manifests=("shop.E3",)),
                filtered_envelopes=True,
            )
        ]  # fmt: skip
        assert len(everything) == len(written) - 15 + 1  # the erased id's rows are gone
        for env in everything:
            if env.filtered:
                assert env.serializer_manifest != "shop.E3" and env.tags == ()
            else:
                assert env.deleted or isinstance(env.event, TYPES[3])


@pytest.mark.timeout(60)
async def test_the_server_evaluates_the_filter_and_ships_no_payload_it_leaves_out(
    pg_dsn: str, schema: str
) -> None:
    async with Journal.connect(
        pg_dsn, journal_settings(schema), serializers=registry(), create_schema=True
    ) as j:
        for i in range(20):
            await j.append(f"{ENTITY}|x{i}", [TYPES[i % 10](i)], expected_seq_nr=0)
        event_filter = EventFilter(manifests=("shop.E7",), where="true")
        statement, params = q.slice_rows(
            j.tables,
            ENTITY,
            0,
            1023,
            RowsQuery(
                backtracking=False,
                from_timestamp=datetime(2000, 1, 1, tzinfo=UTC),
                exclude={},
                to_inclusive=None,
                until_exclusive=None,
                behind_current_time=None,
                limit=None,
            ),
            event_filter,
        )
        rows = await fetch(j.dsn, statement, params)
        payload = len(rows[0]) - 2  # the payload, then the read time
        manifest = 8
        shipped = [r for r in rows if r[payload] is not None]
        assert len(rows) == 20 and len(shipped) == 2
        assert {r[manifest] for r in shipped} == {"shop.E7"}
        assert {r[manifest] for r in rows if r[payload] is None} == {"slicejournal.filtered"}
        async with await AsyncConnection.connect(j.dsn) as conn:
            cur = await conn.execute(sql.SQL("EXPLAIN (VERBOSE) ") + statement, params)
            plan = "\n".join(str(r[0]) for r in await cur.fetchall())
        assert "CASE WHEN" in plan and "event_payload" in plan, plan
        # Values are bound, never spliced: a manifest with a quote is just a value.
        hostile = EventFilter(manifests=("x' OR true --",), tags=("'; DROP TABLE x; --",))
        found = [e async for e in j.current_events_by_slices(ENTITY, 0, 1023, filter=hostile)]
        assert found == []


@pytest.mark.timeout(60)
async def test_bad_filters_are_refused_before_anything_runs(journal: Journal) -> None:
    for bad in (
        lambda: EventFilter(manifests="shop.E1"),
        lambda: EventFilter(tags=[""]),
        lambda: EventFilter(manifests=[1]),
        lambda: EventFilter(where=""),
        lambda: EventFilter(where=5),
    ):
        with pytest.raises(InvalidArgument):
            bad()
    with pytest.raises(InvalidArgument):
        journal.current_events_by_slices(ENTITY, 0, 1023, filter="shop.E1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        Projection.exactly_once(
            journal, name="p", entity_type=ENTITY, slice_range=SliceRange.FULL,
            handler=_noop, filter=("shop.E1",),  # type: ignore[arg-type]
        )  # fmt: skip


async def _noop(conn: Any, env: EventEnvelope) -> None:
    return None


@pytest.mark.timeout(180)
async def test_filtered_projections_apply_every_matching_event_once_and_nothing_else(
    pg_dsn: str, schema: str
) -> None:
    async with Journal.connect(
        pg_dsn, journal_settings(schema), serializers=registry(), create_schema=True
    ) as j:
        async with j.pool.connection() as conn:
            for name in ("by_manifest", "by_tag"):
                await conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (pid text, seq_nr bigint, PRIMARY KEY (pid, seq_nr))"
                    ).format(sql.Identifier(schema, name))
                )

        def handler(table: str) -> Any:
            insert = sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(sql.Identifier(schema, table))

            async def handle(conn: AsyncConnection[Any], env: EventEnvelope) -> None:
                assert not env.filtered
                await conn.execute(insert, (env.persistence_id, env.seq_nr))

            return handle

        filters = {
            "by_manifest": EventFilter(manifests=("shop.E2", "shop.E4")),
            "by_tag": EventFilter(tags=("vip",)),
        }
        groups = [
            ProjectionGroup(
                lambda r, name=name: Projection.exactly_once(
                    j,
                    name=name,
                    entity_type=ENTITY,
                    slice_range=r,
                    handler=handler(name),
                    settings=FAST,
                    filter=filters[name],
                ),
                4,
            )
            for name in filters
        ]
        for group in groups:
            await group.start()
        written = await write(j, ids=16, per_id=20, seed=2)
        expected = {
            "by_manifest": {(w.pid, w.seq_nr) for w in written if w.manifest in
                            ("shop.E2", "shop.E4")},
            "by_tag": {(w.pid, w.seq_nr) for w in written if "vip" in w.tags},
        }  # fmt: skip

        async def applied(name: str) -> set[tuple[str, int]]:
            query = sql.SQL("SELECT pid, seq_nr FROM {}").format(sql.Identifier(schema, name))
            return {(p, int(s)) for p, s in await fetch(j.dsn, query)}

        async def exact() -> bool:
            return all([await applied(n) == expected[n] for n in filters])

        await eventually(exact, "every matching event applied, nothing else", within=90)
        management = ProjectionManagement(j)

        async def caught_up() -> bool:
            for name in filters:
                for r in slice_ranges(4):
                    if (await management.backlog(name, ENTITY, r)).size != 0:
                        return False
            return True

        await eventually(caught_up, "every range's backlog caught up", within=60)
        for group in groups:
            assert group.failed() is None
            await group.stop()

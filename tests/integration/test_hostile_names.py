"""Schema, table, entity type and persistence id names that try to break out of SQL.

Names reach SQL only as quoted identifiers or bound parameters, so each of
these must be stored verbatim and must not touch anything else.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from journal import (
    DurableStateStore,
    InvalidSettings,
    Journal,
    JournalSettings,
    SliceRange,
    slice_for,
)
from projections.aio.offset_dao import OffsetDao
from projections.aio.retention import Retention
from projections.fencing import FENCE_SQLSTATE, Fence
from projections.fleet.lease_sql import FleetSql
from projections.offset_store import Record
from projections.retention import RetentionPolicy
from projections.settings import ProjectionTableNames
from projections.tables import ProjectionTables
from tests.support.pg import fetch


async def drop_schemas(pg_dsn: str, *names: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        for name in names:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
            )


async def tables_in(pg_dsn: str, schema: str) -> set[str]:
    rows = await fetch(
        pg_dsn,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
        (schema,),
    )
    return {r[0] for r in rows}


async def schema_exists(pg_dsn: str, schema: str) -> bool:
    rows = await fetch(pg_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,))
    return bool(rows[0][0])


@pytest.fixture
async def canary(pg_dsn: str) -> AsyncIterator[sql.Identifier]:
    """A table in a schema of its own, holding one row that every test checks at the end."""
    schema = f"canary_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(schema, "x")
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await conn.execute(sql.SQL("CREATE TABLE {} (v text)").format(ident))
        await conn.execute(sql.SQL("INSERT INTO {} VALUES ('alive')").format(ident))
    try:
        yield ident
        assert await fetch(pg_dsn, sql.SQL("SELECT v FROM {}").format(ident)) == [("alive",)]
    finally:
        await drop_schemas(pg_dsn, schema)


HOSTILE_NAMES = [
    'ev"il; DROP TABLE x; --',
    "it's; DELETE FROM x; --",
    '"; DROP SCHEMA public CASCADE; --',
    "with  spaces and\ttab",
    "ünïcödé 日本語 😀",
    "UPPER lower",
    "$1 {x} {} ? :name",
    "back\\slash\\",
    "a.b",
]


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
async def test_hostile_schema_and_table_names(
    pg_dsn: str, canary: sql.Identifier, hostile: str
) -> None:
    schema = f"{hostile} {uuid.uuid4().hex[:6]}"
    settings = JournalSettings(
        schema=schema,
        journal_table=f"j {hostile}",
        snapshot_table=f"s {hostile}",
        durable_state_table=f"ds {hostile}",
    )
    names = ProjectionTableNames(
        offset_table=f"o {hostile}",
        management_table=f"m {hostile}",
        dead_letter_table=f"d {hostile}",
        fleet_table=f"f {hostile}",
        fleet_worker_table=f"w {hostile}",
        lease_table=f"l {hostile} $body$",  # the fence function's body is dollar-quoted
    )
    try:
        # The projections' tables under these names only (none under the default names).
        async with Journal.connect(pg_dsn, settings, check_schema=False) as j:
            await j.create_schema(tables=[ProjectionTables(j.tables, names)])
        async with Journal.connect(pg_dsn, settings) as j:  # the version check passes
            projection_tables = ProjectionTables(j.tables, names)
            pid = "Account|1"
            await j.append(pid, [{"a": 1}, {"a": 2}], expected_seq_nr=0)
            await j.append(pid, [{"a": 3}], expected_seq_nr=2)
            await j.save_snapshot(pid, 3, {"sum": 6})
            events = [e async for e in j.current_events_by_persistence_id(pid)]
            s = slice_for(pid)
            by_slice = [e async for e in j.current_events_by_slices("Account", s, s)]
            snap = await j.load_snapshot(pid)
            ids = [p async for p in j.current_persistence_ids()]
            await j.delete_events_to(pid, 1)
            states = DurableStateStore(j)
            await states.upsert(pid, {"sum": 6}, revision=1)
            await states.upsert(pid, {"sum": 7}, revision=2)
            state = await states.get(pid)
            changes = [c async for c in states.current_changes_by_slices("Account", s, s)]
            after_delete = [e.seq_nr async for e in j.current_events_by_persistence_id(pid)]
            # A lease claimed and a fenced offset save: the fence function runs.
            statements = FleetSql(projection_tables)
            r = SliceRange(0, 1023)
            async with j.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    statements.claim, statements.claim_params("p", r, "me", 60_000)
                )
                epoch = (await cur.fetchone() or (0,))[0]
            dao = OffsetDao(projection_tables, "p")
            fence = Fence("p", r, "me", epoch, 60_000)
            async with j.pool.connection() as conn, conn.transaction():
                await dao.save(conn, "0-1023", [Record(s, pid, 3, events[2].db_timestamp)], fence)
            stolen = Fence("p", r, "me", epoch + 1, 60_000)
            with pytest.raises(psycopg.Error) as lost:
                async with j.pool.connection() as conn, conn.transaction():
                    await dao.save(conn, "0-1023", [Record(s, pid, 4, events[2].db_timestamp)],
                                   stolen)  # fmt: skip
            assert lost.value.sqlstate == FENCE_SQLSTATE
            async with j.pool.connection() as conn:
                saved = await dao.load(conn, r)
            # Retention and the projection registry (a table named after the management one).
            retention = Retention(j, tables=names)
            keep_last = RetentionPolicy("Account", keep_last=1)
            await retention.register("p2", "Account")
            held = await retention.apply(keep_last, dry_run=True)
            await retention.retire("p2")
            free = await retention.apply(keep_last, dry_run=True)
            registry = {(i.name, i.registration.value) for i in await retention.projections()}
            await j.create_schema(tables=[projection_tables])  # idempotent under these names
        assert [e.event for e in events] == [{"a": 1}, {"a": 2}, {"a": 3}]
        assert [e.seq_nr for e in by_slice] == [1, 2, 3]
        assert snap is not None and snap.state == {"sum": 6}
        assert ids == [pid]
        assert state is not None and (state.value, state.revision) == ({"sum": 7}, 2)
        assert [(c.persistence_id, c.revision) for c in changes] == [(pid, 2)]
        assert after_delete == [2, 3]
        assert [(x.persistence_id, x.seq_nr) for x in saved] == [(pid, 3)]
        assert (held.events, free.events, free.retired_offsets) == (0, 1, 0)
        assert registry == {("p", "implicit"), ("p2", "retired")}

        # the tables exist under exactly these names
        assert await tables_in(pg_dsn, schema) == {
            f"j {hostile}",
            f"s {hostile}",
            f"ds {hostile}",
            f"o {hostile}",
            f"m {hostile}",
            f"m {hostile}_registry",
            f"d {hostile}",
            f"f {hostile}",
            f"w {hostile}",
            f"l {hostile} $body$",
            "slicejournal_schema_version",
        }
        journal_table = sql.Identifier(schema, f"j {hostile}")
        rows = await fetch(
            pg_dsn, sql.SQL("SELECT seq_nr FROM {} ORDER BY seq_nr").format(journal_table)
        )
        assert rows == [(1,), (2,), (3,)]
        indexes = await fetch(
            pg_dsn,
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
            (schema, f"j {hostile}"),
        )
        assert f"j {hostile}_slice_idx" in {r[0] for r in indexes}
        assert await schema_exists(pg_dsn, "public")
    finally:
        await drop_schemas(pg_dsn, schema)


async def test_hostile_entity_types_and_pids_are_stored_verbatim(
    pg_dsn: str, schema: str, canary: sql.Identifier
) -> None:
    entity_type = "Acc'ount\"; DROP TABLE x; --"
    pids = [
        f"{entity_type}|1",
        f"{entity_type}|'); DELETE FROM event_journal; --",
        "Plain|%s %(pid)s {journal} $1",
    ]
    async with Journal.connect(pg_dsn, JournalSettings(schema=schema), create_schema=True) as j:
        for pid in pids:
            await j.append(
                pid, [{"pid": pid}], expected_seq_nr=0, tags=["t'; --", 'q"'], metadata=pid
            )
            await j.save_snapshot(pid, 1, {"pid": pid})
        rows = await fetch(
            pg_dsn,
            sql.SQL(
                "SELECT persistence_id, entity_type, slice, tags FROM {} ORDER BY persistence_id"
            ).format(sql.Identifier(schema, "event_journal")),
        )
        assert rows == sorted(
            (pid, pid.split("|", 1)[0], slice_for(pid), ["t'; --", 'q"']) for pid in pids
        )
        for pid in pids:
            envs = [e async for e in j.current_events_by_persistence_id(pid)]
            assert [(e.persistence_id, e.event, e.metadata) for e in envs] == [
                (pid, {"pid": pid}, pid)
            ]
            snap = await j.load_snapshot(pid)
            assert snap is not None and snap.state == {"pid": pid}
        by_type = [p async for p in j.current_persistence_ids(entity_type)]
        assert by_type == sorted(pids[:2])
        by_slice = [
            e.persistence_id async for e in j.current_events_by_slices(entity_type, 0, 1023)
        ]
        assert sorted(by_slice) == sorted(pids[:2])
    assert await tables_in(pg_dsn, schema) >= {"event_journal", "snapshot"}


def configured(field: str, value: Any, schema: str) -> tuple[JournalSettings, ProjectionTableNames]:
    """The journal's settings and the projections' table names with `field` (of either)
    set to `value`; a bad value raises `InvalidSettings` here, before any connection."""
    if field in attrs.fields_dict(ProjectionTableNames):
        return JournalSettings(schema=schema), ProjectionTableNames(**{field: value})
    return JournalSettings(**{"schema": schema, field: value}), ProjectionTableNames()


async def create(pg_dsn: str, settings: JournalSettings, names: ProjectionTableNames) -> None:
    async with Journal.connect(pg_dsn, settings, check_schema=False) as j:
        await j.create_schema(tables=[ProjectionTables(j.tables, names)])


def _too_long() -> list[str]:
    return ["x" * 64, "é" * 32, "😀" * 16, "a" * 62 + "é"]


@pytest.mark.parametrize(
    "field",
    [
        "schema",
        "journal_table",
        "snapshot_table",
        "offset_table",
        "management_table",
        "lease_table",
    ],
)
async def test_invalid_identifiers_are_rejected_before_anything_is_created(
    pg_dsn: str, field: str
) -> None:
    marker = uuid.uuid4().hex[:8]
    bad_values: list[Any] = [
        "",
        f"nul\x00{marker}",
        None,
        42,
        *(marker + v for v in _too_long()),
    ]
    for bad in bad_values:
        with pytest.raises(InvalidSettings):
            settings, names = configured(field, bad, f"never_{marker}")
            await create(pg_dsn, settings, names)
    # nothing was created under the name PostgreSQL would have truncated it to
    for bad in bad_values:
        if isinstance(bad, str) and bad and "\x00" not in bad:
            truncated = bad.encode("utf-8")[:63].decode("utf-8", "ignore")
            assert not await schema_exists(pg_dsn, truncated)
    assert not await schema_exists(pg_dsn, f"never_{marker}")


@pytest.mark.parametrize("name", ["%(pid)s", "%s", "100%", "%%"])
@pytest.mark.parametrize("field", ["schema", "journal_table", "snapshot_table", "offset_table"])
async def test_percent_in_names_is_rejected_before_anything_is_created(
    pg_dsn: str, field: str, name: str
) -> None:
    """psycopg reads `%` as a placeholder even inside quoted identifiers.

    Schema `%(pid)s` would otherwise make every parameterised statement address
    schema `"$1"`: a different schema, chosen by the placeholder numbering.
    """
    marker = f"pct_{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidSettings, match="%"):
        settings, names = configured(field, f"{name} {marker}", marker)
        await create(pg_dsn, settings, names)
    assert not await schema_exists(pg_dsn, marker)
    if field == "schema":
        assert not await schema_exists(pg_dsn, f"{name} {marker}")
    assert not await schema_exists(pg_dsn, "$1")


async def test_longest_table_name_keeps_its_index(pg_dsn: str, schema: str) -> None:
    """A 63-byte table name still gets a slice index whose name PostgreSQL does not truncate."""
    name = "ü" * 31 + "x"  # 63 bytes
    assert len(name.encode("utf-8")) == 63
    settings = JournalSettings(schema=schema, journal_table=name)
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        await j.append("Long|1", [{"a": 1}], expected_seq_nr=0)
        await j.create_schema()
    indexes = await fetch(
        pg_dsn,
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
        (schema, name),
    )
    slice_indexes = [r for r in indexes if "slice" in r[1] and "db_timestamp" in r[1]]
    assert len(slice_indexes) == 1
    assert len(slice_indexes[0][0].encode("utf-8")) <= 63


async def test_two_long_table_names_in_one_schema_each_get_a_slice_index(
    pg_dsn: str, schema: str
) -> None:
    """Names that differ only after the index-name cut must not share one index name."""
    base = "tenant_events_for_customer_alpha_bravo_charlie_delta_echo_"  # 58 bytes
    names = [base + "1", base + "2"]
    for name in names:
        settings = JournalSettings(schema=schema, journal_table=name)
        async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
            await j.append("Tenant|1", [{"t": name}], expected_seq_nr=0)
    for name in names:
        indexes = await fetch(
            pg_dsn,
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
            (schema, name),
        )
        defs = [r[0] for r in indexes]
        assert any("(slice, entity_type, db_timestamp, seq_nr)" in d for d in defs), (name, defs)

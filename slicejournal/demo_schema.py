"""The demo's own schema: created and marked by the demo, never anybody else's.

The demo resets its data on every run. Resetting must never reach a user's
tables, so the demo only ever works in a schema that it created itself (it
leaves a comment on the schema as its mark) and that still holds nothing but
the demo's own tables. Anything else — a schema the demo did not create, or a
foreign table, view, function or type inside the demo's schema — is refused
before a single statement writes.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, errors, sql

from journal.errors import JournalError
from journal.settings import JournalSettings
from journal.tables import SCHEMA_VERSION_TABLE, Tables
from projections.tables import ProjectionTables

LEGACY_DEMO_SCHEMA = "slicejournal_demo"
DEMO_MARK = "created by `slicejournal demo`; its tables are reset on every demo run"


class DemoSchemaRefused(JournalError):
    """The demo was pointed at a schema that is not its own."""


def _projection_tables(settings: JournalSettings) -> ProjectionTables:
    """The projections' tables the demo's projections use: the default names."""
    return ProjectionTables(Tables(settings))


def _demo_tables(settings: JournalSettings, read_models: tuple[str, ...]) -> list[str]:
    projections = _projection_tables(settings)
    return [
        *projections.journal_tables.table_names(),
        *projections.key_names(),
        projections.registry_name,
        SCHEMA_VERSION_TABLE,
        *read_models,
    ]


# Every object in the schema that is not one of the given tables, their row
# types, indexes, sequences or the types' array twins, nor the lease sequence
# and fence function that `slicejournal init` creates beside them.
_FOREIGN_OBJECTS = sql.SQL(
    """
    SELECT c.relname FROM pg_class c
    WHERE c.relnamespace = %(ns)s::regnamespace
      AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')
      AND NOT (c.relkind IN ('r', 'p') AND c.relname = ANY(%(ours)s))
    UNION ALL
    SELECT c.relname FROM pg_class c
    WHERE c.relnamespace = %(ns)s::regnamespace AND c.relkind IN ('i', 'I', 'S')
      AND c.relname <> %(sequence)s
      AND NOT EXISTS (
        SELECT 1 FROM pg_depend d JOIN pg_class t ON t.oid = d.refobjid
        WHERE d.objid = c.oid AND t.relname = ANY(%(ours)s)
          AND t.relnamespace = %(ns)s::regnamespace)
      AND NOT EXISTS (
        SELECT 1 FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
        WHERE i.indexrelid = c.oid AND t.relname = ANY(%(ours)s))
    UNION ALL
    SELECT p.proname || '()' FROM pg_proc p WHERE p.pronamespace = %(ns)s::regnamespace
      AND p.proname <> %(function)s
    UNION ALL
    SELECT t.typname FROM pg_type t
    WHERE t.typnamespace = %(ns)s::regnamespace AND t.typrelid = 0 AND t.typcategory <> 'A'
    ORDER BY 1
    """
)


async def claim_demo_schema(
    conn: AsyncConnection[Any], settings: JournalSettings, read_models: tuple[str, ...]
) -> None:
    """Create the demo's schema, or empty it if it is the demo's own; refuse anything else.

    `conn` must be in autocommit mode. Raises `DemoSchemaRefused` (and changes
    nothing) for a schema the demo did not create or one holding foreign objects.
    """
    schema = settings.schema
    cur = await conn.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
        (schema,),
    )
    row = await cur.fetchone()
    if row is None:
        async with conn.transaction():
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            await conn.execute(
                sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                    sql.Identifier(schema), sql.Literal(DEMO_MARK)
                )
            )
        return
    # Earlier demo versions left their default schema unmarked; it is still
    # adopted below only if it holds nothing but demo tables.
    legacy = row[0] is None and schema == LEGACY_DEMO_SCHEMA
    if row[0] != DEMO_MARK and not legacy:
        raise DemoSchemaRefused(
            f"schema {schema!r} already exists and was not created by the demo; the demo "
            "only runs in a schema of its own (the default is slicejournal_demo) — "
            "choose another --schema"
        )
    ours = _demo_tables(settings, read_models)
    t = _projection_tables(settings)
    cur = await conn.execute(
        _FOREIGN_OBJECTS,
        {
            "ns": schema,
            "ours": ours,
            "sequence": t.lease_epoch_name,
            "function": t.lease_fence_name,
        },
    )
    foreign = [r[0] for r in await cur.fetchall()]
    if foreign:
        raise DemoSchemaRefused(
            f"schema {schema!r} holds objects the demo did not create "
            f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); "
            "it will not reset it — move them elsewhere or choose another --schema"
        )
    if legacy:
        await conn.execute(
            sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                sql.Identifier(schema), sql.Literal(DEMO_MARK)
            )
        )
    tables = sql.SQL(", ").join(sql.Identifier(schema, name) for name in ours)
    try:
        # No CASCADE: a user's view on a demo table makes this fail, not vanish.
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(tables))
        await conn.execute(sql.SQL("DROP SEQUENCE IF EXISTS {}").format(t.lease_epoch))
        await conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}").format(t.lease_fence))
    except errors.DependentObjectsStillExist as e:
        raise DemoSchemaRefused(
            f"schema {schema!r}: another object depends on a demo table ({e.diag.message_detail})"
        ) from e

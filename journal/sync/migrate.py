# Generated from journal/aio/migrate.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""Bringing a database's schema to this release, and refusing one that is not.

`migrate` applies each pending step (journal/schema.py) in a transaction of
its own that first takes the migration lock and re-reads the versions, so
two deploys racing apply each step once, and a failed step leaves the
database at the previous one. `check_schema` is the one catalog read every
journal makes when it opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import Connection

from journal.connection import TABLE_EXISTS, schema_missing
from journal.errors import SchemaOutdated
from journal.schema import (
    MIGRATION_LOCK_KEY,
    ComponentTables,
    Migration,
    MigrationHook,
    VersionSql,
    check_versions,
    installation,
    pending,
    release,
)
from journal.settings import JournalSettings
from journal.tables import Tables


def read_versions(conn: Connection[Any], tables: Tables) -> dict[str, int] | None:
    """Each component's recorded version; None if the database records none."""
    statements = VersionSql.of(tables)
    cur = conn.execute(TABLE_EXISTS, (tables.schema_version.as_string(conn),))
    row = cur.fetchone()
    if not (row and row[0]):
        return None
    cur = conn.execute(statements.read)
    return {str(component): int(version) for component, version in cur.fetchall()}


def migrate(
    conn: Connection[Any],
    settings: JournalSettings,
    *,
    dry_run: bool = False,
    on_step: MigrationHook | None = None,
    tables: Sequence[ComponentTables] = (),
) -> list[Migration]:
    """Apply every pending step (or, with `dry_run`, only list them); the steps applied.

    `conn` must autocommit: each step commits on its own. `tables` names the
    tables of components that are not to have their default names (one each).
    """
    journal = Tables(settings)
    installed = {each.component.name: each for each in installation(journal, tables)}
    statements = VersionSql.of(journal)
    steps = pending(read_versions(conn, journal) or {}, list(installed.values()))
    if dry_run:
        return steps
    applied = []
    for step in steps:
        with conn.transaction():
            conn.execute(statements.lock, (MIGRATION_LOCK_KEY,))
            conn.execute(statements.create)
            cur = conn.execute(statements.read)
            current = {str(c): int(v) for c, v in cur.fetchall()}
            each = installed[step.component.name]
            key = each.key
            if current.get(key, 0) >= step.number:
                continue  # another deploy applied it while this one waited for the lock
            conn.execute(step.statement(each.tables))
            conn.execute(statements.record, (key, step.number, release()))
        applied.append(step)
        if on_step is not None:
            on_step(step)
    return applied


def check_schema(conn: Connection[Any], tables: Tables) -> None:
    """`SchemaNotInitialized` if there is no journal table, `SchemaOutdated` /
    `SchemaTooNew` unless every installed component is at this release's version
    (every installation of a component in the schema, as its names are not known here)."""
    cur = conn.execute(TABLE_EXISTS, (tables.journal.as_string(conn),))
    row = cur.fetchone()
    if not (row and row[0]):
        raise schema_missing(conn, tables)
    versions = read_versions(conn, tables)
    if versions is None:
        raise SchemaOutdated(
            tables.settings.schema, "no schema version recorded: created by release 0.1.0"
        )
    check_versions(tables.schema_name, versions, installation(tables))

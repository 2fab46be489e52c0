"""Bringing a database's schema to this release, and refusing one that is not.

`migrate` applies each pending step (journal/schema.py) in a transaction of
its own that first takes the migration lock and re-reads the versions, so
two deploys racing apply each step once, and a failed step leaves the
database at the previous one. `check_schema` is the one catalog read every
journal makes when it opens.

A step's DDL waits for the locks it needs on tables in use (an index on the
snapshot table waits for every transaction that wrote to it), and while it
waits, PostgreSQL queues every later writer of that table behind it. So the
step waits at most `JournalSettings.migration_lock_timeout` (`lock_timeout`,
set after the migration lock: a second deploy waiting for the first is
queued behind nobody's writes) and then fails with `LockTimeout`, applying
nothing. The session also sets `client_connection_check_interval`
(PostgreSQL 14+): a migrate process killed while its step waits would
otherwise leave its backend waiting, and every writer queued behind it,
until the lock came; the server now notices the dead client within a second
and ends that wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from journal.connection import TABLE_EXISTS, schema_missing
from journal.errors import LockTimeout, SchemaOutdated
from journal.schema import (
    MIGRATION_LOCK_KEY,
    Migration,
    MigrationHook,
    TableNaming,
    VersionSql,
    check_versions,
    installation,
    pending,
    release,
)
from journal.settings import JournalSettings
from journal.tables import Tables

# How often a migration's backend checks, while it waits, that its client is still there.
CLIENT_CHECK_INTERVAL_MS = 1000
_SET_LOCAL = "SELECT set_config(%s, %s, true)"


async def read_versions(conn: AsyncConnection[Any], tables: Tables) -> dict[str, int] | None:
    """Each component's recorded version; None if the database records none."""
    statements = VersionSql.of(tables)
    cur = await conn.execute(TABLE_EXISTS, (tables.schema_version.as_string(conn),))
    row = await cur.fetchone()
    if not (row and row[0]):
        return None
    cur = await conn.execute(statements.read)
    return {str(component): int(version) for component, version in await cur.fetchall()}


async def migrate(
    conn: AsyncConnection[Any],
    settings: JournalSettings,
    *,
    dry_run: bool = False,
    on_step: MigrationHook | None = None,
    tables: Sequence[TableNaming] = (),
) -> list[Migration]:
    """Apply every pending step (or, with `dry_run`, only list them); the steps applied.

    `conn` must autocommit: each step commits on its own. `tables` names the
    tables of components that are not to have their default names (one each).
    A step that waits longer than `settings.migration_lock_timeout` for a lock
    on a table it changes raises `LockTimeout`: that step is rolled back (the
    ones before it stay applied) and running `migrate` again resumes there.
    """
    journal = Tables(settings)
    installed = {each.component.name: each for each in installation(journal, tables)}
    statements = VersionSql.of(journal)
    steps = pending(await read_versions(conn, journal) or {}, list(installed.values()))
    if dry_run:
        return steps
    applied = []
    for step in steps:
        try:
            async with conn.transaction():
                await _end_wait_when_client_goes(conn)
                await conn.execute(statements.lock, (MIGRATION_LOCK_KEY,))
                # Only now: waiting for another deploy's step holds up no one's writes.
                lock_timeout = f"{settings.migration_lock_timeout_ms}ms"
                await conn.execute(_SET_LOCAL, ("lock_timeout", lock_timeout))
                await conn.execute(statements.create)
                cur = await conn.execute(statements.read)
                current = {str(c): int(v) for c, v in await cur.fetchall()}
                each = installed[step.component.name]
                key = each.key
                if current.get(key, 0) >= step.number:
                    continue  # another deploy applied it while this one waited for the lock
                await conn.execute(step.statement(each.tables))
                await conn.execute(statements.record, (key, step.number, release()))
        except psycopg.errors.LockNotAvailable as e:
            raise _lock_timeout(step, settings) from e
        applied.append(step)
        if on_step is not None:
            on_step(step)
    return applied


async def _end_wait_when_client_goes(conn: AsyncConnection[Any]) -> None:
    """`client_connection_check_interval` for the step's transaction, where the server
    has it (PostgreSQL 14+, on a platform that supports it; elsewhere nothing is set)."""
    if conn.info.server_version < 140000:
        return
    interval = f"{CLIENT_CHECK_INTERVAL_MS}ms"
    try:
        async with conn.transaction():  # a savepoint: a refusal leaves the step intact
            await conn.execute(_SET_LOCAL, ("client_connection_check_interval", interval))
    except (psycopg.DataError, psycopg.ProgrammingError):
        return  # "must be set to 0 on this platform": the lock timeout still bounds the wait


def _lock_timeout(step: Migration, settings: JournalSettings) -> LockTimeout:
    seconds = f"{settings.migration_lock_timeout.total_seconds():g} s"
    return LockTimeout(
        f"migration step {step} of schema {settings.schema!r} gave up after waiting "
        f"{seconds} (the lock timeout, JournalSettings.migration_lock_timeout) for a lock "
        "on a table it changes that another transaction holds; while a step waits, writes "
        "to that table wait behind it. Nothing of this step was applied (earlier steps "
        "stay). Retry `slicejournal migrate` once that transaction has ended "
        "(pg_stat_activity shows it: a long write, or a session idle in transaction), "
        "or give it longer with --lock-timeout SECONDS"
    )


async def require_table(
    conn: AsyncConnection[Any], tables: Tables, table: sql.Composable | None = None
) -> None:
    """`SchemaNotInitialized` (naming the journal table, the schema's own) if `table`
    (default: the journal) does not exist."""
    named = tables.journal if table is None else table
    cur = await conn.execute(TABLE_EXISTS, (named.as_string(conn),))
    row = await cur.fetchone()
    if not (row and row[0]):
        raise schema_missing(conn, tables)


async def check_schema(conn: AsyncConnection[Any], tables: Tables) -> None:
    """`SchemaNotInitialized` if there is no journal table, `SchemaOutdated` /
    `SchemaTooNew` unless every installed component is at this release's version
    (every installation of a component in the schema, as its names are not known here)."""
    await require_table(conn, tables)
    versions = await read_versions(conn, tables)
    if versions is None:
        raise SchemaOutdated(
            tables.settings.schema, "no schema version recorded: created by release 0.1.0"
        )
    check_versions(tables.schema_name, versions, installation(tables))

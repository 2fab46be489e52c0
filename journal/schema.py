"""The database schema as numbered, forward-only migrations per component.

A journal is kept for years, through many releases, so its schema is
versioned: each component (`journal`: events and snapshots; `projections`:
offsets, management, the fleet's leases) ships its migrations as
`NNNN_name.sql` files inside its package, and the database records in
`slicejournal_schema_version` the number each component has reached. The
drivers (`journal/aio/migrate.py` and its generated twin) apply what is
missing, one transaction per step under an advisory lock, and refuse a
schema older (run `slicejournal migrate`) or newer (an old worker must not
write to it) than the installed release.

Components are found through the `slicejournal.schema` entry-point group, so
the journal knows its own migrations and nothing of the packages built on it.
A migration only adds: it never drops or rewrites user data.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from importlib.metadata import PackageNotFoundError, entry_points, version

import attrs
from psycopg import sql

from journal.errors import SchemaOutdated, SchemaTooNew
from journal.settings import JournalSettings
from journal.tables import Tables

ENTRY_POINT_GROUP = "slicejournal.schema"
# Serialises every migration step (and so two deploys racing) on one server.
MIGRATION_LOCK_KEY = 0x5_1CE_70_0A
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@attrs.frozen
class Migration:
    """One numbered step of one component's schema."""

    component: Component
    number: int
    name: str
    text: str

    def statement(self, settings: JournalSettings) -> sql.Composed:
        """The step's SQL with every placeholder bound to a quoted identifier."""
        return sql.SQL(self.text).format(**Tables(settings).ddl_names())

    def __str__(self) -> str:
        return f"{self.component.name} {self.number:04d}_{self.name}"


@attrs.frozen
class Component:
    """A package's part of the schema: its migrations, applied in `order` among components.

    `tables` names the settings fields holding its tables' names: the version is
    recorded per component *and* those names, so two journals with different
    table names in one schema are migrated independently.
    """

    name: str
    package: str
    tables: tuple[str, ...]
    order: int = 100

    def key(self, settings: JournalSettings) -> str:
        """The row under which this installation of the component records its version."""
        names = ",".join(str(getattr(settings, field)) for field in self.tables)
        return f"{self.name}({names})"

    def migrations(self) -> list[Migration]:
        """The component's migrations, by number (1, 2, ... with no gap)."""
        found = []
        for entry in resources.files(self.package).joinpath("migrations").iterdir():
            match = _FILE.match(entry.name)
            if match is not None:
                text = entry.read_text(encoding="utf-8")
                found.append(Migration(self, int(match[1]), match[2], text))
        found.sort(key=lambda m: m.number)
        numbers = [m.number for m in found]
        if numbers != list(range(1, len(found) + 1)):
            raise RuntimeError(f"migrations of {self.name} are not numbered 1..n: {numbers}")
        return found

    @property
    def head(self) -> int:
        """The number this release brings the component to."""
        return len(self.migrations())


JOURNAL = Component("journal", "journal", ("journal_table", "snapshot_table"), order=0)


def components() -> list[Component]:
    """Every installed component (the journal's own first)."""
    found = {JOURNAL.name: JOURNAL}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        component = entry.load()
        if isinstance(component, Component):
            found.setdefault(component.name, component)
    return sorted(found.values(), key=lambda c: (c.order, c.name))


def pending(
    settings: JournalSettings,
    versions: Mapping[str, int],
    installed: Sequence[Component] | None = None,
) -> list[Migration]:
    """The steps that bring a database at `versions` to this release, in order."""
    out: list[Migration] = []
    for component in installed if installed is not None else components():
        current = versions.get(component.key(settings), 0)
        out.extend(m for m in component.migrations() if m.number > current)
    return out


def check_versions(
    settings: JournalSettings,
    versions: Mapping[str, int],
    installed: Sequence[Component] | None = None,
) -> None:
    """`SchemaOutdated` / `SchemaTooNew` unless every component is exactly at its head."""
    older, newer = [], []
    schema = settings.schema
    for component in installed if installed is not None else components():
        found, head = versions.get(component.key(settings), 0), component.head
        if found < head:
            older.append(f"{component.name} at {found}, this release needs {head}")
        elif found > head:
            newer.append(f"{component.name} at {found}, this release knows {head}")
    if newer:
        raise SchemaTooNew(schema, "; ".join(newer))
    if older:
        raise SchemaOutdated(schema, "; ".join(older))


@attrs.frozen
class VersionSql:
    """The statements of the version table (built once per settings)."""

    create: sql.Composed
    read: sql.Composed
    record: sql.Composed
    lock: sql.SQL

    @classmethod
    def of(cls, tables: Tables) -> VersionSql:
        table = tables.schema_version
        return cls(
            create=sql.SQL(
                "CREATE SCHEMA IF NOT EXISTS {schema}; "
                "CREATE TABLE IF NOT EXISTS {table} ("
                " component TEXT PRIMARY KEY,"
                " version INT NOT NULL,"
                " release VARCHAR(64) NOT NULL,"
                " migrated_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now())"
            ).format(schema=tables.schema, table=table),
            read=sql.SQL("SELECT component, version FROM {}").format(table),
            record=sql.SQL(
                "INSERT INTO {t} (component, version, release) VALUES (%s, %s, %s) "
                "ON CONFLICT (component) DO UPDATE SET version = excluded.version, "
                "release = excluded.release, migrated_at = now()"
            ).format(t=table),
            lock=sql.SQL("SELECT pg_advisory_xact_lock(%s)"),
        )


def release() -> str:
    """The installed slicejournal version (`slicejournal.__version__`), recorded with each
    migration step."""
    try:
        return version("slicejournal")
    except PackageNotFoundError:  # pragma: no cover - a source tree not installed
        return "0+unknown"


MigrationHook = Callable[[Migration], None]

"""The database schema as numbered, forward-only migrations per component.

A journal is kept for years, through many releases, so its schema is
versioned: each component (`journal`: events and snapshots; the packages
built on it register their own) ships its migrations as
`NNNN_name.sql` files inside its package, and the database records in
`slicejournal_schema_version` the number each component has reached. The
drivers (`journal/aio/migrate.py` and its generated twin) apply what is
missing, one transaction per step under an advisory lock, and refuse a
schema older (run `slicejournal migrate`) or newer (an old worker must not
write to it) than the installed release.

Components are found through the `slicejournal.schema` entry-point group, so
the journal knows its own migrations and nothing of the packages built on it:
each component names its own tables (`ComponentTables`), for the key of its
version row and the placeholders of its migrations.
A migration only adds: it never drops or rewrites user data.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Protocol, cast

import attrs
from psycopg import sql

from journal.errors import InvalidArgument, SchemaOutdated, SchemaTooNew
from journal.tables import Tables

ENTRY_POINT_GROUP = "slicejournal.schema"
# Serialises every migration step (and so two deploys racing) on one server.
MIGRATION_LOCK_KEY = 0x5_1CE_70_0A
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class ComponentTables(Protocol):
    """The names of one component's tables in one schema.

    They key the component's version row (`key_names`) and fill its
    migrations' placeholders (`ddl_names`); each component builds its own, so
    this module knows no component's tables but the journal's.
    """

    @property
    def component(self) -> str:
        """The name of the `Component` these are the tables of."""
        ...

    def key_names(self) -> tuple[str, ...]: ...

    def ddl_names(self) -> Mapping[str, sql.Composable]: ...


class ComponentNames(Protocol):
    """A component's table names before they are placed in a journal's schema: what a
    user writes (e.g. the settings class of the package that owns the tables), turned
    into that component's `ComponentTables` for the journal's schema by `in_schema`."""

    @property
    def component(self) -> str:
        """The name of the `Component` these name the tables of."""
        ...

    def in_schema(self, journal: Tables) -> ComponentTables: ...


# What `Journal.create_schema(tables=...)` and `migrate` accept for one component.
TableNaming = ComponentTables | ComponentNames


def in_schema(journal: Tables, tables: TableNaming) -> ComponentTables:
    """`tables` as `ComponentTables` in `journal`'s schema (placing bare names there)."""
    place: Callable[[Tables], ComponentTables] | None = getattr(tables, "in_schema", None)
    return place(journal) if place is not None else cast(ComponentTables, tables)


@attrs.frozen
class Migration:
    """One numbered step of one component's schema."""

    component: Component
    number: int
    name: str
    text: str

    def statement(self, tables: ComponentTables) -> sql.Composed:
        """The step's SQL with every placeholder bound to a quoted identifier."""
        return sql.SQL(self.text).format(**tables.ddl_names())

    def __str__(self) -> str:
        return f"{self.component.name} {self.number:04d}_{self.name}"


@attrs.frozen
class Component:
    """A package's part of the schema: its migrations, applied in `order` among components.

    `tables` names its tables in a journal's schema when the caller names none
    (their defaults). The version is recorded per component *and* those names,
    so two installations with different table names in one schema are
    migrated independently.
    """

    name: str
    package: str
    tables: Callable[[Tables], ComponentTables]
    order: int = 100

    def key(self, tables: ComponentTables) -> str:
        """The row under which this installation of the component records its version."""
        return f"{self.name}({','.join(tables.key_names())})"

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


JOURNAL = Component("journal", "journal", lambda tables: tables, order=0)


def components() -> list[Component]:
    """Every installed component (the journal's own first)."""
    found = {JOURNAL.name: JOURNAL}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        component = entry.load()
        if isinstance(component, Component):
            found.setdefault(component.name, component)
    return sorted(found.values(), key=lambda c: (c.order, c.name))


@attrs.frozen
class Installed:
    """A component with the names of its tables in one journal's schema."""

    component: Component
    tables: ComponentTables
    # False when the caller named none and these are the defaults: a check then
    # cannot tell which installation in the schema is the caller's and reads them all.
    named: bool

    @property
    def key(self) -> str:
        return self.component.key(self.tables)


def installation(
    journal: Tables,
    tables: Sequence[TableNaming] = (),
    installed: Sequence[Component] | None = None,
) -> list[Installed]:
    """Every installed component in `journal`'s schema, under the names in `tables`
    (one per component at most) or else its defaults; `InvalidArgument` for names
    of a component that is not installed."""
    found = installed if installed is not None else components()
    given: dict[str, ComponentTables] = {}
    for t in map(functools.partial(in_schema, journal), tables):
        if t.component == journal.component:
            raise InvalidArgument("the journal's tables are named by its JournalSettings")
        if t.component in given:
            raise InvalidArgument(f"tables of component {t.component!r} given twice")
        given[t.component] = t
    unknown = sorted(set(given) - {c.name for c in found})
    if unknown:
        raise InvalidArgument(f"no installed schema component is named {unknown}")
    return [
        Installed(
            c,
            given[c.name] if c.name in given else c.tables(journal),
            named=c.name in given or c.name == journal.component,
        )
        for c in found
    ]


def pending(versions: Mapping[str, int], installed: Sequence[Installed]) -> list[Migration]:
    """The steps that bring a database at `versions` to this release, in order."""
    out: list[Migration] = []
    for each in installed:
        current = versions.get(each.key, 0)
        out.extend(m for m in each.component.migrations() if m.number > current)
    return out


def _recorded(versions: Mapping[str, int], each: Installed) -> list[int]:
    """The versions that concern `each`: its own row, or with default names every
    installation of its component in the schema (none recorded: 0)."""
    if each.named:
        return [versions.get(each.key, 0)]
    prefix = f"{each.component.name}("
    return [v for k, v in versions.items() if k.startswith(prefix)] or [0]


def check_versions(
    schema: str, versions: Mapping[str, int], installed: Sequence[Installed]
) -> None:
    """`SchemaOutdated` / `SchemaTooNew` unless every component is exactly at its head."""
    older, newer = [], []
    for each in installed:
        head = each.component.head
        for found in _recorded(versions, each):
            if found < head:
                older.append(f"{each.component.name} at {found}, this release needs {head}")
            elif found > head:
                newer.append(f"{each.component.name} at {found}, this release knows {head}")
    if newer:
        raise SchemaTooNew(schema, "; ".join(newer))
    if older:
        raise SchemaOutdated(schema, "; ".join(older))


_RECORD = sql.SQL(
    "INSERT INTO {t} (component, version, release) VALUES ({c}, {v}, {r}) "
    "ON CONFLICT (component) DO UPDATE SET version = excluded.version, "
    "release = excluded.release, migrated_at = now()"
)


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
            record=_RECORD.format(
                t=table, c=sql.Placeholder(), v=sql.Placeholder(), r=sql.Placeholder()
            ),
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


def migration_script(
    tables: Tables, steps: Sequence[Migration], *, lock_timeout_ms: int, header: str
) -> str:
    """`steps` as the SQL `migrate` runs them, for `psql`: each step's DDL and the row
    recording its version, in a transaction of its own that first takes the migration
    lock. Rendered without a connection (identifiers quoted, values as literals), so
    the same text serves `slicejournal migrate --sql` and the files under `sql/`."""
    installed = {each.component.name: each for each in installation(tables)}
    versions = VersionSql.of(tables)
    out = [header]
    for step in steps:
        each = installed[step.component.name]
        record = _RECORD.format(
            t=tables.schema_version,
            c=sql.Literal(each.key),
            v=sql.Literal(step.number),
            r=sql.Literal(release()),
        )
        out += [
            f"\n-- step {step}",
            "BEGIN;",
            sql.SQL("SELECT pg_advisory_xact_lock({})")
            .format(sql.Literal(MIGRATION_LOCK_KEY))
            .as_string(None)
            + ";",
            f"SET LOCAL lock_timeout = '{lock_timeout_ms}ms';",
            versions.create.as_string(None).strip() + ";",
            step.statement(each.tables).as_string(None).strip(),
            record.as_string(None) + ";",
            "COMMIT;",
        ]
    return "\n".join(out) + "\n"

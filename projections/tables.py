"""Quoted names of the projections' tables, in the journal's schema.

The journal names only its own tables (`journal/tables.py`); the offset
store, management, dead letters, registry and the fleet's tables are the
projections', named by `ProjectionTableNames` (a field of
`ProjectionSettings`). As with the journal's, a configured name reaches SQL
only as a `psycopg.sql.Identifier` built here. The names of the objects
derived from a table (the registry, the lease epoch sequence, the fence
function) are computed exactly as before the move, so existing databases
and their migration key stay valid.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from functools import cached_property
from typing import Any, ClassVar, Concatenate, ParamSpec, Protocol, TypeVar, cast

import attrs
from psycopg import sql

from journal.connection import schema_errors, translate_errors
from journal.errors import InvalidArgument
from journal.tables import Tables, derived_name
from projections.settings import ProjectionTableNames


@attrs.frozen
class ProjectionTables:
    """Qualified identifiers of one installation of the projections' tables.

    Also what the migrations fill the projections' steps with
    (`journal.schema.ComponentTables`): pass one to `Journal.create_schema(tables=...)`
    to create the tables under names other than the defaults.
    """

    journal_tables: Tables
    names: ProjectionTableNames = attrs.field(factory=ProjectionTableNames)
    # The schema component whose migrations these names fill in (projections/schema.py).
    component: ClassVar[str] = "projections"

    def _qualified(self, table: str) -> sql.Identifier:
        return sql.Identifier(self.journal_tables.settings.schema, table)

    @property
    def schema_name(self) -> str:
        """The schema, unquoted (the journal's)."""
        return self.journal_tables.schema_name

    @cached_property
    def offset_store(self) -> sql.Identifier:
        return self._qualified(self.names.offset_table)

    @cached_property
    def commit_channel(self) -> str:
        """The NOTIFY channel on which running instances announce committed offsets
        (`ProjectionManagement.wait_for` listens): short, fixed-length, safe."""
        key = f"{self.schema_name}\x00{self.names.offset_table}".encode()
        return "slicejournal_o_" + hashlib.sha1(key).hexdigest()[:16]

    @cached_property
    def management(self) -> sql.Identifier:
        return self._qualified(self.names.management_table)

    @cached_property
    def registry_name(self) -> str:
        """The projection registry (registered and retired projections, for retention);
        derived from the management table's name, so no new setting changes the
        projections component's migration key."""
        return derived_name(self.names.management_table, "_registry")

    @cached_property
    def registry(self) -> sql.Identifier:
        return self._qualified(self.registry_name)

    @cached_property
    def dead_letter(self) -> sql.Identifier:
        return self._qualified(self.names.dead_letter_table)

    @cached_property
    def fleet(self) -> sql.Identifier:
        return self._qualified(self.names.fleet_table)

    @cached_property
    def fleet_worker(self) -> sql.Identifier:
        return self._qualified(self.names.fleet_worker_table)

    @cached_property
    def lease(self) -> sql.Identifier:
        return self._qualified(self.names.lease_table)

    @cached_property
    def lease_epoch_name(self) -> str:
        """The sequence every lease claim draws its (globally increasing) epoch from."""
        return derived_name(self.names.lease_table, "_epoch")

    @cached_property
    def lease_epoch(self) -> sql.Identifier:
        return self._qualified(self.lease_epoch_name)

    @cached_property
    def lease_fence_name(self) -> str:
        """The function an offset transaction calls to prove it still holds its lease."""
        return derived_name(self.names.lease_table, "_fence")

    @cached_property
    def lease_fence(self) -> sql.Identifier:
        return self._qualified(self.lease_fence_name)

    def key_names(self) -> tuple[str, ...]:
        """The names that key this installation's version row: `projections(...)`."""
        return self.names.key_names()

    def table_names(self) -> tuple[str, ...]:
        """The tables a "relation does not exist" may be about (`schema_errors`): the
        projections' statements read the journal's tables too."""
        return self.journal_tables.table_names() + self.names.key_names()

    def ddl_names(self) -> dict[str, sql.Composable]:
        """The placeholders the files in `projections/migrations/` use."""
        return {
            "schema": self.journal_tables.schema,
            "offset_store": self.offset_store,
            "management": self.management,
            "registry": self.registry,
            "dead_letter": self.dead_letter,
            "fleet": self.fleet,
            "fleet_worker": self.fleet_worker,
            "lease": self.lease,
            "lease_epoch": self.lease_epoch,
            "lease_fence": self.lease_fence,
            "body": sql.SQL(self._dollar_quote()),
        }

    def _dollar_quote(self) -> str:
        """A dollar-quote tag for a function body that no configured name contains,
        so no name can end the body early."""
        inside = self.lease.as_string()  # the only name in the body
        tag, n = "$body$", 0
        while tag in inside:
            n += 1
            tag = f"$body{n}$"
        return tag


def projection_tables(journal: Tables, names: ProjectionTableNames | None) -> ProjectionTables:
    """The projections' tables named `names` (None: the defaults) in `journal`'s schema;
    `InvalidArgument` for anything that is not `ProjectionTableNames`."""
    if names is None:
        return ProjectionTables(journal)
    if not isinstance(names, ProjectionTableNames):
        raise InvalidArgument(f"tables must be ProjectionTableNames, got {names!r}")
    return ProjectionTables(journal, names)


class _Operating(Protocol):
    @property
    def tables(self) -> ProjectionTables: ...


S = TypeVar("S", bound=_Operating)
P = ParamSpec("P")
R = TypeVar("R")


def translate_projection_errors(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R]:
    """`translate_errors` around a public method of an object with projection `tables`
    (a coroutine function or a plain one): a missing table of the projections' (which
    the journal's pool does not know) is `SchemaNotInitialized` too."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def checked_async(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Any:
            with schema_errors(self.tables):
                return await method(self, *args, **kwargs)

        return translate_errors(cast(Callable[Concatenate[S, P], R], checked_async))

    @functools.wraps(method)
    def checked(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with schema_errors(self.tables):
            return method(self, *args, **kwargs)

    return translate_errors(checked)

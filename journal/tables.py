"""Quoted names of every table the product uses, derived from the settings.

Schema and table names are user settings; they reach SQL only as
`psycopg.sql.Identifier`s built here, so no configured name can ever be read
as SQL. The NOTIFY channel is derived from them too.
"""

from __future__ import annotations

import hashlib
from functools import cached_property

import attrs
from psycopg import sql

from journal.settings import JournalSettings

_INDEX_SUFFIX = "_slice_idx"
# Where the migrations record each component's version (journal/schema.py).
SCHEMA_VERSION_TABLE = "slicejournal_schema_version"


def rendered(statement: sql.Composable) -> str:
    """`statement` as text, composed once instead of on every execution.

    psycopg turns a `Composed` into bytes each time it runs it (quoting every
    identifier again); for a statement run per event that is measurable. The
    text is still built from `Identifier`s, and psycopg encodes it in each
    connection's own encoding, so nothing about quoting changes.
    """
    return statement.as_string(None)


@attrs.frozen
class Tables:
    """Qualified identifiers for one journal installation (schema + table names)."""

    settings: JournalSettings

    def _qualified(self, table: str) -> sql.Identifier:
        return sql.Identifier(self.settings.schema, table)

    @cached_property
    def schema(self) -> sql.Identifier:
        return sql.Identifier(self.settings.schema)

    @cached_property
    def journal(self) -> sql.Identifier:
        return self._qualified(self.settings.journal_table)

    @cached_property
    def journal_slice_index(self) -> sql.Identifier:
        # An index name is unqualified and lives in the table's schema.
        return sql.Identifier(_derived_name(self.settings.journal_table, _INDEX_SUFFIX))

    @cached_property
    def snapshot(self) -> sql.Identifier:
        return self._qualified(self.settings.snapshot_table)

    @cached_property
    def snapshot_slice_index(self) -> sql.Identifier:
        return sql.Identifier(_derived_name(self.settings.snapshot_table, _INDEX_SUFFIX))

    @cached_property
    def offset_store(self) -> sql.Identifier:
        return self._qualified(self.settings.offset_table)

    @cached_property
    def management(self) -> sql.Identifier:
        return self._qualified(self.settings.management_table)

    @cached_property
    def registry_name(self) -> str:
        """The projection registry (registered and retired projections, for retention);
        derived from the management table's name, so no new setting changes the
        projections component's migration key."""
        return _derived_name(self.settings.management_table, "_registry")

    @cached_property
    def registry(self) -> sql.Identifier:
        return self._qualified(self.registry_name)

    @cached_property
    def dead_letter(self) -> sql.Identifier:
        return self._qualified(self.settings.dead_letter_table)

    @cached_property
    def fleet(self) -> sql.Identifier:
        return self._qualified(self.settings.fleet_table)

    @cached_property
    def fleet_worker(self) -> sql.Identifier:
        return self._qualified(self.settings.fleet_worker_table)

    @cached_property
    def lease(self) -> sql.Identifier:
        return self._qualified(self.settings.lease_table)

    @cached_property
    def lease_epoch_name(self) -> str:
        """The sequence every lease claim draws its (globally increasing) epoch from."""
        return _derived_name(self.settings.lease_table, "_epoch")

    @cached_property
    def lease_epoch(self) -> sql.Identifier:
        return self._qualified(self.lease_epoch_name)

    @cached_property
    def lease_fence_name(self) -> str:
        """The function an offset transaction calls to prove it still holds its lease."""
        return _derived_name(self.settings.lease_table, "_fence")

    @cached_property
    def lease_fence(self) -> sql.Identifier:
        return self._qualified(self.lease_fence_name)

    @cached_property
    def schema_version(self) -> sql.Identifier:
        """The table recording how far each component's migrations have run."""
        return self._qualified(SCHEMA_VERSION_TABLE)

    @cached_property
    def notify_channel(self) -> str:
        """The LISTEN/NOTIFY channel of this journal table: short, fixed-length, safe."""
        key = f"{self.settings.schema}\x00{self.settings.journal_table}".encode()
        return "slicejournal_" + hashlib.sha1(key).hexdigest()[:16]

    def ddl_names(self) -> dict[str, sql.Composable]:
        """The placeholders the files in `sql/` use."""
        return {
            "schema": self.schema,
            "event_journal": self.journal,
            "event_journal_slice_idx": self.journal_slice_index,
            "snapshot": self.snapshot,
            "snapshot_slice_idx": self.snapshot_slice_index,
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


def _derived_name(table: str, suffix: str) -> str:
    """`table + suffix`, kept within PostgreSQL's 63-byte limit so it is never truncated
    silently: a longer one is cut and a hash of the full name added, so two long names
    sharing a prefix do not share (and silently skip) one object."""
    if len(table.encode("utf-8")) + len(suffix) <= 63:
        return table + suffix
    digest = "_" + hashlib.sha1(table.encode("utf-8")).hexdigest()[:8]
    base = table.encode("utf-8")[: 63 - len(suffix) - len(digest)]
    return base.decode("utf-8", "ignore") + digest + suffix

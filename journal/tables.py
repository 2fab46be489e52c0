"""Quoted names of the journal's tables, derived from the settings.

Schema and table names are user settings; they reach SQL only as
`psycopg.sql.Identifier`s built here, so no configured name can ever be read
as SQL. The NOTIFY channel is derived from them too. A package built on the
journal names its own tables in its own module (the same way, with
`derived_name` for the objects named after a table), so this one lists only
the journal's.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import ClassVar

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
    # The component whose migrations these names fill in (journal/schema.py).
    component: ClassVar[str] = "journal"

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
        return sql.Identifier(derived_name(self.settings.journal_table, _INDEX_SUFFIX))

    @cached_property
    def snapshot(self) -> sql.Identifier:
        return self._qualified(self.settings.snapshot_table)

    @cached_property
    def snapshot_slice_index(self) -> sql.Identifier:
        return sql.Identifier(derived_name(self.settings.snapshot_table, _INDEX_SUFFIX))

    @cached_property
    def durable_state(self) -> sql.Identifier:
        return self._qualified(self.settings.durable_state_table)

    @cached_property
    def durable_state_slice_index(self) -> sql.Identifier:
        return sql.Identifier(derived_name(self.settings.durable_state_table, _INDEX_SUFFIX))

    @cached_property
    def schema_version(self) -> sql.Identifier:
        """The table recording how far each component's migrations have run."""
        return self._qualified(SCHEMA_VERSION_TABLE)

    @cached_property
    def notify_channel(self) -> str:
        """The LISTEN/NOTIFY channel of this journal table: short, fixed-length, safe."""
        key = f"{self.settings.schema}\x00{self.settings.journal_table}".encode()
        return "slicejournal_" + hashlib.sha1(key).hexdigest()[:16]

    @property
    def schema_name(self) -> str:
        """The schema, unquoted (for messages and catalog look-ups)."""
        return self.settings.schema

    def key_names(self) -> tuple[str, ...]:
        """The table names that key this installation's version row (journal/schema.py)."""
        return (self.settings.journal_table, self.settings.snapshot_table)

    def table_names(self) -> tuple[str, ...]:
        """The tables a "relation does not exist" may be about (`schema_errors`)."""
        return (*self.key_names(), self.settings.durable_state_table)

    def ddl_names(self) -> dict[str, sql.Composable]:
        """The placeholders the files in `migrations/` use."""
        return {
            "schema": self.schema,
            "event_journal": self.journal,
            "event_journal_slice_idx": self.journal_slice_index,
            "snapshot": self.snapshot,
            "snapshot_slice_idx": self.snapshot_slice_index,
            "durable_state": self.durable_state,
            "durable_state_slice_idx": self.durable_state_slice_index,
        }


def derived_name(table: str, suffix: str) -> str:
    """`table + suffix` (an index, a sequence, a companion table), kept within
    PostgreSQL's 63-byte limit so it is never truncated silently: a longer one is cut
    and a hash of the full name added, so two long names sharing a prefix do not share
    (and silently skip) one object."""
    if len(table.encode("utf-8")) + len(suffix) <= 63:
        return table + suffix
    digest = "_" + hashlib.sha1(table.encode("utf-8")).hexdigest()[:8]
    base = table.encode("utf-8")[: 63 - len(suffix) - len(digest)]
    return base.decode("utf-8", "ignore") + digest + suffix

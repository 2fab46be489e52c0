# Generated from journal/aio/durable_state.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""`SyncDurableStateStore`: the durable state store beside a journal, and its changes by slices.

Built from an open journal (`SyncDurableStateStore(journal)`), it shares the
journal's pools, serializers, settings and notifications. Writes are Pekko's
optimistic upserts (`journal/query/state_sql.py`); the changes query is the
journal's slice query over the durable state table (`STATE_CHANGES`), with
the same horizon, backtracking and heartbeats as events.

As Akka's store, a write can carry more in its own transaction: a *change event*
appended to the id's events in the journal (so `events_by_slices` consumers see
every change), and the store's *change handler*, which updates another table
with the write (a read model that can never lag the state).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import attrs
from psycopg import Connection

from journal.connection import translate_errors
from journal.durable_state import (
    DurableState,
    DurableStateChange,
    check_change_handler,
    row_to_state,
    state_params,
    written_change,
)
from journal.errors import ConcurrencyError
from journal.model import TimestampOffset
from journal.query.by_slice import check_slice_query
from journal.query.source import STATE_CHANGES
from journal.query.state_sql import DurableStateSql
from journal.settings import QuerySettings
from journal.slices import validate_persistence_id
from journal.sync import prepared
from journal.sync.flavour import ASYNC, call_back
from journal.sync.journal import SyncJournal
from journal.sync.slice_reader import SliceReader
from journal.sync.writer import callers_savepoint
from journal.writer import PreparedAppend, prepare_append


class SyncDurableStateStore:
    """Pekko's durable state store on the journal's database: one row per id, its latest
    revision; `upsert` and `delete` take the *new* revision (previous + 1)."""

    def __init__(
        self,
        journal: SyncJournal,
        *,
        change_handler: Callable[[Connection[Any], DurableStateChange], None] | None = None,
    ) -> None:
        """`change_handler(conn, change)` (optional) runs in the transaction of every
        `upsert` and `delete` of this store, after the row is written, with the change
        it made (`source` "write"; a deletion with `deleted`): what it writes with
        `conn` commits with the state or not at all, and an exception from it undoes
        the write and reaches the caller (a database error as the journal's typed
        errors, as every error of a write). As Akka's change handler."""
        check_change_handler(change_handler, asynchronous=ASYNC)
        self.journal = journal
        self._change_handler = change_handler
        self._sql = DurableStateSql.of(journal.tables)
        self._slices = SliceReader(
            journal.read_pool,
            journal.tables,
            journal.serializers,
            journal.settings.query,
            journal._listener,
        )

    # -- writes -------------------------------------------------------------

    @translate_errors
    def upsert(
        self,
        persistence_id: str,
        state: Any,
        *,
        revision: int,
        tags: Sequence[str] = (),
        conn: Connection[Any] | None = None,
        change_event: Any = None,
    ) -> None:
        """Store `state` as the id's revision `revision`, which must be the stored
        revision + 1 (1 for a new id); otherwise `ConcurrencyError`, nothing written.

        With `conn`, the row is written inside that connection's transaction and
        becomes visible (to `get` and the changes query) when the caller commits.
        `change_event` (optional): an event appended to the id's events in the journal
        in the same transaction, with `tags` and the id's next seq_nr (the revision,
        as in Akka, when every write of the id carries one): `events_by_slices` then
        sees every change. If the id's events moved meanwhile, `ConcurrencyError` and
        nothing is written.
        """
        params = state_params(self.journal.serializers, persistence_id, revision, state, tags)
        self._write(params, conn, state, self._event(params, change_event))

    @translate_errors
    def delete(
        self,
        persistence_id: str,
        *,
        revision: int,
        conn: Connection[Any] | None = None,
        change_event: Any = None,
    ) -> None:
        """Delete the id's state as its revision `revision` (stored revision + 1), keeping
        a row with no payload: the revision is never reused, and the changes query
        delivers the deletion (`DurableStateChange.deleted`). `ConcurrencyError` and
        `change_event` as for `upsert`."""
        params = state_params(
            self.journal.serializers, persistence_id, revision, None, (), delete=True
        )
        self._write(params, conn, None, self._event(params, change_event))

    def _event(self, params: dict[str, Any], change_event: Any) -> PreparedAppend | None:
        """The change event validated and serialized before anything is written (its
        `expected_seq_nr` is set in the write's transaction); None without one."""
        if change_event is None:
            return None
        return prepare_append(
            self.journal.serializers, params["pid"], [change_event], 0,
            params["tags"] or (), None,
        )  # fmt: skip

    def _write(
        self,
        params: dict[str, Any],
        conn: Connection[Any] | None,
        value: Any,
        change_event: PreparedAppend | None,
    ) -> None:
        # A bare write is one statement; with a change event or handler, the write and
        # what comes with it share a transaction (a savepoint in the caller's).
        more = change_event is not None or self._change_handler is not None
        if conn is not None:
            if more:
                with callers_savepoint(conn):
                    self._write_on(conn, params, value, change_event)
            else:
                self._write_on(conn, params, value, change_event)
        else:
            with self.journal.pool.connection() as own:
                if more:
                    with own.transaction():
                        self._write_on(own, params, value, change_event)
                else:  # the pool's own idle connection: the write runs prepared
                    self._write_on(own, params, value, change_event, own=True)
        notifier = self.journal._notifier
        if notifier is not None:
            notifier.changed(params["entity_type"], params["slice"])

    def _write_on(
        self,
        conn: Connection[Any],
        params: dict[str, Any],
        value: Any,
        change_event: PreparedAppend | None,
        *,
        own: bool = False,
    ) -> None:
        statement = self._sql.insert if params["revision"] == 1 else self._sql.update
        written = prepared.first_row(conn, statement, statement.values(params), prepared=own)
        if written is None:
            cur = conn.execute(self._sql.revision_of, (params["pid"],))
            row = cur.fetchone()
            actual = 0 if row is None else int(row[0])
            store = "durable state store"
            raise ConcurrencyError(
                params["pid"], params["previous"], actual, what="revision", store=store
            )
        if change_event is not None:
            # The row written above holds the id: no other write of its state can add a
            # change event before this transaction ends.
            writer = self.journal._writer
            highest = writer.highest_seq_nr(params["pid"], conn)
            writer.append(attrs.evolve(change_event, expected_seq_nr=highest), conn)
        if self._change_handler is not None:
            change = written_change(params, value, written[0])
            call_back("change_handler", self._change_handler(conn, change))

    # -- reads --------------------------------------------------------------

    @translate_errors
    def get(self, persistence_id: str) -> DurableState | None:
        """The id's latest state and revision (`deleted` after `delete`), or None."""
        pid = validate_persistence_id(persistence_id)
        with self.journal.pool.connection() as conn:
            cur = conn.execute(self._sql.select, (pid,))
            row = cur.fetchone()
        return None if row is None else row_to_state(self.journal.serializers, pid, row)

    @translate_errors
    def revision(self, persistence_id: str) -> int:
        """The id's stored revision, 0 if it has none (deleted states keep theirs)."""
        pid = validate_persistence_id(persistence_id)
        with self.journal.pool.connection() as conn:
            cur = conn.execute(self._sql.revision_of, (pid,))
            row = cur.fetchone()
        return 0 if row is None else int(row[0])

    def changes_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None = None,
        *,
        heartbeats: bool = False,
        query_settings: QuerySettings | None = None,
    ) -> Generator[DurableStateChange, None, None]:
        """Live stream of the entity type's state changes in a slice range, never ending.

        Each change is the latest revision of an id the query saw (revisions of one
        id arrive increasing; intermediate ones may be skipped), ordered by
        (db_timestamp, revision), except that backtracking changes (`source ==
        "backtracking"`, value not loaded) re-deliver recent ones that may have
        committed late: keep the highest revision per id. The visibility horizon,
        backtracking and `heartbeats` work as for `SyncJournal.events_by_slices`.
        """
        check_slice_query(entity_type, min_slice, max_slice, offset)
        return self._slices.stream(
            entity_type,
            min_slice,
            max_slice,
            offset,
            source=STATE_CHANGES,
            live=True,
            heartbeats=heartbeats,
            settings=query_settings,
        )

    def current_changes_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None = None,
        *,
        query_settings: QuerySettings | None = None,
    ) -> Generator[DurableStateChange, None, None]:
        """The range's changes up to the database time at the start, then the end."""
        check_slice_query(entity_type, min_slice, max_slice, offset)
        return self._slices.stream(
            entity_type,
            min_slice,
            max_slice,
            offset,
            source=STATE_CHANGES,
            live=False,
            settings=query_settings,
        )

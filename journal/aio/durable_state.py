"""`DurableStateStore`: the durable state store beside a journal, and its changes by slices.

Built from an open journal (`DurableStateStore(journal)`), it shares the
journal's pools, serializers, settings and notifications. Writes are Pekko's
optimistic upserts (`journal/query/state_sql.py`); the changes query is the
journal's slice query over the durable state table (`STATE_CHANGES`), with
the same horizon, backtracking and heartbeats as events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

from psycopg import AsyncConnection

from journal.aio.journal import Journal
from journal.aio.slice_reader import SliceReader
from journal.connection import translate_errors
from journal.durable_state import (
    DurableState,
    DurableStateChange,
    row_to_state,
    state_params,
)
from journal.errors import ConcurrencyError
from journal.model import TimestampOffset
from journal.query.by_slice import check_slice_query
from journal.query.source import STATE_CHANGES
from journal.query.state_sql import DurableStateSql
from journal.settings import QuerySettings
from journal.slices import validate_persistence_id


class DurableStateStore:
    """Pekko's durable state store on the journal's database: one row per id, its latest
    revision; `upsert` and `delete` take the *new* revision (previous + 1)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
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
    async def upsert(
        self,
        persistence_id: str,
        state: Any,
        *,
        revision: int,
        tags: Sequence[str] = (),
        conn: AsyncConnection[Any] | None = None,
    ) -> None:
        """Store `state` as the id's revision `revision`, which must be the stored
        revision + 1 (1 for a new id); otherwise `ConcurrencyError`, nothing written.

        With `conn`, the row is written inside that connection's transaction and
        becomes visible (to `get` and the changes query) when the caller commits.
        """
        params = state_params(self.journal.serializers, persistence_id, revision, state, tags)
        await self._write(params, conn)

    @translate_errors
    async def delete(
        self,
        persistence_id: str,
        *,
        revision: int,
        conn: AsyncConnection[Any] | None = None,
    ) -> None:
        """Delete the id's state as its revision `revision` (stored revision + 1), keeping
        a row with no payload: the revision is never reused, and the changes query
        delivers the deletion (`DurableStateChange.deleted`). `ConcurrencyError` as for
        `upsert`."""
        params = state_params(
            self.journal.serializers, persistence_id, revision, None, (), delete=True
        )
        await self._write(params, conn)

    async def _write(self, params: dict[str, Any], conn: AsyncConnection[Any] | None) -> None:
        statement = self._sql.insert if params["revision"] == 1 else self._sql.update
        row: Any = None
        if conn is not None:
            cur = await conn.execute(statement, params)
            written = cur.rowcount
            if written != 1:
                cur = await conn.execute(self._sql.revision_of, (params["pid"],))
                row = await cur.fetchone()
        else:
            async with self.journal.pool.connection() as own:
                cur = await own.execute(statement, params)
                written = cur.rowcount
                if written != 1:
                    cur = await own.execute(self._sql.revision_of, (params["pid"],))
                    row = await cur.fetchone()
        if written != 1:
            actual = 0 if row is None else int(row[0])
            store = "durable state store"
            raise ConcurrencyError(
                params["pid"], params["previous"], actual, what="revision", store=store
            )
        notifier = self.journal._notifier
        if notifier is not None:
            notifier.changed(params["entity_type"], params["slice"])

    # -- reads --------------------------------------------------------------

    @translate_errors
    async def get(self, persistence_id: str) -> DurableState | None:
        """The id's latest state and revision (`deleted` after `delete`), or None."""
        pid = validate_persistence_id(persistence_id)
        async with self.journal.pool.connection() as conn:
            cur = await conn.execute(self._sql.select, (pid,))
            row = await cur.fetchone()
        return None if row is None else row_to_state(self.journal.serializers, pid, row)

    @translate_errors
    async def revision(self, persistence_id: str) -> int:
        """The id's stored revision, 0 if it has none (deleted states keep theirs)."""
        pid = validate_persistence_id(persistence_id)
        async with self.journal.pool.connection() as conn:
            cur = await conn.execute(self._sql.revision_of, (pid,))
            row = await cur.fetchone()
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
    ) -> AsyncGenerator[DurableStateChange, None]:
        """Live stream of the entity type's state changes in a slice range, never ending.

        Each change is the latest revision of an id the query saw (revisions of one
        id arrive increasing; intermediate ones may be skipped), ordered by
        (db_timestamp, revision), except that backtracking changes (`source ==
        "backtracking"`, value not loaded) re-deliver recent ones that may have
        committed late: keep the highest revision per id. The visibility horizon,
        backtracking and `heartbeats` work as for `Journal.events_by_slices`.
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
    ) -> AsyncGenerator[DurableStateChange, None]:
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

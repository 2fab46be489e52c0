# Generated from projections/aio/core_io.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The projection core's one I/O seam: its journal reads, answered on a connection.

`ProjectionCore` asks for four things while it validates an envelope: an
unknown id's stored offset row, the timestamp of an id's previous event and
the events of a gap (each with the journal's deletion evidence, so a gap is
accepted only when the journal shows it deleted), an event's payload.
Every runner answers them here — the in-process runners from the
journal's read pool, the Spark sink on its partition's own (fenced)
connection through the generated sync twin — with the journal's own
statements, so no runner carries a copy of this SQL. A projection over
durable state (`source=STATE_CHANGES`) asks only for stored offsets and
payloads; a payload is the id's current state (`DurableStateSql.select`).

`drive` is the one loop that executes a core's actions, for every runner of
this flavour: the in-process runner and, through the sync twin, the Spark sink.
What differs between them — a transaction per batch with the recovery strategy,
or the partition's one fenced transaction — is what they pass it to write with;
a new kind of action is a change here, never a second loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from psycopg import Connection
from psycopg_pool import ConnectionPool

from journal.durable_state import row_to_change
from journal.filter import EventFilter
from journal.model import EventEnvelope
from journal.query import sql as q
from journal.query.source import EVENTS, RowSource
from journal.query.state_sql import DurableStateSql
from journal.rows import row_to_envelope
from journal.serialization import SerializerRegistry
from journal.tables import Tables
from projections.core import (
    Action,
    Commit,
    GapFill,
    Handle,
    LoadPayload,
    MissingEvents,
    Previous,
    PreviousTimestamp,
    ProjectionCore,
    SaveOffsets,
    StoredOffset,
)
from projections.offset_sql import OffsetSql, records_of

Read = StoredOffset | PreviousTimestamp | MissingEvents | LoadPayload


def _deleted_to(conn: Connection[Any], tables: Tables, pid: str, from_seq: int) -> int:
    cur = conn.execute(q.deleted_to(tables), (pid, from_seq))
    row = cur.fetchone()
    return 0 if row is None else int(row[0])


def reply_to(
    conn: Connection[Any],
    tables: Tables,
    registry: SerializerRegistry,
    request: Read,
    offsets: OffsetSql | None = None,
    event_filter: EventFilter | None = None,
    source: RowSource[Any] = EVENTS,
) -> Any:
    """The reply `ProjectionCore.answer` expects for `request`, read on `conn`
    (`offsets`: the projection's offset statements, for a `StoredOffset`; `source`:
    what the projection reads, whose payloads a `LoadPayload` loads)."""
    pid = request.persistence_id
    if isinstance(request, StoredOffset):
        assert offsets is not None, "a StoredOffset needs the projection's OffsetSql"
        statement = offsets.stored(pid, request.slice)
        cur = conn.execute(statement.query, statement.params)
        stored = records_of(cur.fetchall())
        return stored[0] if stored else None
    if isinstance(request, PreviousTimestamp):
        _, delivered = q.delivered_rows()
        cur = conn.execute(
            q.delivered_timestamp_of(tables), {"pid": pid, "seq_nr": request.seq_nr, **delivered}
        )
        row = cur.fetchone()
        timestamp = None if row is None else row[0]
        deleted_to = 0 if row is not None else _deleted_to(conn, tables, pid, request.seq_nr)
        return Previous(timestamp, deleted_to)
    if isinstance(request, MissingEvents):
        params = {
            "pid": pid,
            "from_seq": request.from_seq_nr,
            "to_seq": request.to_seq_nr,
            "limit": request.to_seq_nr - request.from_seq_nr + 1,
        }
        by_pid, filter_params = q.by_persistence_id(tables, event_filter, tombstones=True)
        cur = conn.execute(by_pid, {**params, **filter_params})
        rows = cur.fetchall()
        events = [row_to_envelope(r, registry, source="persistence_id") for r in rows]
        complete = len(events) == params["limit"]
        deleted_to = 0 if complete else _deleted_to(conn, tables, pid, request.from_seq_nr)
        return GapFill(events, deleted_to)
    if not source.consecutive:
        # Durable state: the id's current revision, which may be newer than the one asked.
        cur = conn.execute(DurableStateSql.of(tables).select, (pid,))
        row = cur.fetchone()
        return None if row is None else row_to_change(registry, pid, row, source="load")
    cur = conn.execute(q.one_event(tables), (pid, request.seq_nr))
    row = cur.fetchone()
    found: EventEnvelope | None = (
        None if row is None else row_to_envelope(row, registry, source="load")
    )
    return found


class CoreReads:
    """Answers a core's journal reads from a pool (each read on a connection of its own)
    or on one given connection (inside the caller's transaction)."""

    def __init__(
        self,
        tables: Tables,
        registry: SerializerRegistry,
        *,
        pool: ConnectionPool[Any] | None = None,
        conn: Connection[Any] | None = None,
        offsets: OffsetSql | None = None,
        event_filter: EventFilter | None = None,
        source: RowSource[Any] = EVENTS,
    ) -> None:
        self._tables = tables
        self._source = source
        self._registry = registry
        self._pool = pool
        self._conn = conn
        self._offsets = offsets
        # A projection's filter: gap fills read the events it leaves out as keys only.
        self._filter = event_filter

    def reply(self, request: Read) -> Any:
        """Read what `request` asks for."""
        if self._conn is not None:
            return reply_to(
                self._conn, self._tables, self._registry, request, self._offsets, self._filter,
                self._source,
            )  # fmt: skip
        assert self._pool is not None, "CoreReads needs a pool or a connection"
        with self._pool.connection() as conn:
            return reply_to(
                conn, self._tables, self._registry, request, self._offsets, self._filter,
                self._source,
            )  # fmt: skip

    def drive(
        self, core: ProjectionCore, action: Action | None
    ) -> Handle | Commit | SaveOffsets | None:
        """Answer the core's reads until it asks for something else: the returned
        `Handle`, `Commit` or `SaveOffsets` (or None: nothing to do)."""
        while isinstance(action, StoredOffset | PreviousTimestamp | MissingEvents | LoadPayload):
            action = core.answer(self.reply(action), time.monotonic())
        assert action is None or isinstance(action, Handle | Commit | SaveOffsets)
        return action


def drive(
    core: ProjectionCore,
    action: Action | None,
    reads: CoreReads,
    *,
    handle: Callable[[Handle], bool],
    commit: Callable[[Commit], bool],
    save: Callable[[SaveOffsets], None],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Execute `action` and every action the core asks for after it, until it has none:
    its reads through `reads`, its writes through the runner's own `handle` (an
    at-least-once handler call), `commit` (the handler and the offsets in one
    transaction) and `save` (offsets alone); each outcome is fed back. `handle` and
    `commit` return True when the envelopes were dead-lettered (skipped)."""
    while (action := reads.drive(core, action)) is not None:
        if isinstance(action, Handle):
            done = core.skipped if handle(action) else core.handled
        elif isinstance(action, Commit):
            done = core.skipped if commit(action) else core.committed
        else:
            save(action)
            done = core.committed
        action = done(clock())

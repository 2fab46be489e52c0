"""The offset store's async executor: runs `OffsetSql` statements on a connection.

Saving happens on the caller's connection so exactly-once handlers commit
their writes and the offsets in one transaction. The sync twin is generated
from this module; both run exactly the statements `projections.offset_sql`
builds. The runner's management statements (the pause check, dead
letters, the backlog reading) are executed here too, so the runner never imports
the operators' module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
from psycopg import AsyncConnection, AsyncRawCursor

from journal.durable_state import DurableStateChange
from journal.errors import ProtocolError
from journal.filter import EventFilter
from journal.model import EventEnvelope
from journal.query.source import EVENTS, STATE_CHANGES, RowSource
from journal.slices import SliceRange
from projections.backlog import DEFAULT_SIZE_CAP, Backlog, measure
from projections.fencing import Fence
from projections.management_sql import (
    ManagementSql,
    filter_from_json,
    filter_to_json,
    pauses,
)
from projections.offset_sql import OffsetSql, Statement, records_of
from projections.offset_store import Record
from projections.tables import ProjectionTables

_log = logging.getLogger("slicejournal.projections.offsets")


@attrs.frozen
class Written:
    """A statement that must write `rows` rows (the fenced insert of offset rows: a fence
    that returned no row would otherwise insert nothing and commit without an error)."""

    cursor: Any
    rows: int

    def check(self) -> None:
        """Raise `ProtocolError` unless the statement wrote exactly its rows."""
        if self.cursor.rowcount != self.rows:
            raise ProtocolError(
                f"the offset store wrote {self.cursor.rowcount} row(s) where it had {self.rows}"
            )


class OffsetDao:
    """Executes offset store statements for one projection name (async driver)."""

    def __init__(self, tables: ProjectionTables, projection_name: str) -> None:
        self.name = projection_name
        self.sql = OffsetSql(tables, projection_name)

    async def _run(
        self,
        conn: AsyncConnection[Any],
        statement: Statement,
        unchecked: list[Written] | None = None,
    ) -> int:
        """Execute `statement`; the rows it must write are checked now, or, in a pipeline
        whose results are not in yet, added to `unchecked` (`Written.check` them after)."""
        if statement.raw:
            cur: Any = AsyncRawCursor(conn)
            await cur.execute(statement.query, statement.params)
        else:
            cur = await conn.execute(statement.query, statement.params)
        if statement.rows is not None:
            written = Written(cur, statement.rows)
            if cur.rowcount < 0 and unchecked is not None:  # pipelined: no result yet
                unchecked.append(written)
            else:
                written.check()
        return int(cur.rowcount)

    async def load(self, conn: AsyncConnection[Any], slices: SliceRange) -> list[Record]:
        statement = self.sql.load(slices)
        cur = await conn.execute(statement.query, statement.params)
        return records_of(await cur.fetchall())

    async def save(
        self,
        conn: AsyncConnection[Any],
        key: str,
        records: Sequence[Record],
        fence: Fence | None = None,
    ) -> list[Written]:
        """Insert event records and progress markers (replacing older markers of those slices).

        Returns the statements whose rows could not be counted yet (in a pipeline):
        `Written.check` each once its results are in, after the pipeline's Sync."""
        unchecked: list[Written] = []
        for statement in self.sql.save(key, records, fence):
            await self._run(conn, statement, unchecked)
        return unchecked

    async def cleanup(
        self,
        conn: AsyncConnection[Any],
        slices: SliceRange,
        window: timedelta,
        consumed: timedelta | None = None,
    ) -> int:
        """Delete rows older than each slice's latest minus the window (and, with
        `consumed`, stored longer ago than that); returns the count."""
        return await self._run(conn, self.sql.cleanup(slices, window, consumed))

    async def clear(self, conn: AsyncConnection[Any], slices: SliceRange) -> None:
        await self._run(conn, self.sql.clear(slices))

    async def set_start(
        self, conn: AsyncConnection[Any], key: str, slices: SliceRange, timestamp: datetime
    ) -> None:
        """Replace the range's offsets by start markers: resume at `timestamp`, skip older."""
        for statement in self.sql.set_start(key, slices, timestamp):
            await self._run(conn, statement)


async def range_is_paused(
    conn: AsyncConnection[Any], statements: ManagementSql, name: str, slices: SliceRange
) -> bool:
    """Paused as a whole ("*"), or a paused range shares a slice with `slices`."""
    statement = statements.paused_keys_of(name)
    cur = await conn.execute(statement.query, statement.params)
    return pauses(slices, [key for (key,) in await cur.fetchall()])


async def insert_dead_letters(
    conn: AsyncConnection[Any],
    statements: ManagementSql,
    name: str,
    key: str,
    envelopes: Sequence[EventEnvelope | DurableStateChange],
    error: str,
) -> None:
    """One dead-letter row per envelope, on the caller's transaction."""
    for statement in statements.dead_letters_of(name, key, envelopes, error):
        await conn.execute(statement.query, statement.params)


async def read_backlog(
    conn: AsyncConnection[Any],
    statements: ManagementSql,
    name: str,
    entity_type: str,
    slices: SliceRange,
    cap: int = DEFAULT_SIZE_CAP,
    event_filter: EventFilter | None = None,
    source: RowSource[Any] = EVENTS,
) -> Backlog:
    """The range's backlog (projections/backlog.py): one statement, measured by `measure`;
    with `event_filter`, only the events it lets through count; `source`: what the
    projection reads (`STATE_CHANGES`: the durable state's changes)."""
    statement, params = statements.backlog(event_filter, source=source)
    params |= {"name": name, "et": entity_type, "lo": slices.min_slice,
               "hi": slices.max_slice, "cap": cap}  # fmt: skip
    cur = await conn.execute(statement, params)
    now, oldest, unhandled = await cur.fetchone() or (None, None, 0)
    assert now is not None
    return measure(now, oldest, int(unhandled), cap)


async def record_filter(
    conn: AsyncConnection[Any],
    statements: ManagementSql,
    name: str,
    event_filter: EventFilter | None,
) -> None:
    """Record the filter a running instance of `name` applies (None: clear it), for
    `status` and the backlog read by management."""
    if event_filter is None:
        await _record(conn, statements.clear_filter, (name,), name, "its filter", 3)
    else:
        params = (name, int(time.time() * 1000), filter_to_json(event_filter))
        await _record(conn, statements.record_filter, params, name, "its filter", 3)


# What a projection over the durable state's changes records as `reads` (events: NULL).
DURABLE_STATE_READS = "durable_state"


async def record_reads(
    conn: AsyncConnection[Any], statements: ManagementSql, name: str, source: RowSource[Any]
) -> None:
    """Record what a running instance of `name` reads (events: cleared), for `status`
    and the backlog read by management."""
    if source is STATE_CHANGES:
        params = (name, int(time.time() * 1000), DURABLE_STATE_READS)
        await _record(conn, statements.record_reads, params, name, "what it reads", 4)
    else:
        await _record(conn, statements.clear_reads, (name,), name, "what it reads", 4)


async def _record(
    conn: AsyncConnection[Any],
    statement: Any,
    params: tuple[Any, ...],
    name: str,
    what: str,
    migration: int,
) -> None:
    """Run a running instance's record of itself in the management row '*'. A schema
    not migrated yet (opened with `check_schema=False`, as the old release's instances
    are during a rolling upgrade) has no column to record into: a warning, no failure."""
    try:
        await conn.execute(statement, params)
    except psycopg.errors.UndefinedColumn:
        _log.warning("projection %s: %s is not recorded until `slicejournal migrate` has "
                     "run (projections migration %d)", name, what, migration)  # fmt: skip


async def recorded_source(
    conn: AsyncConnection[Any], statements: ManagementSql, name: str
) -> RowSource[Any]:
    """What the running instances of `name` recorded they read (events if nothing)."""
    try:
        cur = await conn.execute(statements.recorded_reads, (name,))
    except psycopg.errors.UndefinedColumn:
        return EVENTS  # not migrated yet: nothing recorded
    row = await cur.fetchone()
    return STATE_CHANGES if row is not None and row[0] == DURABLE_STATE_READS else EVENTS


async def recorded_filter(
    conn: AsyncConnection[Any], statements: ManagementSql, name: str
) -> EventFilter | None:
    """The filter the running instances of `name` recorded (None: none)."""
    cur = await conn.execute(statements.recorded_filter, (name,))
    row = await cur.fetchone()
    return None if row is None else filter_from_json(row[0])

"""Operating a projection from outside: pause/resume, set/clear offsets, status.

State lives in PostgreSQL (`projection_management`, the offset store), so an
operator's command reaches every running instance, in any process, within
`management_poll_interval`, and survives restarts and rescaling. Pausing
the whole projection uses the key "*"; pausing a slice range ("min-max")
pauses every instance that handles any slice of it, whatever the current
split into ranges is. `SyncProjectionManagement` is generated from this module.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from journal.aio.journal import Journal
from journal.filter import EventFilter
from journal.model import EventEnvelope
from journal.slices import SliceRange, slice_ranges, validate_entity_type
from projections.aio.offset_dao import (
    OffsetDao,
    range_is_paused,
    read_backlog,
    recorded_filter,
    recorded_source,
)
from projections.aio.wait import wait_until_handled
from projections.backlog import Backlog
from projections.errors import UnknownProjection
from projections.management import (
    DeadLetter,
    RangeStatus,
    check_letters,
    check_ranges,
    check_timestamp,
    dead_letter_of,
)
from projections.management_sql import ManagementSql
from projections.names import ALL_RANGES, validate_name
from projections.settings import ProjectionTableNames
from projections.tables import projection_tables, translate_projection_errors
from projections.wait import check_targets, check_timeout


class ProjectionManagement:
    """Pause, resume, set or clear offsets, read status — by projection name."""

    def __init__(self, journal: Journal, *, tables: ProjectionTableNames | None = None) -> None:
        """`tables`: the names of the projections' tables, if not the defaults (those of
        the projections' `ProjectionSettings.tables`)."""
        self._journal = journal
        self.tables = projection_tables(journal.tables, tables)
        self._sql = ManagementSql(self.tables)

    async def _set_paused(self, name: str, slices: SliceRange | None, paused: bool) -> None:
        key = ALL_RANGES if slices is None else SliceRange.check(slices).key
        async with self._journal.pool.connection() as conn:
            await conn.execute(
                self._sql.upsert, (validate_name(name), key, paused, int(time.time() * 1000))
            )

    @translate_projection_errors
    async def pause(self, name: str, slice_range: SliceRange | None = None) -> None:
        """Pause every instance of the projection (or only the one for `slice_range`)."""
        await self._set_paused(name, slice_range, True)

    @translate_projection_errors
    async def resume(self, name: str, slice_range: SliceRange | None = None) -> None:
        """Undo `pause` (for the same scope)."""
        await self._set_paused(name, slice_range, False)

    @translate_projection_errors
    async def is_paused(self, name: str, slice_range: SliceRange) -> bool:
        """True if the projection as a whole, or a paused range overlapping this one, is."""
        validate_name(name)
        async with self._journal.pool.connection() as conn:
            return await range_is_paused(conn, self._sql, name, SliceRange.check(slice_range))

    @translate_projection_errors
    async def set_offset(
        self, name: str, timestamp: datetime, slices: SliceRange = SliceRange.FULL
    ) -> None:
        """Make the projection resume at `timestamp` for these slices, skipping older events.

        Takes effect when instances (re)start; pause or stop them first.
        """
        check_timestamp(timestamp)
        SliceRange.check(slices, "slices")
        async with self._journal.pool.connection() as conn, conn.transaction():
            await OffsetDao(self.tables, validate_name(name)).set_start(
                conn, slices.key, slices, timestamp
            )

    @translate_projection_errors
    async def clear_offset(self, name: str, slices: SliceRange = SliceRange.FULL) -> None:
        """Forget the projection's offsets: it restarts from the beginning of the journal.

        Takes effect when instances (re)start; stop them first.
        """
        SliceRange.check(slices, "slices")
        async with self._journal.pool.connection() as conn:
            await OffsetDao(self.tables, validate_name(name)).clear(conn, slices)

    @translate_projection_errors
    async def status(
        self, name: str, entity_type: str, ranges: Sequence[SliceRange] | int = 1
    ) -> list[RangeStatus]:
        """Latest stored offset, journal head, backlog and paused state per slice range.

        The backlog counts only the events the projection's filter lets through (the
        one its running instances recorded, `event_filter`). For a projection over
        durable state (its instances record it) the head and the backlog are its
        entity type's durable state changes.

        Raises `UnknownProjection` if no projection of that name has stored an
        offset, been paused or resumed, or dead-lettered an envelope: a typo in
        the name is reported, not shown as a projection that never ran.
        """
        validate_name(name)
        validate_entity_type(entity_type)
        rs = slice_ranges(ranges) if isinstance(ranges, int) else check_ranges(ranges)
        out = []
        async with self._journal.pool.connection() as conn:
            await self._require_known(conn, name)
            event_filter = await recorded_filter(conn, self._sql, name)
            source = await recorded_source(conn, self._sql, name)
            for r in rs:
                cur = await conn.execute(self._sql.offsets, (name, r.min_slice, r.max_slice))
                latest, earliest, slices_with_rows = await cur.fetchone() or (None, None, 0)
                resume_from = earliest if slices_with_rows == len(r) else None
                cur = await conn.execute(
                    self._sql.head_of(source),
                    {"lo": r.min_slice, "hi": r.max_slice, "et": entity_type},
                )
                head = (await cur.fetchone() or (None,))[0]
                paused = await range_is_paused(conn, self._sql, name, r)
                backlog = await read_backlog(
                    conn, self._sql, name, entity_type, r, event_filter=event_filter,
                    source=source,
                )  # fmt: skip
                out.append(RangeStatus(r, latest, head, paused, resume_from, backlog))
        return out

    @translate_projection_errors
    async def backlog(self, name: str, entity_type: str, slice_range: SliceRange) -> Backlog:
        """The events of the range the projection has not handled yet: how many, and how
        long the oldest has waited (0 when caught up, however quiet the journal). Only
        the events its filter lets through count (see `event_filter`); for a projection
        over durable state, its entity type's unhandled changes."""
        validate_name(name)
        validate_entity_type(entity_type)
        async with self._journal.pool.connection() as conn:
            event_filter = await recorded_filter(conn, self._sql, name)
            source = await recorded_source(conn, self._sql, name)
            return await read_backlog(
                conn, self._sql, name, entity_type, SliceRange.check(slice_range),
                event_filter=event_filter, source=source,
            )  # fmt: skip

    @translate_projection_errors
    async def event_filter(self, name: str) -> EventFilter | None:
        """The `EventFilter` the projection's running instances recorded when they started
        (None: they run without one). Instances started with different filters (a
        rolling change) leave the one of the last to start; `status` and `backlog` use it."""
        validate_name(name)
        async with self._journal.pool.connection() as conn:
            return await recorded_filter(conn, self._sql, name)

    @translate_projection_errors
    async def wait_for(
        self,
        name: str,
        events: Iterable[EventEnvelope | tuple[str, int]],
        *,
        timeout: float = 10.0,  # noqa: ASYNC109 (the sync twin's signature too)
    ) -> None:
        """Return once projection `name` has handled every one of `events` (read your
        writes: append, `wait_for`, then read the read model).

        `events`: the envelopes `append` returned, or `(persistence_id, seq_nr)`
        pairs. Woken by the notification a running instance (in any process: a
        group, a fleet worker) sends after committing offsets; raises `WaitTimeout`
        after `timeout` seconds, naming what is still pending. An event no longer
        in the journal (deleted by retention or an erasure) counts as handled.
        """
        validate_name(name)
        targets = check_targets(events)
        seconds = check_timeout(timeout)
        if targets:
            await wait_until_handled(self._journal, self.tables, name, targets, seconds)

    @translate_projection_errors
    async def require_known(self, name: str) -> None:
        """`UnknownProjection` unless the projection stored an offset, was paused or
        resumed, dead-lettered an envelope or had a fleet worker."""
        validate_name(name)
        async with self._journal.pool.connection() as conn:
            await self._require_known(conn, name)

    async def _require_known(self, conn: AsyncConnection[Any], name: str) -> None:
        cur = await conn.execute(self._sql.known, {"n": name})
        if not (await cur.fetchone() or (False,))[0]:
            raise UnknownProjection(name)

    @translate_projection_errors
    async def dead_letters(self, name: str) -> list[DeadLetter]:
        """Envelopes the projection skipped, with their errors and replay status."""
        async with self._journal.pool.connection() as conn:
            cur = await conn.execute(self._sql.dead_letters, (validate_name(name),))
            return [dead_letter_of(row) for row in await cur.fetchall()]

    @translate_projection_errors
    async def replay_dead_letters(
        self, name: str, letters: Sequence[tuple[str, int]] | None = None
    ) -> list[tuple[str, int]]:
        """Ask the running instances to hand dead letters to their handler again.

        `letters`: `(persistence_id, seq_nr)` pairs, or None for every letter of the
        projection not replayed yet. The instance that owns a letter's slice (in any
        process: a group, a fleet worker) picks the request up within
        `management_poll_interval`, re-reads the event from the journal and runs the
        handler once — for exactly-once and grouped projections in the transaction
        that marks the letter replayed. A replay that fails keeps the letter parked
        with the new error (`dead_letters` shows it). A projection over durable state
        replays the id's state if it still holds the letter's revision; a letter whose
        id moved on is superseded (marked replayed, no handler call). Spark-run
        projections do not replay: their letters stay pending. Returns the letters
        asked for."""
        validate_name(name)
        wanted = check_letters(letters)
        params = {
            "name": name,
            "all": wanted is None,
            "pids": [p for p, _ in wanted or ()],
            "seqs": [s for _, s in wanted or ()],
        }
        async with self._journal.pool.connection() as conn:
            await self._require_known(conn, name)
            cur = await conn.execute(self._sql.request_replay, params)
            return sorted((str(p), int(s)) for p, s in await cur.fetchall())

"""The async driver of retention and of the projection registry.

What may be deleted is decided in `projections/retention.py` and the
statements are built in `projections/retention_sql.py`; this module reads
the facts and runs the batches: slice by slice, one short transaction per
batch (the registry's shared lock, the projections holding the slice, one
statement that examines a page and deletes), so no lock is held for longer
than a batch and the table is never rewritten. `SyncRetention` is generated
from this module.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from journal.aio.journal import Journal
from journal.errors import InvalidArgument
from journal.slices import SliceRange, slice_ranges, validate_entity_type
from projections.errors import UnknownProjection
from projections.names import validate_name
from projections.offset_sql import Statement
from projections.offset_store import PROGRESS_PID
from projections.retention import (
    Holder,
    ProjectionInfo,
    Registration,
    RetentionPolicy,
    RetentionProgress,
    RetentionReport,
    RetentionSettings,
    SliceOutcome,
    plan_slice,
    summarize,
)
from projections.retention_sql import START, RetentionSql
from projections.settings import ProjectionTableNames
from projections.tables import projection_tables, translate_projection_errors


class Retention:
    """Deletes old events of an entity type, never one a projection has not consumed;
    registers and retires the projections that hold it back."""

    def __init__(
        self,
        journal: Journal,
        settings: RetentionSettings | None = None,
        *,
        tables: ProjectionTableNames | None = None,
    ) -> None:
        """`tables`: the names of the projections' tables, if not the defaults (those of
        the projections' `ProjectionSettings.tables`)."""
        if settings is not None and not isinstance(settings, RetentionSettings):
            raise InvalidArgument(f"settings must be RetentionSettings, got {settings!r}")
        self._journal = journal
        self.settings = settings or RetentionSettings()
        self.tables = projection_tables(journal.tables, tables)
        self._sql = RetentionSql(self.tables)

    @translate_projection_errors
    async def apply(
        self,
        policy: RetentionPolicy,
        *,
        dry_run: bool = False,
        ranges: int = 8,
        progress: Callable[[RetentionProgress], object] | None = None,
    ) -> RetentionReport:
        """Delete what `policy` lets go and every projection holding it has consumed, in
        batches; with `dry_run`, delete nothing and report what would go and what holds
        the rest back. The report sums the slices into `ranges` slice ranges.

        `progress`, if given, is called (a plain call, in both flavours) each time the
        slices of one report range are done, with the counts so far: a long run can
        show how far it has got."""
        if not isinstance(policy, RetentionPolicy):
            raise InvalidArgument(f"policy must be a RetentionPolicy, got {policy!r}")
        if progress is not None and not callable(progress):
            raise InvalidArgument(f"progress must be a callable, got {progress!r}")
        report_ranges = slice_ranges(ranges)
        infos = await self.projections()
        holding = [
            i.name
            for i in infos
            if i.registration is Registration.IMPLICIT and i.holds(policy.entity_type)
        ]
        others = [
            i.name
            for i in infos
            if i.registration is Registration.IMPLICIT and not i.holds(policy.entity_type)
        ]
        async with self._journal.pool.connection() as conn:
            # One time rule for the whole run: "older than keep" as of its start.
            now = (await self._one(conn, self._sql.now))[0]
            # Only the slices with an event the time rule lets go (one index probe each).
            statement = self._sql.candidate_slices(policy, now)
            cur = await conn.execute(statement.query, statement.params)
            candidates = [s for (s,) in await cur.fetchall()]
        outcomes = []
        events = held = 0
        for done, slice_ in enumerate(candidates, 1):
            outcome = await self._slice(slice_, policy, now, holding, others, dry_run)
            outcomes.append(outcome)
            events, held = events + outcome.events, held + outcome.held
            if progress is not None:
                finished = next(r for r in report_ranges if slice_ in r)
                if done == len(candidates) or candidates[done] not in finished:
                    progress(
                        RetentionProgress(finished, done, len(candidates), events, held, dry_run)
                    )
        retired = [i.name for i in infos if i.registration is Registration.RETIRED]
        removed = await self._retired_offsets(retired, dry_run) if retired else 0
        return RetentionReport(policy, dry_run, summarize(outcomes, report_ranges), removed)

    async def _slice(
        self,
        slice_: int,
        policy: RetentionPolicy,
        now: datetime,
        implicit: list[str],
        others: list[str],
        dry_run: bool,
    ) -> SliceOutcome:
        """Batches over one slice until a page comes back short."""
        batch_size = self.settings.batch_size
        after: tuple[Any, int, str] = START
        events = held = 0
        while True:
            async with self._journal.pool.connection() as conn, conn.transaction():
                if dry_run:
                    await conn.execute("SET TRANSACTION READ ONLY")
                await self._one(conn, self._sql.lock(exclusive=False))
                statement = self._sql.holders_of(slice_, policy.entity_type, implicit, others)
                cur = await conn.execute(statement.query, statement.params)
                holders = [Holder(*row) for row in await cur.fetchall()]
                plan = plan_slice(policy, slice_, now, holders, self.settings.time_window)
                examined = 0
                if dry_run or not plan.blocked:
                    examined, gone, kept, *last = await self._one(
                        conn, self._sql.batch(plan, policy, after, batch_size, dry_run=dry_run)
                    )
                    events += gone
                    held += kept
                if examined < batch_size:
                    if not dry_run and plan.binding is not None:
                        # No batch looked past the projections' bound: count what waits
                        # there (up to a batch) so the report says what holds it back.
                        statement = self._sql.held_beyond(plan, policy, batch_size)
                        held += int((await self._one(conn, statement))[0])
                    return SliceOutcome(slice_, events, held, plan.binding, plan.blocked)
            after = (last[0], last[1], last[2])

    async def _retired_offsets(self, names: list[str], dry_run: bool) -> int:
        """The offset rows of retired projections: deleted in batches (or counted)."""
        params = {"names": names, "batch": self.settings.batch_size}
        if dry_run:
            async with self._journal.pool.connection() as conn:
                return int((await self._one(conn, Statement(self._sql.count_offsets, params)))[0])
        removed = 0
        while True:
            async with self._journal.pool.connection() as conn:
                cur = await conn.execute(self._sql.delete_offsets, params)
                removed += cur.rowcount
            if cur.rowcount < self.settings.batch_size:
                return removed

    @translate_projection_errors
    async def projections(self) -> list[ProjectionInfo]:
        """Every projection retention knows of (with offsets or in the registry): how it
        is registered, its entity type and slices, its earliest offset, whether paused."""
        async with self._journal.pool.connection() as conn:
            cur = await conn.execute(self._sql.projections, {"progress_pid": PROGRESS_PID})
            rows = await cur.fetchall()
        out = []
        for name, retired, et, lo, hi, fleet_et, seen, slices, min_offset, paused in rows:
            if retired is None:
                registration, slice_range = Registration.IMPLICIT, None
            elif retired:
                registration, slice_range = Registration.RETIRED, None
            else:
                registration, slice_range = Registration.EXPLICIT, SliceRange(lo, hi)
            out.append(
                ProjectionInfo(
                    name=name,
                    registration=registration,
                    entity_type=et if registration is Registration.EXPLICIT else fleet_et,
                    seen_entity_types=tuple(sorted(seen)),
                    slice_range=slice_range,
                    slices_with_offsets=int(slices),
                    min_offset=min_offset,
                    paused=bool(paused),
                )
            )
        return out

    @translate_projection_errors
    async def register(
        self, name: str, entity_type: str, slice_range: SliceRange = SliceRange.FULL
    ) -> None:
        """Register a projection explicitly (again, if it was retired): from now on it
        holds back every event of `entity_type` in `slice_range` it has not consumed —
        all of them in slices where it has no offset yet. Register a new projection
        before it starts if it must see events older than the retention policy."""
        validate_name(name)
        validate_entity_type(entity_type)
        r = SliceRange.check(slice_range)
        async with self._journal.pool.connection() as conn, conn.transaction():
            # Waits for the batches in flight; every later batch sees the registration.
            await self._one(conn, self._sql.lock(exclusive=True))
            await conn.execute(self._sql.register, (name, entity_type, r.min_slice, r.max_slice))

    @translate_projection_errors
    async def retire(self, name: str) -> None:
        """Retire a projection: it stops holding retention at once, and the next
        `apply` deletes its offset rows (`register` brings it back before that; after,
        it starts again from what the journal still holds). `UnknownProjection` for a
        name retention does not know."""
        validate_name(name)
        async with self._journal.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(self._sql.known, {"n": name})
            if not (await cur.fetchone() or (False,))[0]:
                raise UnknownProjection(name)
            await conn.execute(self._sql.retire, (name,))

    @staticmethod
    async def _one(conn: AsyncConnection[Any], statement: Statement) -> Any:
        cur = await conn.execute(statement.query, statement.params)
        row = await cur.fetchone()
        assert row is not None
        return row

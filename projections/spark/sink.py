"""The exactly-once projection sink: one Spark partition of a micro-batch, one transaction.

Runs on executors, synchronously. It drives the same `ProjectionCore` as the
in-process runners (validation against the offset store, gap fills, grouped
commits), over the same offset rows built by the same `OffsetSql`, so a
projection can move between Spark and the in-process or fleet runners and each
resumes exactly where the other stopped.

Per partition and micro-batch: load the partition's offset rows, offer every
envelope in (pid, seq_nr) order, hand the accepted ones to the user's
`handler(conn, envelopes)` in groups of `group_after_envelopes`, store their
offset rows and the progress markers — all in one transaction, fenced by the
partition's lease. A replayed batch (a task retried, a query restarted from
its checkpoint) finds its events in the offset store and applies nothing
twice; rows that became visible only at the replay are new and applied.

A rebuild runs the same sink with a transaction per Arrow batch (its target
is a staging copy, swapped in atomically at the end), with `search_path`
pointing at the staging schema. A projection over the durable state
(`project_changes`) runs it over the source's state rows, with the core
validating revisions as the in-process runners' `*_changes` projections do.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import Connection, sql
from pyspark.sql.datasource import WriterCommitMessage

from journal.filter import EventFilter
from journal.query.source import EVENTS, STATE_CHANGES
from journal.serialization import SerializerRegistry
from journal.settings import JournalSettings
from journal.slices import SliceRange
from journal.sync.pool import open_connection
from journal.tables import Tables
from projections.core import Action, Commit, Handle, Mode, ProjectionCore, SaveOffsets, wanted
from projections.errors import ProjectionError
from projections.fencing import Fence, offset_error
from projections.recovery import check_decoded
from projections.settings import ProjectionSettings
from projections.spark.arrow import changes, envelopes
from projections.sync.core_io import CoreReads, drive
from projections.sync.offset_dao import OffsetDao
from projections.tables import ProjectionTables

if TYPE_CHECKING:
    from projections.sync.runner import SyncGroupedChangeHandler, SyncGroupedHandler

_log = logging.getLogger("slicejournal.projections.spark")


def _default_registry() -> SerializerRegistry:
    return SerializerRegistry()


@attrs.frozen
class PartitionApplier:
    """What every executor needs to apply its partitions; pickled into the Spark job.

    `offset_name` is the projection name the offset rows are stored under (a
    rebuild stores under a staging name); `fences` holds one lease per
    partition range; `search_path` (a rebuild's staging schema) is put in
    front of the session's for the handler; `event_filter` is the projection's
    (the source reads the events it leaves out as keys, `filteredEnvelopes`): their
    offsets are stored, the handler never sees them, gap fills apply it too;
    `changes`: the partitions hold durable state rows (`read=durableState`), handed
    to the handler as `DurableStateChange`s (a flag, not the `RowSource`: the sources
    are compared by identity, which pickling to the executors would not keep).
    """

    dsn: str
    settings: JournalSettings
    offset_name: str
    entity_type: str
    ranges: tuple[SliceRange, ...]
    handler: SyncGroupedHandler | SyncGroupedChangeHandler
    projection_settings: ProjectionSettings
    fences: tuple[Fence, ...] = ()
    registry: Callable[[], SerializerRegistry] = _default_registry
    search_path: str | None = None
    transaction_per_batch: bool = False
    event_filter: EventFilter | None = None
    changes: bool = False

    def range_of(self, batch: pa.RecordBatch) -> SliceRange:
        """The partition range every row of `batch` belongs to (one Spark partition is one
        source partition; anything else means the plan was reshuffled, which we refuse)."""
        slices = batch.column("slice")
        lo, hi = pc.min(slices).as_py(), pc.max(slices).as_py()
        for r in self.ranges:
            if lo in r and hi in r:
                return r
        raise ProjectionError(
            f"projection {self.offset_name}: a Spark partition holds slices {lo}..{hi}, which "
            "span several source partitions; apply the sink to the source's partitions as read"
        )

    def apply(self, batches: Iterable[pa.RecordBatch]) -> PartitionReport:
        """Apply one Spark partition (its rows as Arrow batches) on this executor."""
        it = (b for b in batches if b.num_rows)
        first = next(it, None)
        if first is None:
            return PartitionReport("", 0, 0, 0)
        r = self.range_of(first)
        fence = next((f for f in self.fences if f.slice_range == r), None)
        run = _PartitionRun(self, r, fence)
        with open_connection(self.dsn, self.settings) as conn:
            run.start(conn)
            if self.transaction_per_batch:
                run.apply(conn, [first])
                for batch in it:
                    run.apply(conn, [batch])
            else:
                run.apply(conn, [first, *it])
        stats = run.core.stats
        return PartitionReport(str(r), stats.accepted, stats.duplicates, stats.gaps_filled)


@dataclasses.dataclass
class PartitionReport(WriterCommitMessage):
    """What one partition did, sent back to the driver's `commit`."""

    slice_range: str
    accepted: int
    duplicates: int
    gaps_filled: int


class _PartitionRun:
    """The sync driver of one partition's `ProjectionCore`."""

    def __init__(self, applier: PartitionApplier, r: SliceRange, fence: Fence | None) -> None:
        self.applier = applier
        self.range = r
        self.key = r.key
        self.fence = fence
        self.tables = ProjectionTables(Tables(applier.settings), applier.projection_settings.tables)
        self.registry = applier.registry()
        self.dao = OffsetDao(self.tables, applier.offset_name)
        self.where = f"{applier.offset_name} {self.key} (spark)"
        self.source = STATE_CHANGES if applier.changes else EVENTS
        self.decode = changes if applier.changes else envelopes
        self.core = ProjectionCore(
            Mode.GROUPED,
            applier.projection_settings,
            r,
            where=self.where,
            log=_log,
            fields={"projection": applier.offset_name, "range": self.key, "runner": "spark"},
            source=self.source,
        )

    def start(self, conn: Connection[Any]) -> None:
        self.core.start(self.dao.load(conn, self.range))
        # The core's reads run on this partition's connection, inside its transaction.
        self.reads = CoreReads(
            self.tables.journal_tables, self.registry, conn=conn, offsets=self.dao.sql,
            event_filter=self.applier.event_filter, source=self.source,
        )  # fmt: skip

    def apply(self, conn: Connection[Any], batches: list[pa.RecordBatch]) -> None:
        """Everything of `batches` in one transaction: handler writes, offset rows, markers."""
        for batch in batches:
            if self.applier.range_of(batch) != self.range:
                raise ProjectionError(f"projection {self.where}: rows of another partition")
        envs = sorted(
            (e for b in batches for e in self.decode(b, self.registry)),
            key=lambda e: (e.persistence_id, e.seq_nr),
        )
        newest: datetime | None = max((e.db_timestamp for e in envs), default=None)
        try:
            with conn.transaction():
                if self.fence is not None:
                    conn.execute(*self.fence.idle_limit())
                if self.applier.search_path is not None:
                    conn.execute(
                        sql.SQL("SELECT set_config('search_path', {} || ', ' || "
                                "current_setting('search_path'), true)").format(
                            sql.Literal(sql.Identifier(self.applier.search_path).as_string(conn))
                        )
                    )  # fmt: skip
                for env in envs:
                    self._drive(conn, self.core.offer(env, time.monotonic()))
                if self.core.held:  # a predecessor may have come later in the batch
                    self._drive(conn, self.core.retry(time.monotonic()))
                self._drive(conn, self.core.flush(time.monotonic()))
                if self.core.held:
                    # No backtracking here: the stream would move past it. Fail loudly
                    # (Spark retries the task) rather than apply it out of order or lose it.
                    first = self.core.held[0]
                    raise ProjectionError(
                        f"projection {self.where}: {first.persistence_id!r} seq_nr "
                        f"{first.seq_nr} follows events that are neither visible nor deleted"
                    )
                if newest is not None:
                    # Every row of the range below `newest` that was visible to this
                    # batch's read has been handled: the core writes progress markers
                    # for the slices that lag.
                    self._drive(conn, self.core.progress(newest, time.monotonic()))
        except Exception as error:
            self.core.failed()
            failure = offset_error(error, self.tables, self.where)
            if failure is not None:
                raise failure from error
            raise

    def _drive(self, conn: Connection[Any], action: Action | None) -> None:
        """The runners' own loop (`drive`), writing on this partition's transaction."""

        def commit(action: Commit) -> bool:
            if action.envelopes:
                check_decoded(action.envelopes)  # Spark has no skip: the task fails loudly
                handed = wanted(action.envelopes)
                if handed:  # a filtered-out event: its offset only
                    # `changes` decides both what was decoded and the handler's type.
                    self.applier.handler(conn, handed)  # type: ignore[arg-type]
            self.dao.save(conn, self.key, action.records, self.fence)
            return False

        def save(action: SaveOffsets) -> None:
            self.dao.save(conn, self.key, action.records, self.fence)

        drive(self.core, action, self.reads, handle=_no_handle, commit=commit, save=save)


def _no_handle(action: Handle) -> bool:
    """A grouped core never asks to handle one envelope alone."""
    raise ProjectionError(f"unexpected {action!r}")

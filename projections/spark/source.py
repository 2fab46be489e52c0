"""The journal as a PySpark data source: `spark.read` / `spark.readStream.format("slicejournal")`.

Thin drivers only: options are parsed by `options.py`, stream offsets decided
by `offsets.py`, statements built by `sql.py`, rows converted by `arrow.py`.
Spark builds readers on the driver and again on executors (different
instances), so everything a partition's `read()` needs travels inside its
`InputPartition` (a `ReadPlan`) and connections are opened in `read()`, which
streams the partition into Arrow through `arrow_read.py`.

Partitions are contiguous sub-ranges of the slice range: a persistence id lies
in exactly one, and its events arrive in seq_nr order within it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import attrs
import pyarrow as pa
from psycopg import Connection
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from journal.connection import schema_errors
from journal.model import EPOCH
from journal.query import sql as journal_sql
from journal.query.horizon import READER_APPLICATION, Horizon, horizon_from_row
from journal.slices import SliceRange
from journal.sync.pool import open_connection
from journal.tables import Tables
from projections.spark import sql as q
from projections.spark.arrow import SCHEMA_DDL, SNAPSHOTS_SCHEMA_DDL, STATE_SCHEMA_DDL
from projections.spark.arrow_read import read_plan
from projections.spark.offsets import (
    ONE_MICROSECOND,
    StreamOffset,
    batch_bound,
    batch_start,
    end_timestamp,
    initial_offset,
    is_empty,
    is_exact,
    next_offset,
)
from projections.spark.options import (
    DURABLE_STATE,
    SourceOptionError,
    SourceOptions,
    parse_options,
)
from projections.spark.sql import ReadPlan

SHORT_NAME = "slicejournal"


class SlicePartition(InputPartition):
    """One Spark partition: its `ReadPlan` is the whole of what `read()` needs."""

    def __init__(self, plan: ReadPlan) -> None:
        super().__init__(plan)
        self.plan = plan


class PlanningConnection:
    """The driver's connection for planning stream batches: opened on first use, kept
    between triggers, reopened after it fails (the failure still fails that trigger,
    and Spark retries it). Never pickled: executors get `ReadPlan`s, not this."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._tables = Tables(options.settings)
        self._conn: Connection[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_options": self._options, "_tables": self._tables, "_conn": None}

    def one(self, statement: Any, params: Any) -> tuple[Any, ...]:
        """The single row of `statement` (an aggregate, so there is always one)."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = open_connection(
                    self._options.dsn, self._options.settings, application_name=READER_APPLICATION
                )
            with schema_errors(self._tables):
                row = self._conn.execute(statement, params).fetchone()
        except BaseException:
            self.close()
            raise
        assert row is not None
        return tuple(row)

    def reading(self) -> Horizon:
        """A reading of the open transactions that may write to the table the stream
        reads (the journal, or the durable state store's)."""
        settings = self._options.settings
        table = settings.durable_state_table if self._options.read == DURABLE_STATE else None
        statement = journal_sql.horizon(self._tables, READER_APPLICATION, table)
        return horizon_from_row(self.one(*statement))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


# -- batch ---------------------------------------------------------------------------------------


@attrs.frozen
class Narrowing:
    """What pushed filters add to the options: a smaller range, tighter times, given ids,
    given serializer manifests (None: any)."""

    slice_range: SliceRange
    from_timestamp: datetime | None
    to_timestamp: datetime | None
    persistence_ids: tuple[str, ...] = ()
    empty: bool = False
    manifests: tuple[str, ...] | None = None


def narrow(options: SourceOptions, filters: Sequence[Filter]) -> tuple[Narrowing, list[Filter]]:
    """Apply the filters this source can evaluate; return the rest for Spark to evaluate.

    Timestamp comparisons are kept by Spark as well (it re-checks them cheaply):
    `>` / `<` are applied here as inclusive bounds, which only ever admit more.
    `ser_manifest` equality (`=`, `IN`) is evaluated on the stored manifest, except with
    `filteredEnvelopes` (keys read as `slicejournal.filtered`): Spark evaluates it then.
    """
    lo, hi = options.slice_range.min_slice, options.slice_range.max_slice
    from_ts, to_ts = options.from_timestamp, options.to_timestamp
    pids: set[str] | None = None
    manifests: set[str] | None = None
    empty = False
    rest: list[Filter] = []
    for f in filters:
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        column = attribute[0] if len(attribute) == 1 else None
        value = getattr(f, "value", None)
        if column == "slice" and isinstance(value, int) and not isinstance(value, bool):
            if isinstance(f, EqualTo):
                lo, hi = max(lo, value), min(hi, value)
            elif isinstance(f, GreaterThan | GreaterThanOrEqual):
                lo = max(lo, value + (1 if isinstance(f, GreaterThan) else 0))
            elif isinstance(f, LessThan | LessThanOrEqual):
                hi = min(hi, value - (1 if isinstance(f, LessThan) else 0))
            else:
                rest.append(f)
        elif column == "db_timestamp" and isinstance(value, datetime) and value.tzinfo:
            if isinstance(f, GreaterThan | GreaterThanOrEqual):
                from_ts = value if from_ts is None else max(from_ts, value)
            elif isinstance(f, LessThan | LessThanOrEqual):
                to_ts = value if to_ts is None else min(to_ts, value)
            rest.append(f)
        elif column == "entity_type" and isinstance(f, EqualTo):
            empty |= value != options.entity_type
        elif column == "persistence_id" and isinstance(f, EqualTo | In):
            values = [value] if isinstance(f, EqualTo) else list(f.value)
            given = {p for p in values if isinstance(p, str)}
            if len(given) != len(set(values)):
                rest.append(f)
                continue
            pids = given if pids is None else pids & given
        elif (
            column == "ser_manifest"
            and isinstance(f, EqualTo | In)
            and not options.filtered_envelopes
        ):
            values = [value] if isinstance(f, EqualTo) else list(f.value)
            named = {m for m in values if isinstance(m, str)}
            if len(named) != len(set(values)):
                rest.append(f)
                continue
            manifests = named if manifests is None else manifests & named
        else:
            rest.append(f)
    empty |= lo > hi or pids == set() or manifests == set()
    if from_ts is not None and to_ts is not None and from_ts > to_ts:
        empty = True
    r = options.slice_range if empty else SliceRange(lo, hi)
    chosen = None if manifests is None else tuple(sorted(manifests))
    narrowed = Narrowing(r, from_ts, to_ts, tuple(sorted(pids or ())), empty, chosen)
    return narrowed, rest


class BatchReader(DataSourceReader):
    """`spark.read.format("slicejournal")`: one partition per slice sub-range."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.narrowing = Narrowing(
            options.slice_range, options.from_timestamp, options.to_timestamp
        )

    def partitions(self) -> Sequence[InputPartition]:
        n = self.narrowing
        options = attrs.evolve(self.options, slice_range=n.slice_range)
        return [
            SlicePartition(
                ReadPlan(
                    options,
                    r,
                    n.from_timestamp,
                    to_inclusive=n.to_timestamp,
                    persistence_ids=n.persistence_ids,
                    empty=n.empty,
                    manifests=n.manifests,
                )
            )
            for r in options.partition_ranges()
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition)
        return read_plan(partition.plan)


class FilteringBatchReader(BatchReader):
    """A `BatchReader` that evaluates pushed filters in PostgreSQL (registered only when
    the session enables `spark.sql.python.filterPushdown.enabled`: Spark refuses a
    reader with `pushFilters` otherwise)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.narrowing, rest = narrow(self.options, filters)
        return iter(rest)


# -- streaming ---------------------------------------------------------------------------------


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("slicejournal")`: micro-batches between `StreamOffset`s.

    With `read=durableState` a batch holds the ids whose state changed in it, one row
    each at the revision the read found (`project_changes`), under the same offsets
    and horizon as events, read over the durable state's table.

    Lives on the driver for the whole query (Spark keeps one Python process for
    it), so it keeps one planning connection open between triggers instead of
    connecting for every offset.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        to = options.to_timestamp
        self._target: datetime | None = None if to is None else to + ONE_MICROSECOND
        self._planner = PlanningConnection(options)

    def initialOffset(self) -> dict[str, Any]:
        return initial_offset(self.options).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_events_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        # "Everything available now": up to the horizon as it stands, waiting for every
        # transaction the live query would wait for.
        origin = StreamOffset(EPOCH)
        bound = batch_bound(origin, self._planner.reading(), self.options)
        newest, _ = self._planner.one(*q.stream_bounds(self.options, EPOCH, bound, None))
        target = EPOCH if newest is None else newest + ONE_MICROSECOND
        self._target = target if self._target is None else min(self._target, target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = StreamOffset.from_json(start)
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        # The reading comes first: every row below its bound has committed by now.
        reading = self._planner.reading()
        bound = batch_bound(begin, reading, self.options)
        newest, nth = self._planner.one(
            *q.stream_bounds(self.options, begin.timestamp, bound, rows)
        )
        end = end_timestamp(begin, newest, nth, self._target)
        windows: dict[str, int] = {}
        # Blind: a change in the window's detector (`sql.window_count`: a row count for
        # events, a revision sum for durable state) means a late write to re-read.
        if not is_exact(reading, self.options):
            windows = {
                "window_at_start": self._window(begin.timestamp),
                "window_at_end": self._window(end),
            }
        return next_offset(begin, reading, end, self.options, **windows).to_json()

    def _window(self, below: datetime) -> int:
        statement = q.window_count(self.options, below, self.options.backtracking_window)
        return int(self._planner.one(*statement)[0])

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        # A function of the two offsets alone: a batch re-planned after a restart reads
        # what it read the first time.
        begin, finish = StreamOffset.from_json(start), StreamOffset.from_json(end)
        if is_empty(begin, finish):
            return []
        from_ts = batch_start(begin, finish)
        return [
            SlicePartition(ReadPlan(self.options, r, from_ts, finish.timestamp))
            for r in self.options.partition_ranges()
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition)
        return read_plan(partition.plan)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the offset store, not the source, keeps a projection's progress

    def stop(self) -> None:
        self._planner.close()


# -- the data source -------------------------------------------------------------------------------


class JournalDataSource(DataSource):
    """The `slicejournal` data source; options are checked when it is created (`load()`)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> str:
        if self.parsed.read == DURABLE_STATE:
            return STATE_SCHEMA_DDL
        return SNAPSHOTS_SCHEMA_DDL if self.parsed.from_snapshots else SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return BatchReader(self.parsed)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if not self.parsed.ordered:
            # A stream's sink applies each id's events in order, and its offsets assume it.
            raise SourceOptionError(
                "slicejournal source: option 'ordered' applies to batch reads only; "
                "a stream's partitions are always in (db_timestamp, seq_nr) order"
            )
        if self.parsed.from_snapshots:
            # A snapshot carries the db_timestamp of the event it was taken at: saved
            # later, it lands behind a stream's offset, where no batch reads again.
            raise SourceOptionError(
                "slicejournal source: option 'fromSnapshots' applies to batch reads only "
                "(spark.read, rebuild(from_snapshots=True)); a stream reads events"
            )
        return StreamReader(self.parsed)


class FilteringJournalDataSource(JournalDataSource):
    """`JournalDataSource` whose batch reader accepts pushed filters."""

    def reader(self, schema: Any) -> DataSourceReader:
        return FilteringBatchReader(self.parsed)

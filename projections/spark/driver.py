"""Run a projection on Spark: `project` (streaming, exactly once), `project_changes`
(the same over the durable state) and `rebuild` (batch).

Both are driver-side orchestration around the pieces that do the work: the
source (`source.py`), the sink (`sink.py`, on executors), the leases
(`leases.py`). The offset store in PostgreSQL is the truth and a Spark
checkpoint only a cache: without a checkpoint, `project` starts where the
offset store says (the earliest of the range's slices' latest rows, minus the
backtracking window, exactly as the in-process runners start), and whatever
runs the projection next — in-process, the fleet, or Spark again — starts from
the offset rows Spark stored.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
from psycopg import Connection, sql
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from journal.connection import schema_errors
from journal.errors import InvalidArgument
from journal.filter import EventFilter, check_filter
from journal.query.source import EVENTS, STATE_CHANGES
from journal.serialization import SerializerRegistry
from journal.settings import JournalSettings
from journal.slices import SliceRange
from journal.sync.pool import open_connection
from journal.tables import Tables
from projections.management import check_timestamp
from projections.management_sql import ManagementSql
from projections.names import check_instance, is_async_handler, validate_name
from projections.offset_store import PROGRESS_PID, PROGRESS_SEQ_NR, OffsetState, Record
from projections.settings import ProjectionSettings, ProjectionTableNames
from projections.spark.checkpoint import query_id
from projections.spark.leases import (
    DEFAULT_LEASE_TTL,
    DEFAULT_LEASE_WAIT,
    SparkLeases,
    spark_owner,
)
from projections.spark.options import (
    DEFAULT_PARTITIONS,
    DURABLE_STATE,
    backtracking_window,
    filter_options,
    parse_options,
)
from projections.spark.session import is_connect_session, is_spark_session, register
from projections.spark.sink import PartitionApplier
from projections.spark.telemetry import SparkQueryTelemetry
from projections.spark.writer import writer_source_for
from projections.sync.offset_dao import OffsetDao, record_filter, record_reads
from projections.sync.runner import SyncGroupedChangeHandler, SyncGroupedHandler
from projections.tables import projection_tables
from projections.telemetry import NO_TELEMETRY, Telemetry, telemetry_for_runner

_log = logging.getLogger("slicejournal.projections.spark")

# The handler sees groups of this many envelopes (all of a partition's micro-batch
# still commit in one transaction).
SPARK_GROUP = 1000
_TRIGGERS = ("processingTime", "once", "availableNow")
_STAGING_COMMENT = "slicejournal rebuild staging for projection "


def _check_common(
    name: object,
    entity_type: object,
    slice_range: object,
    handler: object,
    num_partitions: object,
    spark: object,
) -> None:
    check_instance(name, entity_type, slice_range, handler)
    if is_async_handler(handler):
        # The sink calls it on executors without an event loop: it would never run, and
        # the offsets of what it never applied would be stored.
        raise InvalidArgument(
            "the handler is an async function, but Spark calls it synchronously on the "
            "executors (with a sync psycopg connection): make it a plain `def`"
        )
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise InvalidArgument(f"num_partitions must be an int, got {num_partitions!r}")
    if num_partitions < 1:
        raise InvalidArgument(f"num_partitions must be >= 1, got {num_partitions}")
    if not is_spark_session(spark):
        kind = f"{type(spark).__module__}.{type(spark).__qualname__}"
        raise InvalidArgument(f"spark must be a SparkSession (classic or Connect), got {kind}")


def _source_options(
    dsn: str,
    settings: JournalSettings,
    entity_type: str,
    slice_range: SliceRange,
    num_partitions: int,
    event_filter: EventFilter | None = None,
    **extra: object,
) -> dict[str, str]:
    options = {
        "dsn": dsn,
        "schema": settings.schema,
        "journalTable": settings.journal_table,
        "snapshotTable": settings.snapshot_table,
        "durableStateTable": settings.durable_state_table,
        "entityType": entity_type,
        "minSlice": str(slice_range.min_slice),
        "maxSlice": str(slice_range.max_slice),
        "numPartitions": str(num_partitions),
        # The stream re-reads what the in-process runners would backtrack over.
        "behindCurrentTime": str(settings.query.behind_current_time.total_seconds()),
        "backtrackingWindow": str(backtracking_window(settings).total_seconds()),
    }
    options |= {k: str(v) for k, v in extra.items() if v is not None}
    if event_filter is not None:
        # Filtered-out rows come as keys: the sink stores their offsets, no gap is seen.
        options |= filter_options(event_filter) | {"filteredEnvelopes": "true"}
    parse_options(options)  # a bad value fails here, before any lease is taken
    return options


def _applier(
    dsn: str,
    settings: JournalSettings,
    offset_name: str,
    entity_type: str,
    ranges: Sequence[SliceRange],
    handler: SyncGroupedHandler | SyncGroupedChangeHandler,
    projection_settings: ProjectionSettings | None,
    serializers: Callable[[], SerializerRegistry] | None,
    **extra: Any,
) -> PartitionApplier:
    return PartitionApplier(
        dsn=dsn,
        settings=settings,
        offset_name=offset_name,
        entity_type=entity_type,
        ranges=tuple(ranges),
        handler=handler,
        projection_settings=projection_settings
        or ProjectionSettings(group_after_envelopes=SPARK_GROUP),
        registry=serializers or SerializerRegistry,
        **extra,
    )


def _writer_format(spark: SparkSession, applier: PartitionApplier) -> str:
    """Register the writer source of `applier` with the session; its format name."""
    # Spark resolves Python data sources through the JVM thread's active session,
    # which a thread other than the one that built the session does not have. (A
    # Spark Connect session has no JVM here: its server resolves them per session.)
    if not is_connect_session(spark):
        jvm: Any = spark._jvm
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    source = writer_source_for(applier)
    spark.dataSource.register(source)
    return source.short_name


def store_start(
    dsn: str,
    settings: JournalSettings,
    name: str,
    slice_range: SliceRange,
    *,
    tables: ProjectionTableNames | None = None,
    time_window: timedelta | None = None,
) -> datetime | None:
    """Where the offset store says a run over `slice_range` resumes (None: the start).
    `tables`: the names of the projections' tables, if not the defaults; `time_window`:
    the projection's (`ProjectionSettings.time_window`, which is the default)."""
    t = projection_tables(Tables(settings), tables)
    dao = OffsetDao(t, name)
    with open_connection(dsn, settings) as conn, schema_errors(t):
        records = dao.load(conn, slice_range)
    window = ProjectionSettings().time_window if time_window is None else time_window
    offset = OffsetState(window, records).start_offset(slice_range)
    return None if offset is None else offset.timestamp


def project(
    spark: SparkSession,
    *,
    dsn: str,
    name: str,
    entity_type: str,
    handler: SyncGroupedHandler,
    checkpoint_location: str,
    trigger: Mapping[str, Any] | None = None,
    settings: JournalSettings | None = None,
    projection_settings: ProjectionSettings | None = None,
    slice_range: SliceRange = SliceRange.FULL,
    num_partitions: int = DEFAULT_PARTITIONS,
    max_events_per_trigger: int | None = None,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    lease_wait: timedelta = DEFAULT_LEASE_WAIT,
    serializers: Callable[[], SerializerRegistry] | None = None,
    query_name: str | None = None,
    telemetry: Telemetry | None = None,
    filter: EventFilter | None = None,
) -> StreamingQuery:
    """Run projection `name` on Spark, exactly once, and return the running `StreamingQuery`.

    `handler(conn, envelopes)` is called on executors with a sync psycopg
    connection and a list of accepted envelopes in (pid, seq_nr) order — the
    grouped handler's contract; its writes, the offset rows and the lease check
    commit in one transaction per partition and micro-batch. `trigger` takes
    the keyword of `DataStreamWriter.trigger` (default `{"processingTime":
    "1 second"}`; `{"availableNow": True}` for a backfill that stops).
    `serializers` is a zero-argument factory of the `SerializerRegistry` that
    decodes typed events (it runs on every executor). `projection_settings`:
    the offset store's rules, and in `.tables` the names of the projections'
    tables (offsets, leases, ...), as for in-process runners.

    `telemetry` (default: the process's, `use_telemetry`) receives each
    micro-batch and, if it samples them, each partition range's backlog, from
    the driver (runner "spark"; see `projections/spark/telemetry.py`).

    `filter`: an `EventFilter`, as for in-process projections: PostgreSQL
    evaluates it in the partition reads, the events it leaves out reach the
    sink as keys only, whose offsets are stored without calling the handler
    (gap fills apply it too). It is recorded for `status` and the backlog.

    Raises `ProjectionBusy` if fleet workers (or another Spark job) still hold
    slices of the range after `lease_wait`; the leases are released when the
    query ends.
    """
    return _project(
        spark, dsn=dsn, name=name, entity_type=entity_type, handler=handler,
        checkpoint_location=checkpoint_location, trigger=trigger, settings=settings,
        projection_settings=projection_settings, slice_range=slice_range,
        num_partitions=num_partitions, max_events_per_trigger=max_events_per_trigger,
        lease_ttl=lease_ttl, lease_wait=lease_wait, serializers=serializers,
        query_name=query_name, telemetry=telemetry, filter=filter, changes=False,
    )  # fmt: skip


def project_changes(
    spark: SparkSession,
    *,
    dsn: str,
    name: str,
    entity_type: str,
    handler: SyncGroupedChangeHandler,
    checkpoint_location: str,
    trigger: Mapping[str, Any] | None = None,
    settings: JournalSettings | None = None,
    projection_settings: ProjectionSettings | None = None,
    slice_range: SliceRange = SliceRange.FULL,
    num_partitions: int = DEFAULT_PARTITIONS,
    max_events_per_trigger: int | None = None,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    lease_wait: timedelta = DEFAULT_LEASE_WAIT,
    serializers: Callable[[], SerializerRegistry] | None = None,
    query_name: str | None = None,
    telemetry: Telemetry | None = None,
) -> StreamingQuery:
    """Run projection `name` over the durable state on Spark, exactly once: the
    counterpart of `Projection.grouped_changes`, as `project` is of `Projection.grouped`.

    `handler(conn, changes)` gets the `DurableStateChange`s of a partition and
    micro-batch, in persistence-id order, in the transaction that stores their offsets
    (fenced by the partition's lease). Each change is the latest revision of an id the
    stream read (`DurableStateStore.changes_by_slices`'s rule): a revision at or
    below the one handled is a duplicate and dropped, a higher one is applied, gaps are
    normal; a deletion comes with `deleted=True`. The stream's batches follow the
    durable state's visibility horizon, so an upsert is never missed however long
    its transaction. Every other argument as for `project` (no `filter`: it selects
    events); the offsets are those of the in-process `*_changes` projections, so
    the projection can move between them and Spark.
    """
    return _project(
        spark, dsn=dsn, name=name, entity_type=entity_type, handler=handler,
        checkpoint_location=checkpoint_location, trigger=trigger, settings=settings,
        projection_settings=projection_settings, slice_range=slice_range,
        num_partitions=num_partitions, max_events_per_trigger=max_events_per_trigger,
        lease_ttl=lease_ttl, lease_wait=lease_wait, serializers=serializers,
        query_name=query_name, telemetry=telemetry, filter=None, changes=True,
    )  # fmt: skip


def _project(
    spark: SparkSession,
    *,
    dsn: str,
    name: str,
    entity_type: str,
    handler: SyncGroupedHandler | SyncGroupedChangeHandler,
    checkpoint_location: str,
    trigger: Mapping[str, Any] | None = None,
    settings: JournalSettings | None = None,
    projection_settings: ProjectionSettings | None = None,
    slice_range: SliceRange = SliceRange.FULL,
    num_partitions: int = DEFAULT_PARTITIONS,
    max_events_per_trigger: int | None = None,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    lease_wait: timedelta = DEFAULT_LEASE_WAIT,
    serializers: Callable[[], SerializerRegistry] | None = None,
    query_name: str | None = None,
    telemetry: Telemetry | None = None,
    filter: EventFilter | None,
    changes: bool,
) -> StreamingQuery:
    """`project` (`changes` false) or `project_changes`."""
    _check_common(name, entity_type, slice_range, handler, num_partitions, spark)
    event_filter = check_filter(filter)
    source = STATE_CHANGES if changes else EVENTS
    trigger = _check_trigger(trigger)
    if not isinstance(checkpoint_location, str) or not checkpoint_location:
        raise InvalidArgument("checkpoint_location must be a non-empty path")
    settings = settings or JournalSettings()
    ranges = slice_range.split(num_partitions)
    applier = _applier(
        dsn, settings, name, entity_type, ranges, handler, projection_settings, serializers,
        event_filter=event_filter, changes=changes,
    )  # fmt: skip
    chosen = applier.projection_settings
    names = chosen.tables
    start = store_start(
        dsn, settings, name, slice_range, tables=names, time_window=chosen.time_window
    )
    options = _source_options(
        dsn, settings, entity_type, slice_range, num_partitions, event_filter,
        maxEventsPerTrigger=max_events_per_trigger,
        startingTimestamp=None if start is None else start.isoformat(),
        read=DURABLE_STATE if changes else None,
    )  # fmt: skip
    register(spark)
    # A Connect session's checkpoints live on its server: the id is known only after start.
    known_id = None if is_connect_session(spark) else query_id(checkpoint_location)
    owner = spark_owner(query_id=known_id)
    leases = SparkLeases(
        dsn, settings, name, ranges, owner=owner, ttl=lease_ttl, entity_type=entity_type,
        tables=names,
    )  # fmt: skip
    applier = attrs.evolve(applier, fences=leases.acquire(lease_wait))

    try:
        with open_connection(dsn, settings) as conn, schema_errors(leases.tables):
            record_filter(conn, ManagementSql(leases.tables), name, event_filter)
            record_reads(conn, ManagementSql(leases.tables), name, source)
        stream = spark.readStream.format("slicejournal").options(**options).load()
        writer = (
            stream.writeStream.format(_writer_format(spark, applier))
            .option("checkpointLocation", checkpoint_location)
            .trigger(**trigger)
        )
        if query_name is not None:
            writer = writer.queryName(query_name)
        query = writer.start()
    except BaseException:
        leases.release()
        raise
    leases.keep_alive(lambda: query.isActive, query.stop)
    with contextlib.suppress(Exception):  # only what `status` shows; the query runs anyway
        leases.report_running()
    if str(query.id) != known_id:
        _log.info("spark owner %s runs projection %s as query %s", owner, name, query.id)
    tel = telemetry_for_runner(telemetry)
    if tel is not NO_TELEMETRY:
        SparkQueryTelemetry(
            tel, dsn=dsn, settings=settings, name=name, entity_type=entity_type,
            slice_range=slice_range, ranges=tuple(ranges),
            backlog_interval=chosen.backlog_sample_interval.total_seconds(),
            holder=owner, epochs=tuple(f.epoch for f in applier.fences), released=leases.join,
            tables=names, event_filter=event_filter, source=source,
        ).watch(query)  # fmt: skip
    _log.info("projection %s runs on spark from %s", name, start or "the start")
    return query


def _check_trigger(trigger: Mapping[str, Any] | None) -> dict[str, Any]:
    if trigger is None:
        return {"processingTime": "1 second"}
    if (
        not isinstance(trigger, Mapping)
        or len(trigger) != 1
        or next(iter(trigger)) not in _TRIGGERS
    ):
        raise InvalidArgument(
            f"trigger must be one of {{'processingTime': '5 seconds'}}, {{'once': True}}, "
            f"{{'availableNow': True}}; got {trigger!r}"
        )
    return dict(trigger)


# -- rebuild -------------------------------------------------------------------------------------


@attrs.frozen
class RebuildResult:
    """What a rebuild did: events applied, up to which timestamp, into which read models."""

    events: int
    up_to: datetime
    read_models: tuple[str, ...]

    @property
    def tables(self) -> tuple[str, ...]:
        """Deprecated (until 0.4.0): `read_models`."""
        warnings.warn(
            "RebuildResult.tables is deprecated: use RebuildResult.read_models",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.read_models


def rebuild(
    spark: SparkSession,
    *,
    dsn: str,
    name: str,
    entity_type: str,
    handler: SyncGroupedHandler,
    read_models: Sequence[str] = (),
    up_to: datetime | None = None,
    settings: JournalSettings | None = None,
    projection_settings: ProjectionSettings | None = None,
    slice_range: SliceRange = SliceRange.FULL,
    num_partitions: int = DEFAULT_PARTITIONS,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    lease_wait: timedelta = DEFAULT_LEASE_WAIT,
    serializers: Callable[[], SerializerRegistry] | None = None,
    filter: EventFilter | None = None,
    tables: Sequence[str] | None = None,
    from_snapshots: bool = False,
) -> RebuildResult:
    """Rebuild the `read_models` tables from the journal on Spark, then swap them in
    atomically.

    The handler runs against empty copies of `read_models` in a staging schema
    (put first on its `search_path`: it must name them unqualified), over every
    event up to `up_to` (default: the database time at the start). One
    transaction then replaces the rows of `read_models` with the copies and the
    projection's offsets with the rebuild's (plus a progress marker at `up_to`
    for every slice), so the live projection continues right after it. The
    projection must not be running meanwhile (`ProjectionBusy` otherwise).
    Rows of `read_models` are replaced: passing them is the permission to do so.
    (The projections' own tables are named by `projection_settings.tables`, as for
    `project`.) `filter`: the projection's `EventFilter`, as for `project` (the
    handler sees only what it lets through). `tables=` is the deprecated name of
    `read_models=` (until 0.4.0; one name, one meaning: elsewhere `tables` names
    the projections' own tables).

    `from_snapshots`: each id whose snapshot was taken by `up_to` starts from it — the
    handler gets the snapshot (`EventEnvelope.from_snapshot`, the state in `event`) in
    place of the events up to its seq_nr, then the later events — and the server ships
    the snapshots and those later events, not the whole history. A snapshot stands for
    events a filter would judge one by one: `filter` is refused with it.
    """
    if tables is not None:
        warnings.warn(
            "rebuild(tables=...) is deprecated: use rebuild(read_models=...)",
            DeprecationWarning,
            stacklevel=2,
        )
        if read_models:
            raise InvalidArgument("pass read_models= only (tables= is its deprecated name)")
        read_models = tables
    if (
        isinstance(read_models, str)
        or not read_models
        or not all(isinstance(t, str) for t in read_models)
    ):
        raise InvalidArgument("read_models must be a non-empty list of table names")
    _check_common(name, entity_type, slice_range, handler, num_partitions, spark)
    event_filter = check_filter(filter)
    if not isinstance(from_snapshots, bool):
        raise InvalidArgument(f"from_snapshots must be True or False, not {from_snapshots!r}")
    if from_snapshots and event_filter is not None:
        raise InvalidArgument(
            "rebuild: from_snapshots cannot be combined with a filter (a snapshot stands "
            "for every event before it, which a filter would judge one by one)"
        )
    settings = settings or JournalSettings()
    ranges = slice_range.split(num_partitions)
    staging = _staging_schema(settings, name)
    with open_connection(dsn, settings) as conn:
        targets = _resolve_tables(conn, read_models)
        if up_to is None:
            row = conn.execute("SELECT transaction_timestamp()").fetchone()
            assert row is not None
            up_to = row[0]
    up_to = check_timestamp(up_to)
    options = _source_options(
        dsn, settings, entity_type, slice_range, num_partitions, event_filter,
        toTimestamp=up_to.isoformat(), fromSnapshots="true" if from_snapshots else None,
    )  # fmt: skip
    stage_name = f"{name} (rebuild staging)"
    validate_name(stage_name)
    applier = _applier(
        dsn, settings, stage_name, entity_type, ranges, handler, projection_settings,
        serializers, search_path=staging, transaction_per_batch=True, event_filter=event_filter,
    )  # fmt: skip
    register(spark)
    leases = SparkLeases(
        dsn, settings, name, ranges, owner=spark_owner("spark-rebuild"), ttl=lease_ttl,
        tables=applier.projection_settings.tables,
    )  # fmt: skip
    leases.acquire(lease_wait)
    try:
        leases.keep_alive(lambda: True, lambda: None)
        with open_connection(dsn, settings) as conn, conn.transaction():
            _create_staging(conn, staging, name, targets)
            dao = OffsetDao(leases.tables, stage_name)
            dao.clear(conn, slice_range)
        df = spark.read.format("slicejournal").options(**options).load()
        applier = attrs.evolve(applier, fences=leases.fences)
        df.write.format(_writer_format(spark, applier)).mode("append").save()
        with open_connection(dsn, settings) as conn, conn.transaction():
            events = _swap(
                conn, settings, leases, name, stage_name, slice_range, staging, targets, up_to
            )
    finally:
        leases.release()
    _log.info("projection %s rebuilt on spark up to %s: %d events", name, up_to, events)
    return RebuildResult(events, up_to, tuple(".".join(t) for t in targets))


def _staging_schema(settings: JournalSettings, name: str) -> str:
    digest = hashlib.sha1(f"{settings.schema}\x00{name}".encode()).hexdigest()[:12]
    return f"slicejournal_rebuild_{digest}"


def _resolve_tables(conn: Connection[Any], tables: Sequence[str]) -> list[tuple[str, str]]:
    """(schema, table) of each name as the session resolves it; unknown: `InvalidArgument`."""
    out: list[tuple[str, str]] = []
    for t in tables:
        row = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(%s) AND c.relkind IN ('r', 'p')",
            (t,),
        ).fetchone()
        if row is None:
            raise InvalidArgument(f"rebuild: no table {t!r}")
        if any(row[1] == known for _, known in out):
            raise InvalidArgument(f"rebuild: two tables named {row[1]!r}")
        out.append((row[0], row[1]))
    return out


def _create_staging(
    conn: Connection[Any], staging: str, name: str, targets: Sequence[tuple[str, str]]
) -> None:
    """Empty copies of the targets in a schema of ours (one a crashed rebuild left is
    recognised by its comment and replaced; any other schema of that name is refused)."""
    row = conn.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
        (staging,),
    ).fetchone()
    if row is not None:
        if row[0] != _STAGING_COMMENT + name:
            raise InvalidArgument(f"rebuild: schema {staging!r} exists and is not ours")
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(staging)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(staging)))
    conn.execute(
        sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
            sql.Identifier(staging), sql.Literal(_STAGING_COMMENT + name)
        )
    )
    for schema, table in targets:
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                sql.Identifier(staging, table), sql.Identifier(schema, table)
            )
        )


def _swap(
    conn: Connection[Any],
    settings: JournalSettings,
    leases: SparkLeases,
    name: str,
    stage_name: str,
    slice_range: SliceRange,
    staging: str,
    targets: Sequence[tuple[str, str]],
    up_to: datetime,
) -> int:
    """One transaction: the read model, the offsets and the markers at `up_to`, or nothing.
    Returns how many events the rebuild applied (its offset rows)."""
    t = leases.tables
    for fence in leases.fences:  # still ours, and nobody may take them until we commit
        conn.execute(*fence.statement(t))
    for schema, table in targets:
        live, copy = sql.Identifier(schema, table), sql.Identifier(staging, table)
        conn.execute(sql.SQL("DELETE FROM {}").format(live))
        conn.execute(
            sql.SQL("INSERT INTO {} OVERRIDING SYSTEM VALUE SELECT * FROM {}").format(live, copy)
        )
    dao = OffsetDao(t, name)
    dao.clear(conn, slice_range)
    moved = conn.execute(
        sql.SQL(
            "UPDATE {} SET projection_name = %s WHERE projection_name = %s RETURNING seq_nr > 0"
        ).format(t.offset_store),
        (name, stage_name),
    ).fetchall()
    markers = [Record(s, PROGRESS_PID, PROGRESS_SEQ_NR, up_to) for s in slice_range]
    for r in {f.slice_range for f in leases.fences}:
        dao.save(conn, r.key, [m for m in markers if m.slice in r])
    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(staging)))
    return sum(1 for (event,) in moved if event)

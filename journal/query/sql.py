"""The SQL of the journal's queries, built with `psycopg.sql` from a `RowsQuery` or key.

One place for every read statement, so the predicates that make the slice
query correct (the `seen` exclusion, staying behind the clock, counting only
complete buckets) are visible side by side.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any

from psycopg import sql

from journal.filter import EventFilter
from journal.model import (
    EPOCH,
    FILTERED_MANIFEST,
    FILTERED_SER_ID,
    TOMBSTONE_MANIFEST,
    TOMBSTONE_SER_ID,
)
from journal.query.by_slice import BUCKET_SECONDS, BucketsQuery, RowsQuery
from journal.rows import COLUMNS, PAYLOAD_COLUMN
from journal.tables import Tables


def envelope_columns(
    *, with_payload: bool = True, matched: sql.Composable | None = None
) -> sql.Composable:
    """The select list every envelope query uses; without payload it selects NULL instead.

    With `matched` (a filter's condition, tombstones included): a row it does not
    hold for is selected as its key only — the filtered sentinel's serializer id
    and manifest, no tags, metadata or payload — so the server never ships what
    the consumer does not want (`journal.rows` turns it into a `FILTERED` envelope).
    """
    payload: sql.Composable = (
        sql.Identifier(PAYLOAD_COLUMN) if with_payload else sql.SQL("NULL::bytea")
    )
    cols: list[sql.Composable] = [sql.Identifier(c) for c in COLUMNS]
    if matched is not None:
        when = {"m": matched}
        for name, otherwise in _FILTERED_COLUMNS.items():
            cols[COLUMNS.index(name)] = sql.SQL(
                "CASE WHEN {m} THEN {c} ELSE {o} END AS {c}"
            ).format(c=sql.Identifier(name), o=otherwise, **when)
        payload = sql.SQL("CASE WHEN {m} THEN {p} END").format(p=payload, **when)
    cols.append(payload)
    return sql.SQL(", ").join(cols)


# What a filtered-out row's columns read as (the rest of its key is kept).
_FILTERED_COLUMNS: dict[str, sql.Composable] = {
    "tags": sql.SQL("NULL::text[]"),
    "event_ser_id": sql.Literal(FILTERED_SER_ID),
    "event_ser_manifest": sql.Literal(FILTERED_MANIFEST),
    "meta_ser_id": sql.SQL("NULL::int"),
    "meta_ser_manifest": sql.SQL("NULL::text"),
    "meta_payload": sql.SQL("NULL::bytea"),
}


def filter_condition(event_filter: EventFilter) -> tuple[sql.Composable, dict[str, Any]]:
    """An `EventFilter` as one SQL condition on a journal row, and its parameters.

    Parameter names start with `filter_`, so the condition composes with any
    statement of the journal's; manifests and tags are bound, `where` is the
    application's trusted SQL."""
    parts: list[sql.Composable] = []
    params: dict[str, Any] = {}
    if event_filter.manifests:
        parts.append(sql.SQL("event_ser_manifest = ANY(%(filter_manifests)s::text[])"))
        params["filter_manifests"] = list(event_filter.manifests)
    if event_filter.tags:
        parts.append(sql.SQL("tags && %(filter_tags)s::text[]"))
        params["filter_tags"] = list(event_filter.tags)
    if event_filter.where is not None:
        # A literal % in the expression must not read as a placeholder.
        where = event_filter.where.replace("%", "%%")
        parts.append(sql.SQL("(") + sql.SQL(where) + sql.SQL(")"))
    if not parts:
        return sql.SQL("true"), params
    return sql.SQL("(") + sql.SQL(" AND ").join(parts) + sql.SQL(")"), params


def filter_matches(
    event_filter: EventFilter | None,
) -> tuple[sql.Composable | None, dict[str, Any]]:
    """The condition a row must meet to be delivered whole under `event_filter` (a
    tombstone always is), with its parameters; (None, {}) without a filter."""
    if event_filter is None:
        return None, {}
    condition, params = filter_condition(event_filter)
    tombstone, tombstone_params = (
        _IS_TOMBSTONE,
        {
            "tombstone": TOMBSTONE_MANIFEST,
            "tombstone_ser_id": TOMBSTONE_SER_ID,
        },
    )
    return sql.SQL("({} OR {})").format(condition, tombstone), {**params, **tombstone_params}


SLICE_RANGE = sql.SQL(
    "entity_type = %(entity_type)s AND slice BETWEEN %(min_slice)s AND %(max_slice)s"
)

# The slice query's own statements name a range's slices one by one (`slice_list`), so
# that the slice index (slice, entity_type, db_timestamp, ...) is read as one bounded
# scan per slice. With `BETWEEN`, PostgreSQL before 18 (no skip scan) bounds the scan by
# the slices only and reads every index entry of the range to find a stretch of time:
# each catch-up chunk and each live poll then costs as much as the range holds
# (EXPLAIN ANALYZE of a 2,030-row chunk over 256 slices of 200k events, PostgreSQL 15:
# 3.9 ms with BETWEEN, 2.0 ms with this; PostgreSQL 18 about the same for both).
SLICES = sql.SQL("entity_type = %(entity_type)s AND slice = ANY(%(slices)s::int[])")


@functools.lru_cache(maxsize=64)
def slice_list(min_slice: int, max_slice: int) -> str:
    """The slices min..max as an int[] literal (`SLICES`' parameter): one short string per
    range, which psycopg sends as it is, instead of a list dumped value by value."""
    return "{" + ",".join(map(str, range(min_slice, max_slice + 1))) + "}"


_IS_TOMBSTONE = sql.SQL(
    "(event_ser_id = %(tombstone_ser_id)s AND event_ser_manifest = %(tombstone)s)"
)
_NOT_DELETED_OR_TOMBSTONE = sql.SQL("(deleted = false OR {})").format(_IS_TOMBSTONE)


def delivered_rows() -> tuple[sql.Composable, dict[str, Any]]:
    """The condition on the rows every reader of events delivers, and its parameters:
    not deleted, except `delete_all`'s tombstones, which tell readers an id was erased.
    (Deletion markers of `delete_events_to` stay out: they stand for deleted events.)"""
    return _NOT_DELETED_OR_TOMBSTONE, {
        "tombstone": TOMBSTONE_MANIFEST,
        "tombstone_ser_id": TOMBSTONE_SER_ID,
    }


def time_bounds(
    from_timestamp: datetime | None,
    until_exclusive: datetime | None,
    to_inclusive: datetime | None,
) -> tuple[list[sql.Composable], dict[str, Any]]:
    """The `db_timestamp` conditions of a scan and their parameters (`from_ts`,
    `until_ts`, `to_ts`); None leaves that side open. Every read of a stretch of
    the journal (slice rows, bucket counts, Spark partitions) bounds it this way."""
    where: list[sql.Composable] = []
    params: dict[str, Any] = {}
    if from_timestamp is not None:
        where.append(sql.SQL("db_timestamp >= %(from_ts)s"))
        params["from_ts"] = from_timestamp
    if until_exclusive is not None:
        where.append(sql.SQL("db_timestamp < %(until_ts)s"))
        params["until_ts"] = until_exclusive
    if to_inclusive is not None:
        where.append(sql.SQL("db_timestamp <= %(to_ts)s"))
        params["to_ts"] = to_inclusive
    return where, params


def slice_rows(
    tables: Tables,
    entity_type: str,
    min_slice: int,
    max_slice: int,
    query: RowsQuery,
    event_filter: EventFilter | None = None,
    *,
    from_snapshots: bool = False,
) -> tuple[sql.Composed, dict[str, Any]]:
    """SELECT for one slice-range RowsQuery; the last column is the read time. With
    `event_filter`, rows it leaves out come back as their key only.

    With `from_snapshots` (a normal query, not backtracking), each id's snapshot
    comes in place of its events up to the snapshot's seq_nr (`snapshot_rows`)."""
    bounds, params = time_bounds(query.from_timestamp, query.until_exclusive, query.to_inclusive)
    matched, filter_params = filter_matches(event_filter)
    params |= filter_params
    delivered, delivered_params = delivered_rows()
    params |= {"entity_type": entity_type, "slices": slice_list(min_slice, max_slice),
               **delivered_params}  # fmt: skip
    shared: list[sql.Composable] = [SLICES, *bounds]
    if query.exclude:
        # Events at exactly the start timestamp that were already emitted.
        shared.append(
            sql.SQL(
                "(db_timestamp > %(from_ts)s OR NOT EXISTS ("
                "SELECT 1 FROM unnest(%(ex_pids)s::text[], %(ex_seqs)s::bigint[]) AS x(pid, seq) "
                "WHERE x.pid = persistence_id AND x.seq >= seq_nr))"
            )
        )
        params["ex_pids"] = list(query.exclude.keys())
        params["ex_seqs"] = list(query.exclude.values())
    if query.horizon is not None:
        shared.append(sql.SQL("db_timestamp < %(horizon)s"))
        params["horizon"] = query.horizon
    if query.behind_current_time is not None:
        shared.append(sql.SQL("db_timestamp < transaction_timestamp() - %(behind)s::interval"))
        params["behind"] = query.behind_current_time
    columns = envelope_columns(with_payload=query.with_payload, matched=matched)
    if from_snapshots and not query.backtracking:
        statement = snapshot_rows(
            tables, columns, [*shared, delivered], shared, bounded=query.to_inclusive is not None
        )
    else:
        statement = sql.SQL(
            "SELECT {columns}, transaction_timestamp() FROM {journal} WHERE {where} "
            "ORDER BY db_timestamp, seq_nr"
        ).format(
            columns=columns,
            journal=tables.journal,
            where=sql.SQL(" AND ").join([*shared, delivered]),
        )
    if query.limit is not None:
        statement = sql.Composed([statement, sql.SQL(" LIMIT %(limit)s")])
        params["limit"] = query.limit
    return statement, params


def not_covered_by_snapshot(tables: Tables, *, bounded: bool) -> sql.Composed:
    """The condition on a journal row (aliased `e`) that no snapshot of its id stands for
    it. `bounded`: the read ends at `%(to_ts)s` (inclusive), and a snapshot after that
    end is not read, so it covers nothing: the events before it are read instead."""
    end = sql.SQL(" AND s.db_timestamp <= %(to_ts)s") if bounded else sql.SQL("")
    return sql.SQL(
        "(e.seq_nr = 0 OR NOT EXISTS (SELECT 1 FROM {snapshot} AS s "
        "WHERE s.persistence_id = e.persistence_id AND s.seq_nr >= e.seq_nr "
        "AND s.db_timestamp IS NOT NULL{end}))"
    ).format(snapshot=tables.snapshot, end=end)


def snapshot_rows(
    tables: Tables,
    columns: sql.Composable,
    journal_where: list[sql.Composable],
    snapshot_where: list[sql.Composable],
    *,
    bounded: bool = False,
) -> sql.Composed:
    """The events of a stretch with each id's snapshot in place of its events up to the
    snapshot's seq_nr: events no snapshot covers, and the snapshots, whose db_timestamp
    is that of the event they were taken at, ordered together. One more column before
    the read time says which rows are snapshots (`journal.rows.SNAPSHOT_FLAG`).

    Why this never loses an event, whatever the stream has read before the snapshot
    was saved: an event it leaves out has a db_timestamp at or below its snapshot's,
    so a scan that has not passed the event has not passed the snapshot either, and
    one that had passed the snapshot's timestamp read the event before. Tombstones
    (seq_nr 0) are never covered; snapshots without a db_timestamp (a writer that does
    not set it) cover nothing, and neither do snapshots past a `bounded` read's end.
    """
    covered = not_covered_by_snapshot(tables, bounded=bounded)
    snapshot_columns = sql.SQL(
        "persistence_id, entity_type, slice, seq_nr, db_timestamp, ''::text, tags, ser_id, "
        "ser_manifest, meta_ser_id, meta_ser_manifest, meta_payload, snapshot"
    )
    return sql.SQL(
        "SELECT {columns}, false, transaction_timestamp() FROM {journal} AS e "
        "WHERE {journal_where} "
        "UNION ALL "
        "SELECT {snapshot_columns}, true, transaction_timestamp() FROM {snapshot} "
        "WHERE {snapshot_where} "
        "ORDER BY db_timestamp, seq_nr"
    ).format(
        columns=columns,
        journal=tables.journal,
        journal_where=sql.SQL(" AND ").join([*journal_where, covered]),
        snapshot_columns=snapshot_columns,
        snapshot=tables.snapshot,
        snapshot_where=sql.SQL(" AND ").join(snapshot_where),
    )


def slice_buckets(
    tables: Tables,
    entity_type: str,
    min_slice: int,
    max_slice: int,
    query: BucketsQuery,
    behind: Any,
    table: sql.Identifier | None = None,
) -> tuple[sql.Composed, dict[str, Any]]:
    """Row counts per 10 s bucket; live queries count only complete buckets behind the clock.

    Deleted rows are counted too: that keeps the count an index-only scan of
    `event_journal_slice_idx`, and a chunk that returns fewer rows than
    counted is simply read to its bound. `table`: another table of the same
    slice layout (the durable state's); the journal by default.
    """
    bounds, params = time_bounds(query.from_timestamp, query.until_exclusive, query.to_inclusive)
    where: list[sql.Composable] = [SLICES, *bounds]
    params |= {
        "entity_type": entity_type,
        "slices": slice_list(min_slice, max_slice),
        "limit": query.limit,
        # Buckets by `date_bin`, and the epoch seconds once per bucket: `extract(epoch
        # ...)` is numeric arithmetic, and per row it made the count three times slower
        # (200k rows: 0.62 us an event of a catch-up, against 0.25); the same buckets.
        "stride": timedelta(seconds=BUCKET_SECONDS),
        "origin": EPOCH,
    }
    if query.to_inclusive is None:
        # Complete buckets only: below the start of the bucket the clock is in.
        where.append(
            sql.SQL(
                "db_timestamp < date_bin(%(stride)s, "
                "transaction_timestamp() - %(behind)s::interval, %(origin)s)"
            )
        )
        params["behind"] = behind
    statement = sql.SQL(
        "SELECT extract(epoch FROM b)::bigint AS bucket, n FROM ("
        "SELECT date_bin(%(stride)s, db_timestamp, %(origin)s) AS b, count(*) AS n "
        "FROM {journal} WHERE {where} GROUP BY b ORDER BY b LIMIT %(limit)s"
        ") counts ORDER BY b"
    ).format(journal=table or tables.journal, where=sql.SQL(" AND ").join(where))
    return statement, params


# Lock modes of a transaction that has written (or waits to write) journal rows.
_WRITE_LOCKS = sql.SQL(
    "('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')"
)

_HORIZON = sql.SQL(
    """WITH journal AS (
  SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = %(schema)s AND c.relname = %(table)s
), sessions AS (
  SELECT a.pid, a.usename, a.state, a.query = '<insufficient privilege>' AS hidden,
    least(a.xact_start, a.query_start) AS started,
    EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'relation'
            AND l.relation = j.oid AND l.mode IN {write_locks}) AS writes
  FROM pg_stat_activity a, journal j
  WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
    AND a.usesysid IS NOT NULL
    AND (a.backend_type IS NULL OR a.backend_type = 'client backend')
    AND a.application_name IS DISTINCT FROM %(reader)s
    AND has_table_privilege(a.usesysid, j.oid, 'INSERT')
)
SELECT statement_timestamp(), current_user::text,
  current_setting('track_activities')::bool,
  (SELECT count(*) FROM pg_locks l, journal j WHERE l.pid IS NULL
     AND l.locktype = 'relation' AND l.relation = j.oid AND l.mode IN {write_locks}),
  coalesce(array_agg(DISTINCT usename::text) FILTER (WHERE hidden), '{{}}'),
  count(*) FILTER (WHERE state = 'disabled'),
  coalesce(array_agg(pid ORDER BY pid) FILTER (WHERE {open}), '{{}}'),
  coalesce(array_agg(started ORDER BY pid) FILTER (WHERE {open}), '{{}}'),
  coalesce(array_agg(writes ORDER BY pid) FILTER (WHERE {open}), '{{}}')
FROM sessions"""
).format(
    write_locks=_WRITE_LOCKS,
    open=sql.SQL(
        "state IN ('active', 'idle in transaction', 'fastpath function call') "
        "AND started IS NOT NULL"
    ),
)


def horizon(
    tables: Tables, reader_application: str, table: str | None = None
) -> tuple[sql.Composed, dict[str, Any]]:
    """The open transactions that may write to the journal (see `journal.query.horizon`).

    Sessions of roles without INSERT on the journal, in other databases, and the
    journal's own read connections cannot write to it and are left out. A
    prepared transaction holding a write lock on the journal counts in the
    fourth column: it can commit whenever, and its start time is unknown. A
    session hidden from us shows `<insufficient privilege>` as its query; one
    still starting up shows no state either, but cannot have written anything.
    `table` (unquoted): the table whose writers count, the journal by default (the
    durable state's for its changes query).
    """
    params = {
        "schema": tables.settings.schema,
        "table": table or tables.settings.journal_table,
        "reader": reader_application,
    }
    return _HORIZON, params


def by_persistence_id(
    tables: Tables, event_filter: EventFilter | None = None, *, tombstones: bool = False
) -> tuple[sql.Composed, dict[str, Any]]:
    """Events of one id in seq_nr order, from/to inclusive, paged by LIMIT; the
    parameters besides pid, from_seq, to_seq and limit (a filter's).

    With `tombstones`, `delete_all`'s tombstones come too, as slice queries deliver
    them (`delivered_rows`): a projection's gap fill must hand the erasure to the
    handler before the id's next lifetime, whenever the tombstone itself arrives."""
    matched, params = filter_matches(event_filter)
    rows: sql.Composable = sql.SQL("deleted = false")
    if tombstones:
        rows, delivered_params = delivered_rows()
        params = {**params, **delivered_params}
    statement = sql.SQL(
        "SELECT {columns} FROM {journal} WHERE persistence_id = %(pid)s "
        "AND seq_nr >= %(from_seq)s AND seq_nr <= %(to_seq)s AND {rows} "
        "ORDER BY seq_nr LIMIT %(limit)s"
    ).format(columns=envelope_columns(matched=matched), journal=tables.journal, rows=rows)
    return statement, params


def one_event(tables: Tables) -> sql.Composed:
    """A single stored, not deleted event by id and seq_nr."""
    return sql.SQL(
        "SELECT {columns} FROM {journal} WHERE persistence_id = %s AND seq_nr = %s AND NOT deleted"
    ).format(columns=envelope_columns(), journal=tables.journal)


def timestamp_of(tables: Tables) -> sql.Composed:
    """The db_timestamp of a stored, not deleted event."""
    return sql.SQL(
        "SELECT db_timestamp FROM {journal} WHERE persistence_id = %s AND seq_nr = %s "
        "AND NOT deleted"
    ).format(journal=tables.journal)


def delivered_timestamp_of(tables: Tables) -> sql.Composed:
    """The db_timestamp of a row slice queries deliver: a stored, not deleted event or
    a tombstone (`delivered_rows`). A projection asks it of an unknown id's previous
    seq_nr: a tombstone there is an erasure its handler must see first (a gap fill)."""
    condition, _ = delivered_rows()
    return sql.SQL(
        "SELECT db_timestamp FROM {journal} WHERE persistence_id = %(pid)s "
        "AND seq_nr = %(seq_nr)s AND {condition}"
    ).format(journal=tables.journal, condition=condition)


def deleted_to(tables: Tables) -> sql.Composed:
    """The highest seq_nr >= the given one among an id's deletion markers (`deleted`
    rows), 0 if none: every seq_nr up to it is deleted. It tells a gap whose events
    were deleted from one whose events are not visible yet."""
    return sql.SQL(
        "SELECT COALESCE(max(seq_nr), 0) FROM {journal} WHERE persistence_id = %s "
        "AND seq_nr >= %s AND deleted"
    ).format(journal=tables.journal)


def persistence_ids(tables: Tables, *, by_entity_type: bool) -> sql.Composed:
    """Distinct ids after a key, keyset-paged (uses the primary key index)."""
    extra = sql.SQL(" AND entity_type = %(entity_type)s") if by_entity_type else sql.SQL("")
    return sql.SQL(
        "SELECT DISTINCT persistence_id FROM {journal} "
        "WHERE persistence_id > %(after)s{extra} ORDER BY persistence_id LIMIT %(limit)s"
    ).format(journal=tables.journal, extra=extra)


def database_time() -> sql.SQL:
    return sql.SQL("SELECT transaction_timestamp()")

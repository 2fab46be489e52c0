"""The Spark source's statements, built from `Tables` and a `ReadPlan`; they run nothing.

Three questions, all over the `(slice, entity_type, db_timestamp)` index: the
rows of one partition (the columns Spark's schema needs, `PARTITION_COLUMNS`),
how far a stream may advance (the newest row behind the clock, and the
limit-th one for `maxEventsPerTrigger`), and how many rows lie in a window
(the late-commit detector of `offsets.py`). The bounds and the count include
deleted rows, which keeps them index-only.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

import attrs
from psycopg import sql

from journal.durable_state import DELETED_SQL
from journal.model import FILTERED_MANIFEST, FILTERED_SER_ID
from journal.query.sql import (
    SLICE_RANGE,
    SLICES,
    delivered_rows,
    filter_matches,
    not_covered_by_snapshot,
    slice_list,
    time_bounds,
)
from journal.serialization import JSON_SERIALIZER_ID
from journal.slices import SliceRange
from journal.tables import Tables
from projections.spark.options import DURABLE_STATE, SourceOptions

# What `arrow.spark_batch` turns into the source's schema: every column it needs and
# no other, since the executor's decoding costs by the column (1M events: the
# journal's 13 columns 1.3 s of CPU, these 10 0.9 s). Not selected: the entity type
# (the partition's filter: one value) and the metadata's manifest (not in the
# schema); the metadata only when it is the JSON serializer's text.
PARTITION_COLUMNS = sql.SQL(
    "persistence_id, slice, seq_nr, db_timestamp, writer, tags, event_ser_id, "
    "event_ser_manifest, CASE WHEN meta_ser_id = {json} THEN meta_payload END AS meta_json, "
    "event_payload, deleted"
).format(json=sql.Literal(JSON_SERIALIZER_ID))

# The same with an `EventFilter`'s condition `m` (tombstones included): a row it does not
# hold for is read as its key only, as `journal.query.sql.envelope_columns` selects it —
# the filtered sentinel's serializer id and manifest, no tags, metadata or payload.
_KEYS_OF_FILTERED = (
    "persistence_id, slice, seq_nr, db_timestamp, writer, CASE WHEN {m} THEN tags END AS tags, "
    "CASE WHEN {m} THEN event_ser_id ELSE {ser_id} END AS event_ser_id, "
    "CASE WHEN {m} THEN event_ser_manifest ELSE {manifest} END AS event_ser_manifest, "
    "CASE WHEN {m} AND meta_ser_id = {json} THEN meta_payload END AS meta_json, "
    "CASE WHEN {m} THEN event_payload END AS event_payload, deleted"
)


def partition_columns(matched: sql.Composable | None) -> sql.Composable:
    """`PARTITION_COLUMNS`, or with `matched` the filtered rows as keys only."""
    if matched is None:
        return PARTITION_COLUMNS
    return sql.SQL(_KEYS_OF_FILTERED).format(
        m=matched,
        ser_id=sql.Literal(FILTERED_SER_ID),
        manifest=sql.Literal(FILTERED_MANIFEST),
        json=sql.Literal(JSON_SERIALIZER_ID),
    )


@attrs.frozen
class ReadPlan:
    """What one Spark partition reads: a slice sub-range between two timestamps.

    `until_exclusive` bounds stream batches, `to_inclusive` batch reads
    (`toTimestamp`); `persistence_ids` and the narrowed range come from pushed
    filters; `empty` means the pushed filters admit no row at all; `manifests` (pushed
    `ser_manifest` filters) are the serializer manifests the rows may have (None: any).
    """

    options: SourceOptions
    slice_range: SliceRange
    from_timestamp: datetime | None
    until_exclusive: datetime | None = None
    to_inclusive: datetime | None = None
    persistence_ids: tuple[str, ...] = ()
    empty: bool = False
    manifests: tuple[str, ...] | None = None


def _range_params(options: SourceOptions, r: SliceRange) -> dict[str, Any]:
    """The parameters of `SLICE_RANGE` and of `SLICES` (the slices one by one)."""
    return {
        "entity_type": options.entity_type,
        "min_slice": r.min_slice,
        "max_slice": r.max_slice,
        "slices": slice_list(r.min_slice, r.max_slice),
    }


def partition_rows(plan: ReadPlan) -> tuple[sql.Composed, dict[str, Any]]:
    """The partition's rows — not deleted, but with `delete_all`'s tombstones, as every
    reader of events delivers them — ordered by (db_timestamp, seq_nr) — so each
    persistence id's events come in seq_nr order — unless the options say `ordered`
    false (a batch read that does not need it skips the server's sort).

    With the options' `EventFilter`, a row it leaves out is not read, or read as its
    key only (`filteredEnvelopes`: a projection's offset store needs every seq_nr).
    With `fromSnapshots`, each id's snapshot comes in place of its events up to the
    snapshot's seq_nr (`_from_snapshots`)."""
    bounds, params = time_bounds(plan.from_timestamp, plan.until_exclusive, plan.to_inclusive)
    delivered, delivered_params = delivered_rows()
    # BETWEEN, not the slices one by one (`SLICES`): a partition reads its whole range,
    # often by a sequential scan, where BETWEEN is two comparisons a row.
    shared: list[sql.Composable] = [SLICE_RANGE, *bounds]
    params |= _range_params(plan.options, plan.slice_range) | delivered_params
    if plan.persistence_ids:
        shared.append(sql.SQL("persistence_id = ANY(%(pids)s::text[])"))
        params["pids"] = list(plan.persistence_ids)
    if plan.manifests is not None:
        params["pushed_manifests"] = list(plan.manifests)
    tables = Tables(plan.options.settings)
    if plan.options.read == DURABLE_STATE:
        return _durable_state_rows(tables, plan, shared), params
    order = sql.SQL(" ORDER BY db_timestamp, seq_nr" if plan.options.ordered else "")
    if plan.options.from_snapshots:  # no filter (the options refuse one)
        return _from_snapshots(tables, plan, shared, delivered, order), params
    where = [*shared, delivered, *_manifests(plan, "event_ser_manifest")]
    matched, filter_params = filter_matches(plan.options.event_filter)
    params |= filter_params
    if matched is not None and not plan.options.filtered_envelopes:
        where.append(matched)
        matched = None
    statement = sql.SQL("SELECT {columns} FROM {journal} WHERE {where}{order}").format(
        columns=partition_columns(matched),
        journal=tables.journal,
        where=sql.SQL(" AND ").join(where),
        order=order,
    )
    return statement, params


# A durable state row as `arrow.state_batch` reads it: the payload only for a live state
# (a deletion's is Pekko's empty marker), `deleted` by the store's own rule.
_STATE_COLUMNS = sql.SQL(
    "persistence_id, slice, revision, db_timestamp, tags, state_ser_id, state_ser_manifest, "
    "CASE WHEN NOT {deleted} THEN state_payload END AS state_payload, {deleted} AS deleted"
).format(deleted=sql.SQL(DELETED_SQL))


def _durable_state_rows(
    tables: Tables, plan: ReadPlan, shared: list[sql.Composable]
) -> sql.Composed:
    """The partition's ids with their latest durable state (`read=durableState`): one
    row each, deleted ones included (flagged), in (db_timestamp, revision) order unless
    the options say `ordered` false."""
    where = [*shared, *_manifests(plan, "coalesce(state_ser_manifest, '')")]
    order = " ORDER BY db_timestamp, revision" if plan.options.ordered else ""
    return sql.SQL("SELECT {columns} FROM {table} WHERE {where}{order}").format(
        columns=_STATE_COLUMNS,
        table=tables.durable_state,
        where=sql.SQL(" AND ").join(where),
        order=sql.SQL(order),
    )


def _manifests(
    plan: ReadPlan,
    column: Literal["event_ser_manifest", "ser_manifest", "coalesce(state_ser_manifest, '')"],
) -> list[sql.Composable]:
    """The pushed `ser_manifest` filter on `column` (of ours; the durable state's may be
    NULL, which its `ser_manifest` column shows as ''), if any."""
    if plan.manifests is None:
        return []
    return [sql.SQL(column + " = ANY(%(pushed_manifests)s::text[])")]  # one of ours


# A snapshot row as `PARTITION_COLUMNS` (the state in the payload's place), then the flag.
_SNAPSHOT_COLUMNS = sql.SQL(
    "persistence_id, slice, seq_nr, db_timestamp, ''::text AS writer, tags, "
    "ser_id AS event_ser_id, ser_manifest AS event_ser_manifest, "
    "CASE WHEN meta_ser_id = {json} THEN meta_payload END AS meta_json, "
    "snapshot AS event_payload, false AS deleted, true AS from_snapshot"
).format(json=sql.Literal(JSON_SERIALIZER_ID))


def _from_snapshots(
    tables: Tables,
    plan: ReadPlan,
    shared: list[sql.Composable],
    delivered: sql.Composable,
    order: sql.Composable,
) -> sql.Composed:
    """The partition's rows with each id's snapshot in place of its events up to the
    snapshot's seq_nr, as `journal.query.sql.snapshot_rows` reads them for the slice
    query: the events no snapshot covers (one past the read's end covers nothing), and
    the snapshots within the same bounds, with `from_snapshot` saying which is which."""
    covered = not_covered_by_snapshot(tables, bounded=plan.to_inclusive is not None)
    journal_where = [*shared, delivered, covered, *_manifests(plan, "event_ser_manifest")]
    snapshot_where = [
        *shared, sql.SQL("db_timestamp IS NOT NULL"), *_manifests(plan, "ser_manifest")
    ]  # fmt: skip
    return sql.SQL(
        "SELECT {columns}, false AS from_snapshot FROM {journal} AS e WHERE {jw} "
        "UNION ALL SELECT {snapshot_columns} FROM {snapshot} WHERE {sw}{order}"
    ).format(
        columns=PARTITION_COLUMNS,
        journal=tables.journal,
        jw=sql.SQL(" AND ").join(journal_where),
        snapshot_columns=_SNAPSHOT_COLUMNS,
        snapshot=tables.snapshot,
        sw=sql.SQL(" AND ").join(snapshot_where),
        order=order,
    )


def _table(options: SourceOptions) -> sql.Identifier | sql.Composed:
    """The table the options read: the journal, or the durable state store's."""
    tables = Tables(options.settings)
    return tables.durable_state if options.read == DURABLE_STATE else tables.journal


def stream_bounds(
    options: SourceOptions, start: datetime, bound: datetime, limit: int | None
) -> tuple[sql.Composed, dict[str, Any]]:
    """(newest, nth): the newest row at or after `start` and below `bound` (the batch
    bound of `offsets.batch_bound`), and the `limit`-th such row (NULL without a limit)."""
    # The slices one by one: a stretch of time of the range, one bounded index scan per
    # slice on PostgreSQL before 18 too (`journal.query.sql.SLICES`).
    behind: list[sql.Composable] = [
        SLICES,
        sql.SQL("db_timestamp >= %(from_ts)s"),
        sql.SQL("db_timestamp < %(bound)s"),
    ]
    params = _range_params(options, options.slice_range)
    params |= {"from_ts": start, "bound": bound, "skip": (limit or 1) - 1}
    if options.to_timestamp is not None:
        behind.append(sql.SQL("db_timestamp <= %(to_ts)s"))
        params["to_ts"] = options.to_timestamp
    journal = _table(options)
    where = sql.SQL(" AND ").join(behind)
    nth: sql.Composable = sql.SQL("NULL::timestamptz")
    if limit is not None:
        nth = sql.SQL(
            "(SELECT db_timestamp FROM {j} WHERE {w} ORDER BY db_timestamp OFFSET %(skip)s LIMIT 1)"
        ).format(j=journal, w=where)
    statement = sql.SQL("SELECT (SELECT max(db_timestamp) FROM {j} WHERE {w}), {nth}").format(
        j=journal, w=where, nth=nth
    )
    return statement, params


def window_count(
    options: SourceOptions, below: datetime, window: timedelta
) -> tuple[sql.Composed, dict[str, Any]]:
    """The blind stream's change detector for the window below `below`: for events, how
    many rows of the range lie in [below - window, below) (a late commit adds one).

    An upsert moves an id's one row instead, to its transaction's db_timestamp, which no
    count of a bounded window sees. For durable state it is the sum of the revisions of
    the range's rows at or after `below - window`, unbounded above: every write that
    lands there raises it (a new row adds its revision, a moved or updated one adds
    at least one), and no write lowers it."""
    params = _range_params(options, options.slice_range)
    params |= {"lo": below - window, "hi": below}
    if options.read == DURABLE_STATE:
        statement = sql.SQL(
            "SELECT coalesce(sum(revision), 0) FROM {t} WHERE {r} AND db_timestamp >= %(lo)s"
        ).format(t=_table(options), r=SLICES)
        return statement, params
    statement = sql.SQL(
        "SELECT count(*) FROM {j} WHERE {r} AND db_timestamp >= %(lo)s AND db_timestamp < %(hi)s"
    ).format(j=_table(options), r=SLICES)
    return statement, params

"""The SQL of the durable state store: its writes, its reads and its changes query.

The writes are Pekko Persistence R2DBC's: revision 1 inserts, revision N
updates the row only where it still holds N - 1 (so a stale or skipped
revision changes nothing and the driver raises `ConcurrencyError`), and
`db_timestamp` is `GREATEST(transaction_timestamp(), previous + 1 µs)` so it
strictly increases per id, as an event's does. The changes query is the slice
query's `RowsQuery` over this table (the bucket counts and the horizon are
`journal.query.sql`'s, given this table).
"""

from __future__ import annotations

from typing import Any

import attrs
from psycopg import sql

from journal.durable_state import DELETED_SQL, STATE_COLUMNS, STATE_PAYLOAD_COLUMN
from journal.query.by_slice import RowsQuery
from journal.query.sql import SLICES, slice_list, time_bounds
from journal.tables import Tables
from journal.wire import BYTEA, INT4, INT8, TEXT, TEXT_ARRAY, TIMESTAMPTZ, Positional, WireType

# The types of the writes' parameters, for running them through libpq (`Positional.wire`).
_WRITE_TYPES: dict[str, WireType] = {
    "slice": INT4,
    "entity_type": TEXT,
    "pid": TEXT,
    "revision": INT8,
    "previous": INT8,
    "ser_id": INT4,
    "manifest": TEXT,
    "payload": BYTEA,
    "tags": TEXT_ARRAY,
}


@attrs.frozen
class DurableStateSql:
    """The durable state table's statements, shared by both drivers. The writes return
    the row's db_timestamp, no row when the revision was not the next."""

    insert: Positional
    update: Positional
    select: sql.Composed
    revision_of: sql.Composed

    @classmethod
    def of(cls, tables: Tables) -> DurableStateSql:
        t = tables.durable_state
        return cls(
            insert=Positional.of(
                sql.SQL(
                    "INSERT INTO {t} (slice, entity_type, persistence_id, revision, "
                    "db_timestamp, state_ser_id, state_ser_manifest, state_payload, tags) "
                    "VALUES (%(slice)b::int, %(entity_type)b::text, %(pid)b::text, "
                    "%(revision)b::bigint, transaction_timestamp(), %(ser_id)b::int, "
                    "%(manifest)b::text, %(payload)b::bytea, %(tags)b::text[]) "
                    "ON CONFLICT (persistence_id) DO NOTHING RETURNING db_timestamp"
                ).format(t=t),
                _WRITE_TYPES,
                (TIMESTAMPTZ,),
            ),
            update=Positional.of(
                sql.SQL(
                    "UPDATE {t} SET revision = %(revision)b::bigint, "
                    "db_timestamp = GREATEST(transaction_timestamp(), "
                    "db_timestamp + interval '1 microsecond'), "
                    "state_ser_id = %(ser_id)b::int, state_ser_manifest = %(manifest)b::text, "
                    "state_payload = %(payload)b::bytea, tags = %(tags)b::text[] "
                    "WHERE persistence_id = %(pid)b::text AND revision = %(previous)b::bigint "
                    "RETURNING db_timestamp"
                ).format(t=t),
                _WRITE_TYPES,
                (TIMESTAMPTZ,),
            ),
            select=sql.SQL(
                "SELECT revision, db_timestamp, state_ser_id, state_ser_manifest, "
                "state_payload, tags FROM {t} WHERE persistence_id = %s"
            ).format(t=t),
            revision_of=sql.SQL("SELECT revision FROM {t} WHERE persistence_id = %s").format(t=t),
        )


def state_columns(*, with_payload: bool) -> sql.Composable:
    """The changes query's select list (`journal.durable_state.STATE_COLUMNS`, the
    payload or NULL): whether a row is a deletion is read even without its payload."""
    cols: list[sql.Composable] = [
        sql.SQL(DELETED_SQL + " AS deleted") if c == "deleted" else sql.Identifier(c)
        for c in STATE_COLUMNS
    ]
    cols.append(sql.Identifier(STATE_PAYLOAD_COLUMN) if with_payload else sql.SQL("NULL::bytea"))
    return sql.SQL(", ").join(cols)


def state_rows(
    tables: Tables, entity_type: str, min_slice: int, max_slice: int, query: RowsQuery
) -> tuple[sql.Composed, dict[str, Any]]:
    """SELECT for one slice-range RowsQuery over the durable state table, ordered by
    (db_timestamp, revision); the last column is the read time. Deletion markers are
    rows like any other: readers learn of the deletion from them."""
    bounds, params = time_bounds(query.from_timestamp, query.until_exclusive, query.to_inclusive)
    where: list[sql.Composable] = [SLICES, *bounds]
    params |= {"entity_type": entity_type, "slices": slice_list(min_slice, max_slice)}
    if query.exclude:
        # Changes at exactly the start timestamp that were already emitted.
        where.append(
            sql.SQL(
                "(db_timestamp > %(from_ts)s OR NOT EXISTS ("
                "SELECT 1 FROM unnest(%(ex_pids)s::text[], %(ex_seqs)s::bigint[]) AS x(pid, seq) "
                "WHERE x.pid = persistence_id AND x.seq >= revision))"
            )
        )
        params["ex_pids"] = list(query.exclude.keys())
        params["ex_seqs"] = list(query.exclude.values())
    if query.horizon is not None:
        where.append(sql.SQL("db_timestamp < %(horizon)s"))
        params["horizon"] = query.horizon
    if query.behind_current_time is not None:
        where.append(sql.SQL("db_timestamp < transaction_timestamp() - %(behind)s::interval"))
        params["behind"] = query.behind_current_time
    statement = sql.SQL(
        "SELECT {columns}, transaction_timestamp() FROM {table} WHERE {where} "
        "ORDER BY db_timestamp, revision"
    ).format(
        columns=state_columns(with_payload=query.with_payload),
        table=tables.durable_state,
        where=sql.SQL(" AND ").join(where),
    )
    if query.limit is not None:
        statement = sql.Composed([statement, sql.SQL(" LIMIT %(limit)s")])
        params["limit"] = query.limit
    return statement, params

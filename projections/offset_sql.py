"""The offset store's statements, built from `ProjectionTables`; they run nothing.

Loading, saving and cleaning offset rows per slice. Each builder returns a
`Statement` (the SQL and its parameters); the async and the sync executors in
`offset_dao.py` (and any future driver) only execute them. Saving inserts a
multi-row VALUES with native `$n` placeholders, one statement text per batch
size kept in an LRU cache: psycopg's array dumpers cost ~3x more per batch.
Event rows are inserted without `ON CONFLICT`: a row already stored means
another instance handled that event, and the transaction must fail rather
than apply it twice (see `projections/fencing.py`). With a `Fence`, the
lease check comes first in the same transaction.
Cleanup works slice by slice and always keeps each slice's latest row, so any
future slice range can resume: a row goes only when it is older than *its
own slice's* latest row minus the window (never the range's latest: a quiet
slice keeps its rows however far its neighbours move on), and, with
`delete_after_consumed`, only once it was consumed that long ago.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
from cachetools import LRUCache
from psycopg import sql

from journal.slices import SliceRange
from journal.tables import rendered
from projections.fencing import Fence
from projections.offset_store import PROGRESS_PID, PROGRESS_SEQ_NR, START_SEQ_NR, Record
from projections.tables import ProjectionTables

_CACHED_BATCH_SIZES = 64  # statement texts kept, most recently used first
_MAX_ROWS_PER_INSERT = 4096  # 4 parameters a row; PostgreSQL allows 65535 per statement


@attrs.frozen
class Statement:
    """One statement to run; `raw` ones use native `$n` placeholders (a raw cursor)."""

    query: str | sql.SQL | sql.Composed
    params: Any
    raw: bool = False
    # Rows it must write (the fenced insert: a fence that returned no row would
    # otherwise insert nothing and commit without an error).
    rows: int | None = None


class OffsetSql:
    """Builds the offset store's statements for one projection name; runs nothing.

    Both executors below (async and sync) run exactly these statements.
    """

    def __init__(self, tables: ProjectionTables, projection_name: str) -> None:
        self.name = projection_name
        t = tables.offset_store
        self._tables = tables
        self._table = t
        self._load = rendered(
            sql.SQL(
                "SELECT slice, persistence_id, seq_nr, timestamp_offset FROM {t} "
                "WHERE projection_name = %s AND slice BETWEEN %s AND %s"
            ).format(t=t)
        )
        self._delete_markers = rendered(
            sql.SQL(
                "DELETE FROM {t} WHERE projection_name = %(name)s "
                "AND slice = ANY(%(slices)s::int[]) "
                "AND persistence_id = %(pid)s AND seq_nr = %(seq)s"
            ).format(t=t)
        )
        self._cleanup = rendered(
            sql.SQL(
                "DELETE FROM {t} AS o USING ("
                "  SELECT slice, max(timestamp_offset) AS latest FROM {t} "
                "  WHERE projection_name = %(name)s AND slice BETWEEN %(lo)s AND %(hi)s "
                "  GROUP BY slice) AS l "
                "WHERE o.projection_name = %(name)s AND o.slice = l.slice "
                "AND o.timestamp_offset < l.latest - %(window)s::interval "
                "AND (%(consumed)s::interval IS NULL "
                "     OR o.timestamp_consumed < transaction_timestamp() - %(consumed)s::interval)"
            ).format(t=t)
        )
        self._stored = rendered(
            sql.SQL(
                "SELECT slice, persistence_id, seq_nr, timestamp_offset FROM {t} "
                "WHERE projection_name = %s AND slice = %s AND persistence_id = %s "
                "ORDER BY timestamp_offset DESC, seq_nr DESC LIMIT 1"
            ).format(t=t)
        )
        # The head of both inserts of offset rows (`_value_rows` gives their values).
        self._insert_into = sql.SQL(
            "INSERT INTO {t} (projection_name, projection_key, slice, persistence_id, "
            "seq_nr, timestamp_offset, timestamp_consumed)"
        ).format(t=t)
        self._values_by_size: LRUCache[int, str] = LRUCache(_CACHED_BATCH_SIZES)
        self._fenced_by_size: LRUCache[int, str] = LRUCache(_CACHED_BATCH_SIZES)
        self._clear = rendered(
            sql.SQL(
                "DELETE FROM {t} WHERE projection_name = %s AND slice BETWEEN %s AND %s"
            ).format(t=t)
        )

    def load(self, slices: SliceRange) -> Statement:
        return Statement(self._load, (self.name, slices.min_slice, slices.max_slice))

    def save(
        self, key: str, records: Sequence[Record], fence: Fence | None = None
    ) -> list[Statement]:
        """Insert event records and progress markers (replacing older markers of those slices),
        after the lease check of `fence` if the instance runs under one."""
        if not records:
            return []
        marker_slices = [r.slice for r in records if r.is_progress]
        if fence is not None and not marker_slices and len(records) <= _MAX_ROWS_PER_INSERT:
            return [self._fenced_insert(key, records, fence)]
        out = [] if fence is None else [Statement(*fence.statement(self._tables))]
        if marker_slices:
            params = {
                "name": self.name,
                "slices": marker_slices,
                "pid": PROGRESS_PID,
                "seq": PROGRESS_SEQ_NR,
            }
            out.append(Statement(self._delete_markers, params))
        return out + self._insert_values(key, records)

    def _fenced_insert(self, key: str, records: Sequence[Record], fence: Fence) -> Statement:
        """The lease check and the event rows in one statement: a fenced transaction waits
        for the server after every statement (see `projections/fencing.py`), so one
        statement fewer is one wait fewer per batch. The fence runs first, once (a
        materialized CTE every row is joined with), and raises as on its own."""
        n = len(records)
        statement = self._fenced_by_size.get(n)
        if statement is None:
            first = 4 * n + 3  # after the name, the key and 4 values a row
            statement = rendered(
                sql.SQL(
                    "WITH fence AS MATERIALIZED (SELECT {fence}(${a}::varchar, ${b}::int, "
                    "${c}::int, ${d}::varchar, ${e}::bigint, ${f}::bigint)) "
                    "{insert} SELECT v.* FROM (VALUES {rows}) AS v CROSS JOIN fence"
                ).format(
                    fence=self._tables.lease_fence,
                    insert=self._insert_into,
                    rows=_value_rows(n, cast_key=True),
                    **{x: sql.SQL(str(first + i)) for i, x in enumerate("abcdef")},
                )
            )
            self._fenced_by_size[n] = statement
        params = self._row_params(key, records)
        params += fence.params()
        return Statement(statement, params, raw=True, rows=n)

    def _insert_values(self, key: str, records: Sequence[Record]) -> list[Statement]:
        # A multi-row VALUES with native $n placeholders, one statement text per
        # batch size: psycopg's array dumpers cost ~3x more per batch in Python.
        return [
            self._insert_chunk(key, records[start : start + _MAX_ROWS_PER_INSERT])
            for start in range(0, len(records), _MAX_ROWS_PER_INSERT)
        ]

    def _insert_chunk(self, key: str, records: Sequence[Record]) -> Statement:
        n = len(records)
        statement = self._values_by_size.get(n)
        if statement is None:
            statement = rendered(
                sql.SQL("{insert} VALUES {rows}").format(
                    insert=self._insert_into, rows=_value_rows(n, cast_key=False)
                )
            )
            self._values_by_size[n] = statement
        return Statement(statement, self._row_params(key, records), raw=True)

    def _row_params(self, key: str, records: Sequence[Record]) -> list[Any]:
        params: list[Any] = [self.name, key]
        for r in records:
            params += (r.slice, r.persistence_id, r.seq_nr, r.timestamp)
        return params

    def cleanup(
        self, slices: SliceRange, window: timedelta, consumed: timedelta | None = None
    ) -> Statement:
        """Delete rows older than each slice's latest minus the window (and, with
        `consumed`, stored longer ago than that)."""
        params = {"name": self.name, "lo": slices.min_slice, "hi": slices.max_slice}
        return Statement(self._cleanup, {**params, "window": window, "consumed": consumed})

    def stored(self, persistence_id: str, slice_: int) -> Statement:
        """The pid's newest row (by timestamp: a reset id's new lifetime wins)."""
        return Statement(self._stored, (self.name, slice_, persistence_id))

    def clear(self, slices: SliceRange) -> Statement:
        return Statement(self._clear, (self.name, slices.min_slice, slices.max_slice))

    def set_start(self, key: str, slices: SliceRange, timestamp: datetime) -> list[Statement]:
        """Replace the range's offsets by start markers: resume at `timestamp`, skip older."""
        markers = [Record(s, PROGRESS_PID, START_SEQ_NR, timestamp) for s in slices]
        return [self.clear(slices), *self._insert_values(key, markers)]


def records_of(rows: Sequence[Sequence[Any]]) -> list[Record]:
    return [Record(s, p, n, ts) for s, p, n, ts in rows]


def _value_rows(n: int, *, cast_key: bool) -> sql.Composable:
    """`n` offset rows of native placeholders: $1 the name, $2 the key, then 4 a row.
    In a plain VALUES list the target columns type them; `cast_key` types the name
    and key for a VALUES list that is read as a table (`_fenced_insert`)."""
    name, key = ("$1::varchar", "$2::varchar") if cast_key else ("$1", "$2")
    return sql.SQL(", ").join(
        sql.SQL(
            f"({name}, {key}, ${4 * i + 3}::int, ${4 * i + 4}::varchar, ${4 * i + 5}::bigint, "
            f"${4 * i + 6}::timestamptz, transaction_timestamp())"
        )
        for i in range(n)
    )

"""The offset store's SQL: loading, saving and cleaning offset rows per slice.

Saving happens on the caller's connection so exactly-once handlers commit
their writes and the offsets in one transaction. Cleanup works slice by slice
and always keeps each slice's latest row, so any future slice range can resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from cachetools import LRUCache
from psycopg import AsyncConnection, AsyncRawCursor, sql

from journal import SliceRange
from journal.tables import Tables
from projections.offset_store import PROGRESS_PID, PROGRESS_SEQ_NR, START_SEQ_NR, Record

_CACHED_BATCH_SIZES = 64  # statement texts kept, most recently used first
_MAX_ROWS_PER_INSERT = 4096  # 4 parameters a row; PostgreSQL allows 65535 per statement


class OffsetDao:
    """Executes offset store statements for one projection name."""

    def __init__(self, tables: Tables, projection_name: str) -> None:
        self.name = projection_name
        t = tables.offset_store
        self._tables = tables
        self._load = sql.SQL(
            "SELECT slice, persistence_id, seq_nr, timestamp_offset FROM {t} "
            "WHERE projection_name = %s AND slice BETWEEN %s AND %s"
        ).format(t=t)
        self._delete_markers = sql.SQL(
            "DELETE FROM {t} WHERE projection_name = %(name)s AND slice = ANY(%(slices)s::int[]) "
            "AND persistence_id = %(pid)s AND seq_nr = %(seq)s"
        ).format(t=t)
        self._cleanup = sql.SQL(
            "DELETE FROM {t} AS o USING ("
            "  SELECT slice, max(timestamp_offset) AS latest FROM {t} "
            "  WHERE projection_name = %(name)s AND slice BETWEEN %(lo)s AND %(hi)s "
            "  GROUP BY slice) AS l "
            "WHERE o.projection_name = %(name)s AND o.slice = l.slice "
            "AND o.timestamp_offset < l.latest - %(window)s::interval"
        ).format(t=t)
        self._values_by_size: LRUCache[int, sql.Composed] = LRUCache(_CACHED_BATCH_SIZES)
        self._clear = sql.SQL(
            "DELETE FROM {t} WHERE projection_name = %s AND slice BETWEEN %s AND %s"
        ).format(t=t)

    async def load(self, conn: AsyncConnection[Any], slices: SliceRange) -> list[Record]:
        cur = await conn.execute(self._load, (self.name, slices.min_slice, slices.max_slice))
        return [Record(s, p, n, ts) for s, p, n, ts in await cur.fetchall()]

    async def save(self, conn: AsyncConnection[Any], key: str, records: Sequence[Record]) -> None:
        """Insert event records and progress markers (replacing older markers of those slices)."""
        if not records:
            return
        marker_slices = [r.slice for r in records if r.is_progress]
        if marker_slices:
            await conn.execute(
                self._delete_markers,
                {
                    "name": self.name,
                    "slices": marker_slices,
                    "pid": PROGRESS_PID,
                    "seq": PROGRESS_SEQ_NR,
                },
            )
        await self._insert_values(conn, key, records)

    async def _insert_values(
        self, conn: AsyncConnection[Any], key: str, records: Sequence[Record]
    ) -> None:
        # A multi-row VALUES with native $n placeholders, one statement text per
        # batch size: psycopg's array dumpers cost ~3x more per batch in Python.
        for start in range(0, len(records), _MAX_ROWS_PER_INSERT):
            await self._insert_chunk(conn, key, records[start : start + _MAX_ROWS_PER_INSERT])

    async def _insert_chunk(
        self, conn: AsyncConnection[Any], key: str, records: Sequence[Record]
    ) -> None:
        n = len(records)
        statement = self._values_by_size.get(n)
        if statement is None:
            rows = sql.SQL(", ").join(
                sql.SQL(
                    f"($1, $2, ${4 * i + 3}::int, ${4 * i + 4}, ${4 * i + 5}::bigint, "
                    f"${4 * i + 6}::timestamptz, transaction_timestamp())"
                )
                for i in range(n)
            )
            statement = sql.SQL(
                "INSERT INTO {t} (projection_name, projection_key, slice, persistence_id, "
                "seq_nr, timestamp_offset, timestamp_consumed) VALUES {rows} "
                "ON CONFLICT DO NOTHING"
            ).format(t=self._tables.offset_store, rows=rows)
            self._values_by_size[n] = statement
        params: list[Any] = [self.name, key]
        for r in records:
            params += (r.slice, r.persistence_id, r.seq_nr, r.timestamp)
        await AsyncRawCursor(conn).execute(statement, params)

    async def cleanup(
        self, conn: AsyncConnection[Any], slices: SliceRange, window: timedelta
    ) -> int:
        """Delete rows older than each slice's latest minus the window; returns the count."""
        cur = await conn.execute(
            self._cleanup,
            {"name": self.name, "lo": slices.min_slice, "hi": slices.max_slice, "window": window},
        )
        return cur.rowcount

    async def clear(self, conn: AsyncConnection[Any], slices: SliceRange) -> None:
        await conn.execute(self._clear, (self.name, slices.min_slice, slices.max_slice))

    async def set_start(
        self, conn: AsyncConnection[Any], key: str, slices: SliceRange, timestamp: datetime
    ) -> None:
        """Replace the range's offsets by start markers: resume at `timestamp`, skip older."""
        await self.clear(conn, slices)
        await self._insert_values(
            conn, key, [Record(s, PROGRESS_PID, START_SEQ_NR, timestamp) for s in slices]
        )

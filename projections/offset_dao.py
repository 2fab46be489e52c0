"""The offset store's SQL: loading, saving and cleaning offset rows per slice.

Saving happens on the caller's connection so exactly-once handlers commit
their writes and the offsets in one transaction. Cleanup works slice by slice
and always keeps each slice's latest row, so any future slice range can resume.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg import AsyncConnection, sql

from journal import SliceRange
from journal.tables import Tables
from projections.offset_store import PROGRESS_PID, PROGRESS_SEQ_NR, START_SEQ_NR, Record


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
        self._insert = sql.SQL(
            "INSERT INTO {t} (projection_name, projection_key, slice, persistence_id, seq_nr, "
            "timestamp_offset, timestamp_consumed) "
            "SELECT %(name)s, %(key)s, r.slice, r.pid, r.seq_nr, r.ts, transaction_timestamp() "
            "FROM unnest(%(slices)s::int[], %(pids)s::text[], %(seqs)s::bigint[], "
            "%(tss)s::timestamptz[]) AS r(slice, pid, seq_nr, ts) "
            "ON CONFLICT DO NOTHING"
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
        marker_slices = [r.slice for r in records if r.is_marker and r.seq_nr == PROGRESS_SEQ_NR]
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
        await conn.execute(self._insert, self._rows(key, records))

    def _rows(self, key: str, records: Iterable[Record]) -> dict[str, Any]:
        rs = list(records)
        return {
            "name": self.name,
            "key": key,
            "slices": [r.slice for r in rs],
            "pids": [r.persistence_id for r in rs],
            "seqs": [r.seq_nr for r in rs],
            "tss": [r.timestamp for r in rs],
        }

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
        await conn.execute(
            self._insert,
            self._rows(
                key,
                (Record(s, PROGRESS_PID, START_SEQ_NR, timestamp) for s in slices),
            ),
        )

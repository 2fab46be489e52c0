# Generated from journal/aio/snapshots.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The sync driver of snapshots: save, load and delete one id's snapshot row.

The statements and the row decoding live in `journal/snapshots.py`.
"""

from __future__ import annotations

from typing import Any

from psycopg import Connection
from psycopg_pool import ConnectionPool

from journal.model import Snapshot
from journal.serialization import SerializerRegistry
from journal.slices import validate_persistence_id
from journal.snapshots import SnapshotSql, row_to_snapshot, snapshot_params
from journal.tables import Tables


class SnapshotStore:
    """Saves, loads and deletes the snapshot row of a persistence id."""

    def __init__(
        self, pool: ConnectionPool[Any], tables: Tables, registry: SerializerRegistry
    ) -> None:
        self._pool = pool
        self._registry = registry
        self._sql = SnapshotSql.of(tables)

    def save(
        self,
        persistence_id: str,
        seq_nr: int,
        state: Any,
        *,
        tags: tuple[str, ...] = (),
        metadata: Any = None,
        conn: Connection[Any] | None = None,
    ) -> None:
        """Store `state` as of `seq_nr`; an older snapshot never overwrites a newer one."""
        params = snapshot_params(self._registry, persistence_id, seq_nr, state, tags, metadata)
        if conn is not None:
            conn.execute(self._sql.upsert, params)
        else:
            with self._pool.connection() as own:
                own.execute(self._sql.upsert, params)

    def load(self, persistence_id: str) -> Snapshot | None:
        """The latest snapshot of the id, or None."""
        pid = validate_persistence_id(persistence_id)
        with self._pool.connection() as conn:
            cur = conn.execute(self._sql.select, (pid,))
            row = cur.fetchone()
        return None if row is None else row_to_snapshot(self._registry, pid, row)

    def delete(self, persistence_id: str) -> None:
        """Remove the id's snapshot (if any)."""
        pid = validate_persistence_id(persistence_id)
        with self._pool.connection() as conn:
            conn.execute(self._sql.delete, (pid,))

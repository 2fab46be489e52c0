# Generated from journal/aio/erasure.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The sync driver of `delete_all`: the tombstone, then bounded batches, on a pool.

What is written and deleted, and why in this order, is `journal/erasure.py`;
this module only executes it, each step in a short transaction of its own,
and records the tombstone for the post-commit notification so live slice
queries deliver it promptly. The sync twin is generated from this module.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from journal.erasure import Erasure, ErasureSql
from journal.sync.notifications import Notifier
from journal.tables import Tables

# Appends racing the tombstone for the same seq_nr: try again this many times.
_TOMBSTONE_ATTEMPTS = 5


class Eraser:
    """Executes erasures against one journal and snapshot table."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        tables: Tables,
        writer_id: str,
        notifier: Notifier | None,
    ) -> None:
        self._pool = pool
        self._writer_id = writer_id
        self._notifier = notifier
        self._sql = ErasureSql.of(tables)

    def delete_all(self, erasure: Erasure) -> int:
        """Erase the id; returns how many rows this call removed (the tombstone stays).

        Rows another deleter removed meanwhile are not counted: they are gone,
        but not by this call. The loop ends only when nothing of the id is left
        in the erased range (`ErasureSql.remains_statement`), not on a short
        batch, which a concurrent deleter can cause."""
        tombstone = self._write_tombstone(erasure)
        if tombstone is None:
            return 0  # no events at all (the snapshot, if any, is gone)
        removed = 0
        while True:
            statement, params = self._sql.batch_statement(erasure, tombstone)
            with self._pool.connection() as conn, conn.transaction():
                cur = conn.execute(statement, params)
                batch = int(cur.rowcount)
            removed += batch
            if batch < erasure.batch_size and not self._remains(erasure, tombstone):
                return removed

    def _remains(self, erasure: Erasure, tombstone: int) -> bool:
        statement, params = self._sql.remains_statement(erasure, tombstone)
        with self._pool.connection() as conn:
            cur = conn.execute(statement, params)
            row = cur.fetchone()
        return bool(row and row[0])

    def _write_tombstone(self, erasure: Erasure) -> int | None:
        """The tombstone and the snapshot's deletion in one transaction; its seq_nr."""
        statement, params = self._sql.tombstone_statement(erasure, self._writer_id)
        for attempt in range(1, _TOMBSTONE_ATTEMPTS + 1):
            try:
                with self._pool.connection() as conn, conn.transaction():
                    conn.execute(self._sql.delete_snapshot, (erasure.persistence_id,))
                    cur = conn.execute(statement, params)
                    row = cur.fetchone()
            except psycopg.errors.UniqueViolation:
                if attempt == _TOMBSTONE_ATTEMPTS:
                    raise
                continue  # an append took that seq_nr first: the next one
            if row is None:
                return None
            if self._notifier is not None:
                self._notifier.changed(erasure.entity_type, erasure.slice)
            return int(row[0])
        raise AssertionError("unreachable")  # pragma: no cover

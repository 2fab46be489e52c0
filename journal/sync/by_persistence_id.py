# Generated from journal/aio/by_persistence_id.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The sync driver of the reads by persistence id, and of the list of ids.

These are simple keyset-paged reads; the live variant polls after it has
caught up and is woken early by the same notifications the slice query uses.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from psycopg_pool import ConnectionPool

from journal.connection import driver_errors
from journal.model import EventEnvelope
from journal.query import sql as q
from journal.rows import row_to_envelope
from journal.serialization import SerializerRegistry
from journal.slices import entity_type_of, slice_for, validate_entity_type
from journal.sync.flavour import sleep
from journal.sync.notifications import NotificationListener, wait_for_wakeup
from journal.tables import Tables


class PersistenceIdQueries:
    """Events by persistence id (current and live) and the list of ids."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        tables: Tables,
        registry: SerializerRegistry,
        page_size: int,
        refresh_interval: float,
        listener: NotificationListener | None,
    ) -> None:
        self._pool = pool
        self._tables = tables
        self._registry = registry
        self._page_size = page_size
        self._refresh = refresh_interval
        self._listener = listener
        self._by_pid, _ = q.by_persistence_id(tables)

    def _page(self, pid: str, from_seq: int, to_seq: int) -> list[EventEnvelope]:
        with self._pool.connection() as conn:
            cur = conn.execute(
                self._by_pid,
                {"pid": pid, "from_seq": from_seq, "to_seq": to_seq, "limit": self._page_size},
            )
            rows = cur.fetchall()
        return [row_to_envelope(r, self._registry, source="persistence_id") for r in rows]

    def current(self, pid: str, from_seq: int, to_seq: int) -> Generator[EventEnvelope, None, None]:
        """Stored events of `pid` with from_seq <= seq_nr <= to_seq, in order, then end."""
        with driver_errors():
            while from_seq <= to_seq:
                page = self._page(pid, from_seq, to_seq)
                for env in page:
                    yield env
                if len(page) < self._page_size:
                    return
                from_seq = page[-1].seq_nr + 1

    def live(self, pid: str, from_seq: int, to_seq: int) -> Generator[EventEnvelope, None, None]:
        """Like `current`, but keeps waiting for new events until `to_seq` is reached."""
        with driver_errors():
            sub = None
            if self._listener is not None:
                slice_ = slice_for(pid)
                sub = self._listener.subscribe(entity_type_of(pid), slice_, slice_)
            try:
                while from_seq <= to_seq:
                    page = self._page(pid, from_seq, to_seq)
                    for env in page:
                        yield env
                    if page:
                        from_seq = page[-1].seq_nr + 1
                    if len(page) < self._page_size:
                        if sub is None:
                            sleep(self._refresh)
                        else:
                            wait_for_wakeup(sub.event, self._refresh)
            finally:
                if sub is not None and self._listener is not None:
                    self._listener.unsubscribe(sub)

    def persistence_ids(self, entity_type: str | None) -> Generator[str, None, None]:
        """Every persistence id (of one entity type, if given), in order, page by page."""
        with driver_errors():
            if entity_type is not None:
                validate_entity_type(entity_type)
            statement = q.persistence_ids(self._tables, by_entity_type=entity_type is not None)
            after = ""
            while True:
                with self._pool.connection() as conn:
                    cur = conn.execute(
                        statement,
                        {"after": after, "entity_type": entity_type, "limit": self._page_size},
                    )
                    rows = cur.fetchall()
                for (pid,) in rows:
                    yield pid
                if len(rows) < self._page_size:
                    return
                after = rows[-1][0]

# Generated from journal/aio/slice_reader.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The sync driver of the slice query: executes `BySliceQuery`'s requests.

The one I/O seam of the slice query: its requests (horizon reading, bucket
counts, rows, database time, waits) are answered here and nowhere else, by
this module and its generated sync twin.

Everything that needs a judgement lives in `by_slice.py`; this module only
runs SQL, sleeps, and listens for wake-ups. LIMIT results of at most
`buffer_size` rows are fetched whole and the connection is returned before any
envelope is yielded; everything else (catch-up chunks, a current query's last
statement, a live query's larger LIMIT over a burst) is streamed (`row_stream`),
`buffer_size` rows at a time, on a connection of the read pool, which handlers
never draw from, so a slow consumer cannot starve them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator
from datetime import datetime
from typing import Any, TypeVar

from psycopg_pool import ConnectionPool, PoolTimeout

from journal.connection import driver_errors
from journal.errors import ProtocolError
from journal.filter import EventFilter
from journal.model import TimestampOffset
from journal.query import sql as q
from journal.query.by_slice import (
    BucketsQuery,
    BySliceQuery,
    Done,
    HeartbeatDue,
    HorizonQuery,
    RowsQuery,
    Wait,
    warn_if_unfinished,
)
from journal.query.horizon import READER_APPLICATION, BlindWarning, horizon_from_row
from journal.query.source import RowSource, Statement
from journal.serialization import SerializerRegistry
from journal.settings import QuerySettings
from journal.sync import row_stream
from journal.sync.flavour import sleep
from journal.sync.notifications import NotificationListener, Subscription, wait_for_wakeup
from journal.sync.row_stream import Started, chunks, start
from journal.tables import Tables

E = TypeVar("E")


class SliceReader:
    """Runs slice queries for one journal (shared by all its streams)."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        tables: Tables,
        registry: SerializerRegistry,
        settings: QuerySettings,
        listener: NotificationListener | None,
    ) -> None:
        self._pool = pool
        self._tables = tables
        self._registry = registry
        self._settings = settings
        self._listener = listener
        self._blind = BlindWarning()

    def database_time(self) -> datetime:
        with self._pool.connection() as conn:
            cur = conn.execute(q.database_time())
            value: datetime = (_one(cur))[0]
        return value

    def stream(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None,
        *,
        source: RowSource[E],
        live: bool,
        heartbeats: bool = False,
        settings: QuerySettings | None = None,
        event_filter: EventFilter | None = None,
        filtered_envelopes: bool = False,
    ) -> Generator[E, None, None]:
        """Yield envelopes of the range as decided by a fresh `BySliceQuery`, reading
        `source`'s rows (`journal.query.source`: events, durable state changes).

        With `event_filter`, the rows it leaves out are read as keys only; they
        advance the query like any row and are yielded (as `FILTERED` envelopes)
        only with `filtered_envelopes`."""
        parts = self.stream_parts(
            entity_type, min_slice, max_slice, offset, source=source, live=live,
            heartbeats=heartbeats, settings=settings, event_filter=event_filter,
            filtered_envelopes=filtered_envelopes,
        )  # fmt: skip
        with contextlib.closing(parts):
            for part in parts:
                for envelope in part:
                    yield envelope

    def stream_parts(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None,
        *,
        source: RowSource[E],
        live: bool,
        heartbeats: bool = False,
        settings: QuerySettings | None = None,
        event_filter: EventFilter | None = None,
        filtered_envelopes: bool = False,
    ) -> Generator[list[E], None, None]:
        """`stream`'s envelopes a part at a time (at most `PART` rows' worth; a heartbeat
        alone), in order: for a consumer that takes them in batches — a projection's
        pump — one step of this generator per part instead of one per envelope."""
        with driver_errors():
            settings = settings or self._settings
            end = None if live else self.database_time()
            machine = BySliceQuery(
                settings, offset, live=live, end=end, heartbeats=heartbeats, now=time.monotonic()
            )
            sub = None
            if live and settings.notifications and self._listener is not None:
                sub = self._listener.subscribe(entity_type, min_slice, max_slice)
            # Read ahead: a stream that is not live starts its next chunk's statement
            # while it decodes this one's rows (`_Ahead`).
            read_ahead = row_stream.STREAMING and not live
            ahead: _Ahead | None = None

            def rows_statement(query: RowsQuery) -> Statement:
                return source.rows(
                    self._tables, entity_type, min_slice, max_slice, query, event_filter
                )

            try:
                while True:
                    request = machine.next_request(time.monotonic())
                    if isinstance(request, Done):
                        return
                    if isinstance(request, Wait):
                        self._wait(machine, request, sub)
                    elif isinstance(request, HeartbeatDue):
                        db_now = self.database_time()
                        hb = machine.on_heartbeat(db_now, time.monotonic())
                        yield [source.heartbeat(entity_type, min_slice, hb)]
                    elif isinstance(request, HorizonQuery):
                        statement, params = source.horizon(self._tables, READER_APPLICATION)
                        with self._pool.connection() as conn:
                            cur = conn.execute(statement, params)
                            reading = horizon_from_row(_one(cur))
                        self._blind.note(reading)
                        machine.on_horizon(reading)
                    elif isinstance(request, BucketsQuery):
                        statement, params = source.buckets(
                            self._tables,
                            entity_type,
                            min_slice,
                            max_slice,
                            request,
                            settings.behind_current_time,
                        )
                        with self._pool.connection() as conn:
                            cur = conn.execute(statement, params)
                            machine.on_buckets(cur.fetchall())
                    else:
                        kind = "backtracking" if request.backtracking else "query"
                        registry = self._registry
                        if ahead is not None and ahead.query == request:
                            batches = ahead.rows()
                        else:
                            if ahead is not None:
                                ahead.close()
                            statement, params = rows_statement(request)
                            batches = self._batches(statement, params, request, settings)
                        ahead = None
                        look_ahead = read_ahead
                        skip = event_filter is not None and not filtered_envelopes
                        with contextlib.closing(batches):
                            for batch in batches:
                                if look_ahead:  # this chunk's rows are sorted: start the next
                                    look_ahead = False
                                    ahead = self._read_ahead(machine, rows_statement, settings)
                                for part in _parts(batch):
                                    emitted = machine.on_rows(part, time.monotonic())
                                    envelopes = list(
                                        source.decode(
                                            emitted, registry, source=kind, skip_filtered=skip
                                        )
                                    )
                                    if envelopes:
                                        yield envelopes
                        machine.on_rows_done(time.monotonic())
            finally:
                if ahead is not None:
                    ahead.close()
                warn_if_unfinished(machine, entity_type, min_slice)
                if sub is not None and self._listener is not None:
                    self._listener.unsubscribe(sub)

    def _batches(
        self, statement: Any, params: dict[str, Any], request: RowsQuery, settings: QuerySettings
    ) -> Generator[list[Any], None, None]:
        if request.limit is not None and request.limit <= settings.buffer_size:
            with self._pool.connection() as conn:
                cur = conn.execute(statement, params, binary=True)
                rows = cur.fetchall()
            yield rows
            return
        with self._pool.connection() as conn:
            rows = chunks(conn, statement, params, settings.buffer_size)
            with contextlib.closing(rows):
                for batch in rows:
                    yield batch

    def _read_ahead(
        self,
        machine: BySliceQuery,
        rows_statement: Callable[[RowsQuery], Statement],
        settings: QuerySettings,
    ) -> _Ahead | None:
        """The chunk after the one being read, started (`_Ahead`) if the machine knows it
        and the read pool has a connection to spare."""
        following = machine.next_chunk_if_whole(time.monotonic())
        if following is None:
            return None
        statement, params = rows_statement(following)
        return _Ahead.start(self._pool, following, statement, params, settings)

    def _wait(self, machine: BySliceQuery, request: Wait, sub: Subscription | None) -> None:
        timeout = max(0.0, request.until - time.monotonic())
        if sub is None:
            sleep(timeout)
            return
        if wait_for_wakeup(sub.event, timeout):
            machine.on_notification(time.monotonic())


class _Ahead:
    """A chunk's statement started before the stream asks for it, on a connection of
    its own, so the server finds and sorts its rows while the client decodes the chunk
    before: its `rows` if the stream asks for an equal `query`, else `close`d unread.

    On 2 cores the two overlap only partly (200k events: 3.55 against 3.08 µs each,
    streamed chunks with the decoding, sequential against ahead). A stream holds at
    most two connections of the read pool so, and takes the second only when the
    pool keeps room for one more request after it and nobody waits (`_room_to_spare`):
    the read pool also serves queries by persistence id, horizon readings and counts,
    which a stream reading ahead must never starve. It waits `AHEAD_WAIT` at most;
    when none is free but the pool may grow, that wait fails (the pool's stats count
    it among `requests_errors`) and the pool opens one for the next chunk.
    """

    __slots__ = ("_conn", "_pool", "_started", "query")

    def __init__(
        self, pool: ConnectionPool[Any], conn: Any, query: RowsQuery, started: Started
    ) -> None:
        self._pool = pool
        self._conn: Any = conn
        self._started = started
        self.query = query

    @classmethod
    def start(
        cls,
        pool: ConnectionPool[Any],
        query: RowsQuery,
        statement: Any,
        params: dict[str, Any],
        settings: QuerySettings,
    ) -> _Ahead | None:
        if not _room_to_spare(pool):
            return None
        try:
            conn = pool.getconn(AHEAD_WAIT)
        except PoolTimeout:  # none free: the pool opens one meanwhile, for the next chunk
            return None
        try:
            started = start(conn, statement, params, settings.buffer_size)
        except BaseException:
            pool.putconn(conn)
            raise
        return cls(pool, conn, query, started)

    def rows(self) -> Generator[list[Any], None, None]:
        """The chunk's rows (as `row_stream.chunks`); the connection goes back at the end."""
        try:
            batches = self._started.chunks()
            with contextlib.closing(batches):
                for batch in batches:
                    yield batch
        finally:
            self.close()

    def close(self) -> None:
        """Leave the statement (cancelled if it still runs) and return the connection."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            self._started.close()
        finally:
            self._pool.putconn(conn)


def _room_to_spare(pool: ConnectionPool[Any]) -> bool:
    """Whether, after one more connection is taken, the pool still has one free or may
    open one, and no request waits for a connection."""
    stats = pool.get_stats()
    if stats.get("requests_waiting", 0):
        return False
    room = stats.get("pool_available", 0) + pool.max_size - stats.get("pool_size", 0)
    return int(room) >= 2


# How long a stream waits for a second connection to read ahead with: a free one is
# taken at once; none free, and the stream reads without (the pool may grow meanwhile).
AHEAD_WAIT = 0.001


def _parts(batch: list[Any]) -> list[list[Any]]:
    """A fetched batch in parts of at most `PART` rows, each emitted and decoded in turn."""
    if len(batch) <= PART:
        return [batch]
    return [batch[i : i + PART] for i in range(0, len(batch), PART)]


# Rows emitted and decoded at a time: a part's envelopes and offsets are alive
# together (`stream_parts` yields them as a list; about six objects per row);
# with fewer than the garbage collector's first threshold (700) alive, they die
# young instead of being promoted and traversed again by older collections
# (about 0.5 us an event).
PART = 50


def _one(cur: Any) -> Any:
    """The single row of a statement that always returns one."""
    row = cur.fetchone()
    if row is None:  # pragma: no cover - an aggregate or a function call returns a row
        raise ProtocolError("the database returned no row")
    return row

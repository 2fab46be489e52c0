"""`SyncJournal`: the journal for code without an event loop.

Django and Flask views, batch scripts and Spark executors call the journal
synchronously. This driver is hand-written and thin: every statement comes
from the same builders the async driver uses (`WriterSql`, `SnapshotSql`,
`journal.query.sql`), arguments are validated by the same functions, and the
slice query is the same sans-I/O `BySliceQuery`, driven here with
`time.monotonic` and `time.sleep`. Generating this module from the async one
(as psycopg does) would pay off once it is as large as the async driver; at a
few hundred lines of plain calls, a reader is better served by seeing it.

The live slice query polls; it does not LISTEN (polling alone is correct, and
a blocking iterator has no loop to wake). Appends still send the NOTIFY hint
after commit, so async streams in other processes react at once.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Generator, Iterator, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import Connection

from journal.connection import SyncJournalPool, connect_sync, ensure_schema_sync
from journal.dsn import database
from journal.errors import ConcurrencyError, InvalidArgument, ProtocolError
from journal.model import EventEnvelope, Snapshot, TimestampOffset, heartbeat_envelope
from journal.notifications import bucket_bit, encode_payload
from journal.query import sql as q
from journal.query.by_persistence_id import check_seq_range
from journal.query.by_slice import (
    BucketsQuery,
    BySliceQuery,
    Done,
    HeartbeatDue,
    HorizonQuery,
    RowsQuery,
    Wait,
    check_slice_query,
    warn_if_unfinished,
)
from journal.query.horizon import READER_APPLICATION, BlindWarning, horizon_from_row
from journal.rows import row_to_envelope
from journal.schema import apply_schema_sync
from journal.serialization import SerializerRegistry
from journal.settings import JournalSettings, QuerySettings
from journal.slices import validate_entity_type, validate_persistence_id
from journal.snapshots import SnapshotSql, row_to_snapshot, snapshot_params
from journal.tables import Tables
from journal.writer import (
    PreparedAppend,
    WriterSql,
    appended_envelopes,
    opens_caller_transaction,
    prepare_append,
    stored_timestamp,
)

_cursor_ids = itertools.count()
_NOTIFY = "SELECT pg_notify(%s, %s)"


class SyncJournal:
    """The journal's synchronous driver: the same methods as `Journal`, blocking."""

    def __init__(self, dsn: str, settings: JournalSettings, registry: SerializerRegistry) -> None:
        self.dsn = dsn
        self.settings = settings
        self.serializers = registry
        self.tables = Tables(settings)
        self.pool = SyncJournalPool(dsn, settings, "slicejournal-sync")
        # Slice streams hold a connection while a chunk is consumed: their own pool.
        self.read_pool = SyncJournalPool(
            dsn, settings, "slicejournal-sync-read", application_name=READER_APPLICATION
        )
        self._writer = WriterSql.of(self.tables)
        self._blind = BlindWarning()
        self._snapshots = SnapshotSql.of(self.tables)

    # -- lifecycle --------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def connect(
        cls,
        dsn: str | None = None,
        settings: JournalSettings | None = None,
        serializers: SerializerRegistry | None = None,
        *,
        create_schema: bool | None = None,
        check_schema: bool = True,
    ) -> Iterator[SyncJournal]:
        """Open a journal; with no DSN (argument or `SLICEJOURNAL_DSN`), the embedded server.

        `create_schema` defaults to True for the embedded server and False for
        a configured database (run `slicejournal init` there).
        """
        settings = settings or JournalSettings()
        with database(dsn) as (resolved, is_default):
            if create_schema is None:
                create_schema = is_default
            journal = cls(resolved, settings, serializers or SerializerRegistry())
            journal.open(create_schema=create_schema, check_schema=check_schema)
            try:
                yield journal
            finally:
                journal.close()

    def open(self, *, create_schema: bool = False, check_schema: bool = True) -> None:
        """Connect once, apply or check the schema, then open the pools (typed errors)."""
        with connect_sync(self.dsn, connect_timeout=self.settings.connect_timeout_seconds) as conn:
            if create_schema:
                apply_schema_sync(conn, self.settings)
            elif check_schema:
                ensure_schema_sync(conn, self.tables)
        pools = (self.pool, self.read_pool)
        try:
            for pool in pools:
                pool.open_checked()
        except BaseException:
            for pool in pools:
                pool.close()
            raise

    def close(self) -> None:
        """Close the pools."""
        self.read_pool.close()
        self.pool.close()

    def create_schema(self) -> None:
        """Apply the DDL (idempotent)."""
        with self.pool.connection() as conn:
            apply_schema_sync(conn, self.settings)

    # -- write side -------------------------------------------------------

    def append(
        self,
        persistence_id: str,
        events: Sequence[Any],
        *,
        expected_seq_nr: int,
        tags: Sequence[str] = (),
        metadata: Any = None,
        conn: Connection[Any] | None = None,
    ) -> list[EventEnvelope]:
        """Append events as seq_nr `expected_seq_nr + 1 ..` in one transaction.

        Raises `ConcurrencyError` (and writes nothing) unless `expected_seq_nr`
        is the id's current highest seq_nr. With `conn`, the events are written
        in that connection's transaction (in a savepoint) and become visible
        when the caller commits.
        """
        batch = prepare_append(
            self.serializers, persistence_id, events, expected_seq_nr, tags, metadata
        )
        statement = self._writer.append_statement(batch, self.settings.writer_id)
        if conn is not None:
            if opens_caller_transaction(conn.autocommit, conn.info.transaction_status):
                conn.execute("SELECT 1")
            with conn.transaction():
                stored_at = self._insert(conn, statement)
                if stored_at is None:
                    raise psycopg.Rollback()
                self._notify(conn, batch)  # delivered only if the caller commits
            if stored_at is None:
                actual = self._highest(conn, batch.persistence_id)
                raise ConcurrencyError(batch.persistence_id, batch.expected_seq_nr, actual)
        else:
            with self.pool.connection() as own:
                stored_at = self._insert(own, statement)
                if stored_at is None:
                    actual = self._highest(own, batch.persistence_id)
                    raise ConcurrencyError(batch.persistence_id, batch.expected_seq_nr, actual)
                self._notify(own, batch)  # after the commit: the connection autocommits
        return appended_envelopes(batch, stored_at, self.settings.writer_id)

    def _insert(self, conn: Connection[Any], statement: tuple[str, Any]) -> datetime | None:
        try:
            with conn.cursor() as cur:
                cur.execute(*statement)
                return stored_timestamp(cur.fetchone())
        except psycopg.errors.UniqueViolation:
            return None

    def _notify(self, conn: Connection[Any], batch: PreparedAppend) -> None:
        if self.settings.notify:
            payload = encode_payload(batch.entity_type, bucket_bit(batch.slice))
            conn.execute(_NOTIFY, (self.tables.notify_channel, payload))

    def _highest(self, conn: Connection[Any], persistence_id: str) -> int:
        row = conn.execute(self._writer.highest, (persistence_id,)).fetchone()
        return int(row[0]) if row else 0

    def highest_seq_nr(self, persistence_id: str) -> int:
        """The highest seq_nr of the id (0 if it has none); deleted events still count."""
        pid = validate_persistence_id(persistence_id)
        with self.pool.connection() as conn:
            return self._highest(conn, pid)

    def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> int:
        """Delete events up to and including `to_seq_nr`; the sequence is never reused."""
        pid = validate_persistence_id(persistence_id)
        if isinstance(to_seq_nr, bool) or not isinstance(to_seq_nr, int) or to_seq_nr < 0:
            raise InvalidArgument(f"to_seq_nr must be an int >= 0, got {to_seq_nr!r}")
        with self.pool.connection() as conn, conn.transaction():
            target = min(to_seq_nr, self._highest(conn, pid))
            if target < 1:
                return 0
            conn.execute(self._writer.delete_before, (pid, target))
            conn.execute(self._writer.mark_deleted, (pid, target))
            return target

    def save_snapshot(
        self,
        persistence_id: str,
        seq_nr: int,
        state: Any,
        *,
        tags: Sequence[str] = (),
        metadata: Any = None,
        conn: Connection[Any] | None = None,
    ) -> None:
        """Store the id's state as of `seq_nr` (one row per id; older never overwrites newer)."""
        params = snapshot_params(
            self.serializers, persistence_id, seq_nr, state, tuple(tags), metadata
        )
        if conn is not None:
            conn.execute(self._snapshots.upsert, params)
            return
        with self.pool.connection() as own:
            own.execute(self._snapshots.upsert, params)

    def load_snapshot(self, persistence_id: str) -> Snapshot | None:
        """The id's latest snapshot, or None."""
        pid = validate_persistence_id(persistence_id)
        with self.pool.connection() as conn:
            row = conn.execute(self._snapshots.select, (pid,)).fetchone()
        return None if row is None else row_to_snapshot(self.serializers, pid, row)

    def delete_snapshot(self, persistence_id: str) -> None:
        """Remove the id's snapshot."""
        pid = validate_persistence_id(persistence_id)
        with self.pool.connection() as conn:
            conn.execute(self._snapshots.delete, (pid,))

    # -- queries by persistence id ----------------------------------------

    def _pid_page(self, pid: str, from_seq: int, to_seq: int) -> list[EventEnvelope]:
        params = {
            "pid": pid,
            "from_seq": from_seq,
            "to_seq": to_seq,
            "limit": self.settings.page_size,
        }
        with self.read_pool.connection() as conn:
            rows = conn.execute(q.by_persistence_id(self.tables), params).fetchall()
        return [row_to_envelope(r, self.serializers, source="persistence_id") for r in rows]

    def current_events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> Iterator[EventEnvelope]:
        """The id's stored events in seq_nr order (deleted ones skipped), then the end."""
        return self._by_pid(persistence_id, from_seq_nr, to_seq_nr, live=False)

    def events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> Iterator[EventEnvelope]:
        """Like `current_events_by_persistence_id`, then polls for new events (live)."""
        return self._by_pid(persistence_id, from_seq_nr, to_seq_nr, live=True)

    def _by_pid(
        self, persistence_id: str, from_seq_nr: int, to_seq_nr: int | None, *, live: bool
    ) -> Iterator[EventEnvelope]:
        pid = validate_persistence_id(persistence_id)  # now, not at the first next()
        lo, hi = check_seq_range(from_seq_nr, to_seq_nr)
        refresh = self.settings.query.refresh_interval.total_seconds()

        def pages() -> Iterator[EventEnvelope]:
            from_seq = lo
            while from_seq <= hi:
                page = self._pid_page(pid, from_seq, hi)
                yield from page
                if page:
                    from_seq = page[-1].seq_nr + 1
                if len(page) < self.settings.page_size:
                    if not live:
                        return
                    time.sleep(refresh)

        return pages()

    def current_persistence_ids(self, entity_type: str | None = None) -> Iterator[str]:
        """Every persistence id in the journal (optionally of one entity type), sorted."""
        if entity_type is not None:
            validate_entity_type(entity_type)
        statement = q.persistence_ids(self.tables, by_entity_type=entity_type is not None)
        limit = self.settings.page_size

        def ids() -> Iterator[str]:
            after = ""
            while True:
                params = {"after": after, "entity_type": entity_type, "limit": limit}
                with self.read_pool.connection() as conn:
                    rows = conn.execute(statement, params).fetchall()
                for (pid,) in rows:
                    yield pid
                if len(rows) < limit:
                    return
                after = rows[-1][0]

        return ids()

    # -- queries by slice ---------------------------------------------------

    def events_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None = None,
        *,
        heartbeats: bool = False,
        settings: QuerySettings | None = None,
    ) -> Generator[EventEnvelope, None, None]:
        """A blocking, never-ending stream of the range's events (see `Journal.events_by_slices`).

        Close it (`contextlib.closing`, or `.close()`) to release its connection.
        """
        check_slice_query(entity_type, min_slice, max_slice, offset)
        return self._stream(
            entity_type, min_slice, max_slice, offset, live=True, heartbeats=heartbeats,
            settings=settings,
        )  # fmt: skip

    def current_events_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None = None,
        *,
        settings: QuerySettings | None = None,
    ) -> Generator[EventEnvelope, None, None]:
        """The range's events up to the database time at the start, then the end."""
        check_slice_query(entity_type, min_slice, max_slice, offset)
        return self._stream(
            entity_type, min_slice, max_slice, offset, live=False, settings=settings
        )

    def _stream(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None,
        *,
        live: bool,
        heartbeats: bool = False,
        settings: QuerySettings | None = None,
    ) -> Generator[EventEnvelope, None, None]:
        settings = settings or self.settings.query
        end = None if live else self.database_time()
        machine = BySliceQuery(
            settings, offset, live=live, end=end, heartbeats=heartbeats, now=time.monotonic()
        )
        try:
            yield from self._drive(machine, entity_type, min_slice, max_slice, settings)
        finally:
            warn_if_unfinished(machine, entity_type, min_slice)

    def _drive(
        self,
        machine: BySliceQuery,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        settings: QuerySettings,
    ) -> Generator[EventEnvelope, None, None]:
        while True:
            request = machine.next_request(time.monotonic())
            if isinstance(request, Done):
                return
            if isinstance(request, Wait):
                time.sleep(max(0.0, request.until - time.monotonic()))
            elif isinstance(request, HeartbeatDue):
                hb = machine.on_heartbeat(self.database_time(), time.monotonic())
                yield heartbeat_envelope(entity_type, min_slice, hb)
            elif isinstance(request, HorizonQuery):
                statement, params = q.horizon(self.tables, READER_APPLICATION)
                with self.read_pool.connection() as conn:
                    row = conn.execute(statement, params).fetchone()
                if row is None:  # pragma: no cover - an aggregate returns a row
                    raise ProtocolError("the horizon query returned no row")
                reading = horizon_from_row(row)
                self._blind.note(reading)
                machine.on_horizon(reading)
            elif isinstance(request, BucketsQuery):
                statement, params = q.slice_buckets(
                    self.tables, entity_type, min_slice, max_slice, request,
                    settings.behind_current_time,
                )  # fmt: skip
                with self.read_pool.connection() as conn:
                    machine.on_buckets(conn.execute(statement, params).fetchall())
            else:
                source = "backtracking" if request.backtracking else "query"
                for batch in self._batches(entity_type, min_slice, max_slice, request, settings):
                    now = time.monotonic()
                    for row in batch:
                        offset_ = machine.on_row(row, row[-1], now)
                        if offset_ is not None:
                            yield row_to_envelope(
                                row, self.serializers, source=source, offset=offset_
                            )
                machine.on_rows_done(time.monotonic())

    def _batches(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        request: RowsQuery,
        settings: QuerySettings,
    ) -> Iterator[list[Any]]:
        statement, params = q.slice_rows(self.tables, entity_type, min_slice, max_slice, request)
        if request.limit is not None:
            with self.read_pool.connection() as conn:
                rows = conn.execute(statement, params).fetchall()
            yield rows
            return
        with (
            self.read_pool.connection() as conn,
            conn.transaction(),
            conn.cursor(name=f"slicejournal_sync_chunk_{next(_cursor_ids)}") as cur,
        ):
            cur.execute(statement, params)
            while rows := cur.fetchmany(settings.buffer_size):
                yield rows

    def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope | None:
        """One event with its payload (e.g. for a backtracking envelope), or None."""
        pid = validate_persistence_id(persistence_id)
        check_seq_range(seq_nr, None)
        with self.read_pool.connection() as conn:
            row = conn.execute(q.one_event(self.tables), (pid, seq_nr)).fetchone()
        return None if row is None else row_to_envelope(row, self.serializers, source="load")

    def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """The db_timestamp of a stored (not deleted) event, or None."""
        pid = validate_persistence_id(persistence_id)
        check_seq_range(seq_nr, None)
        with self.read_pool.connection() as conn:
            row = conn.execute(q.timestamp_of(self.tables), (pid, seq_nr)).fetchone()
        return None if row is None else row[0]

    def database_time(self) -> datetime:
        """The database's current transaction time."""
        with self.read_pool.connection() as conn:
            row = conn.execute(q.database_time()).fetchone()
        if row is None:  # pragma: no cover - SELECT of a function always returns a row
            raise InvalidArgument("the database returned no time")
        value: datetime = row[0]
        return value

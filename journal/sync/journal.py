# Generated from journal/aio/journal.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""`SyncJournal`: the one object a service holds to write and read events.

It owns the connection pools, the notification sender/listener and the
serializer registry, and delegates each concern to its module (writer,
snapshots, queries). Construct it with `SyncJournal.connect(...)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg import Connection

from journal.connection import translate_errors
from journal.dsn import database
from journal.erasure import DEFAULT_BATCH_SIZE, check_erasure
from journal.errors import InvalidArgument
from journal.filter import EventFilter, check_filter
from journal.model import EventEnvelope, Snapshot, TimestampOffset
from journal.query import sql as q
from journal.query.by_persistence_id import check_seq_range
from journal.query.by_slice import check_slice_query
from journal.query.horizon import READER_APPLICATION
from journal.query.source import EVENTS, EVENTS_FROM_SNAPSHOTS
from journal.rows import row_to_envelope
from journal.schema import TableNaming
from journal.serialization import SerializerRegistry
from journal.settings import JournalSettings, QuerySettings, renamed_query_settings
from journal.slices import validate_persistence_id
from journal.sync.by_persistence_id import PersistenceIdQueries
from journal.sync.erasure import Eraser
from journal.sync.flavour import ASYNC
from journal.sync.migrate import check_schema as check_schema_version
from journal.sync.migrate import migrate
from journal.sync.notifications import NotificationListener, Notifier
from journal.sync.pool import SyncJournalPool, connect
from journal.sync.slice_reader import SliceReader
from journal.sync.snapshots import SnapshotStore
from journal.sync.writer import EventWriter
from journal.tables import Tables
from journal.writer import prepare_append

POOL_NAME = "slicejournal" if ASYNC else "slicejournal-sync"

_HOW = (
    "use `with SyncJournal.connect(...) as journal:`, or, for a journal that lives "
    "as long as the application, `journal = stack.enter_context(SyncJournal.connect("
    "...))` on a `contextlib.ExitStack` closed at shutdown"
)


class _Connecting(AbstractContextManager["SyncJournal"]):
    """What `SyncJournal.connect(...)` returns: a context manager that opens the journal on
    entry and closes it on exit. Awaiting it (a `TypeError`) or using it as the journal
    (an `AttributeError`) says how to use it instead."""

    def __init__(self, manager: AbstractContextManager[SyncJournal]) -> None:
        self._manager = manager

    def __enter__(self) -> SyncJournal:
        return self._manager.__enter__()

    def __exit__(self, *exc_info: Any) -> bool | None:
        return self._manager.__exit__(*exc_info)

    if not TYPE_CHECKING:  # for the type checker these do not exist: it flags the misuse

        def __await__(self):
            raise TypeError(f"SyncJournal.connect(...) is not awaitable: {_HOW}")

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            raise AttributeError(
                f"SyncJournal.connect(...) returns a context manager, not the journal "
                f"(it has no {name!r}): {_HOW}"
            )


class SyncJournal:
    """An event journal in PostgreSQL with Pekko Persistence R2DBC's schema and semantics."""

    def __init__(
        self,
        dsn: str,
        settings: JournalSettings,
        registry: SerializerRegistry,
    ) -> None:
        self.dsn = dsn
        self.settings = settings
        self.serializers = registry
        self.tables = Tables(settings)
        # The pools time out on connect and report a missing journal table as
        # `SchemaNotInitialized` (journal/connection.py); a malformed DSN fails here.
        self.pool = SyncJournalPool(dsn, settings, POOL_NAME)
        # Slice streams hold a connection while a catch-up chunk is consumed;
        # their own pool keeps them from starving writers and handlers.
        self.read_pool = SyncJournalPool(
            dsn, settings, f"{POOL_NAME}-read", application_name=READER_APPLICATION, reader=True
        )
        channel = self.tables.notify_channel
        self._notifier = Notifier(channel, self._connect) if settings.notify else None
        self._listener = (
            NotificationListener(channel, self._connect) if settings.query.notifications else None
        )
        self._writer = EventWriter(
            self.pool,
            self.tables,
            registry,
            settings.writer_id,
            self._notifier,
            settings.append_statements_for(ASYNC),
        )
        self._snapshots = SnapshotStore(self.pool, self.tables, registry)
        self._eraser = Eraser(self.pool, self.tables, settings.writer_id, self._notifier)
        self._slices = SliceReader(
            self.read_pool, self.tables, registry, settings.query, self._listener
        )
        self._by_pid = PersistenceIdQueries(
            self.read_pool,
            self.tables,
            registry,
            settings.page_size,
            settings.query.refresh_interval.total_seconds(),
            self._listener,
        )

    def _connect(self) -> Connection[Any]:
        return connect(self.dsn, connect_timeout=self.settings.connect_timeout_seconds)

    # -- lifecycle --------------------------------------------------------

    @classmethod
    def connect(
        cls,
        dsn: str | None = None,
        settings: JournalSettings | None = None,
        *,
        serializers: SerializerRegistry | None = None,
        create_schema: bool | None = None,
        check_schema: bool = True,
    ) -> AbstractContextManager[SyncJournal]:
        """Open a journal; with no DSN (argument or `SLICEJOURNAL_DSN`), the embedded server.

        It returns a context manager: the journal it enters is open until the block
        ends. For a journal that lives as long as the application (a web app), enter
        it into a `contextlib.AsyncExitStack` at start-up and close the stack at
        shutdown, or build `SyncJournal(dsn, settings, registry)` and call `open()` and
        `close()` yourself (that needs a DSN: no embedded server).

        `create_schema` applies the DDL first; it defaults to True for the
        embedded server and False for a configured database (run
        `slicejournal migrate` there). Errors are typed and fail fast (see `open`).
        """
        return _Connecting(cls._connected(dsn, settings, serializers, create_schema, check_schema))

    @classmethod
    @contextlib.contextmanager
    def _connected(
        cls,
        dsn: str | None,
        settings: JournalSettings | None,
        serializers: SerializerRegistry | None,
        create_schema: bool | None,
        check_schema: bool,
    ) -> Iterator[SyncJournal]:
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

    @translate_errors
    def open(self, *, create_schema: bool = False, check_schema: bool = True) -> None:
        """Connect once, apply or check the schema, then open the pools.

        Fails fast, within `settings.connect_timeout`: `ConnectionFailed` if
        the server cannot be reached, `InvalidArgument` for a malformed DSN,
        `SchemaNotInitialized` if the journal table does not exist and
        `create_schema` is False. `check_schema=False` skips that check, for a
        caller that prepares the schema itself and then calls `create_schema()`;
        a table still missing at first use is `SchemaNotInitialized` then.
        """
        conn = self._connect()
        with conn:
            if create_schema:
                migrate(conn, self.settings)
            if check_schema:
                check_schema_version(conn, self.tables)
        pools = (self.pool, self.read_pool)
        try:
            for pool in pools:
                pool.open_checked()
        except BaseException:
            for pool in pools:
                pool.close()
            raise

    def close(self) -> None:
        """Send pending notifications, stop listening and close the pools."""
        self._writer.close()
        if self._notifier is not None:
            self._notifier.close()
        if self._listener is not None:
            self._listener.close()
        self.read_pool.close()
        self.pool.close()

    @translate_errors
    def create_schema(self, *, tables: Sequence[TableNaming] = ()) -> None:
        """Apply the pending schema migrations (idempotent; see `slicejournal migrate`).

        Every installed component's tables get their default names unless
        `tables` names them: one per component, a name class of the package
        that owns them (e.g. `projections.ProjectionTableNames`).
        """
        with self.pool.connection() as conn:
            migrate(conn, self.settings, tables=tables)

    # -- write side -------------------------------------------------------

    @translate_errors
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
        is exactly the id's current highest seq_nr. With `conn`, the events are
        written inside that connection's transaction (in a savepoint) and
        become visible only when the caller commits.
        """
        batch = prepare_append(
            self.serializers, persistence_id, events, expected_seq_nr, tags, metadata
        )
        return self._writer.append(batch, conn)

    @translate_errors
    def highest_seq_nr(self, persistence_id: str) -> int:
        """The highest seq_nr of the id (0 if it has none); deleted events still count."""
        return self._writer.highest_seq_nr(validate_persistence_id(persistence_id))

    @translate_errors
    def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> int:
        """Delete events up to and including `to_seq_nr`; the sequence is never reused."""
        pid = validate_persistence_id(persistence_id)
        if isinstance(to_seq_nr, bool) or not isinstance(to_seq_nr, int) or to_seq_nr < 0:
            raise InvalidArgument(f"to_seq_nr must be an int >= 0, got {to_seq_nr!r}")
        return self._writer.delete_events_to(pid, to_seq_nr)

    @translate_errors
    def delete_all(
        self,
        persistence_id: str,
        reset_sequence_number: bool = False,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> int:
        """Erase the id (GDPR-style): every event, deletion marker and its snapshot.

        Rows go in batches of `batch_size`, each in a short transaction of its
        own. One row stays, written first: a tombstone (`deleted`, no payload)
        that slice queries deliver as an `EventEnvelope` with `deleted=True` and
        `event=None`, so projections learn the id was erased (their handler gets
        it like an event and deletes its rows) and a gap below it reads as
        deleted. Without `reset_sequence_number` the tombstone takes seq_nr
        highest + 1 and the id's next append continues after it; with it the
        tombstone sits at seq_nr 0 and the id starts again at 1. Stop the id's
        writers first. Running it again after a failure finishes the job.
        It ends only when nothing of the id is left below (with a reset: above)
        the tombstone, whatever else deletes meanwhile (retention,
        `delete_events_to`). Returns the number of rows this call removed (0: the
        id had no events); rows another deleter removed first are not counted.
        """
        erasure = check_erasure(persistence_id, reset_sequence_number, batch_size)
        return self._eraser.delete_all(erasure)

    @translate_errors
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
        self._snapshots.save(
            persistence_id, seq_nr, state, tags=tuple(tags), metadata=metadata, conn=conn
        )

    @translate_errors
    def load_snapshot(self, persistence_id: str) -> Snapshot | None:
        """The id's latest snapshot, or None."""
        return self._snapshots.load(persistence_id)

    @translate_errors
    def delete_snapshot(self, persistence_id: str) -> None:
        """Remove the id's snapshot."""
        self._snapshots.delete(persistence_id)

    # -- queries by persistence id ----------------------------------------

    def current_events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> Generator[EventEnvelope, None, None]:
        """The id's stored events in seq_nr order (deleted ones skipped), then the end."""
        pid = validate_persistence_id(persistence_id)
        lo, hi = check_seq_range(from_seq_nr, to_seq_nr)
        return self._by_pid.current(pid, lo, hi)

    def events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> Generator[EventEnvelope, None, None]:
        """Like `current_events_by_persistence_id`, then waits for new events (live)."""
        pid = validate_persistence_id(persistence_id)
        lo, hi = check_seq_range(from_seq_nr, to_seq_nr)
        return self._by_pid.live(pid, lo, hi)

    def current_persistence_ids(self, entity_type: str | None = None) -> Generator[str, None, None]:
        """Every persistence id in the journal (optionally of one entity type), sorted."""
        return self._by_pid.persistence_ids(entity_type)

    # -- queries by slice ---------------------------------------------------

    def events_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None = None,
        *,
        heartbeats: bool = False,
        query_settings: QuerySettings | None = None,
        filter: EventFilter | None = None,
        filtered_envelopes: bool = False,
        settings: QuerySettings | None = None,
    ) -> Generator[EventEnvelope, None, None]:
        """Live stream of the entity type's events in a slice range, never ending on its own.

        Ordered by (db_timestamp, seq_nr), except that backtracking envelopes
        (`source == "backtracking"`, payload not loaded) re-deliver recent
        events that may have committed late; dedupe by (pid, seq_nr). Resuming
        from an envelope's `offset` continues right after it. With
        `heartbeats=True`, idle periods yield heartbeat envelopes whose offset
        advances with the database clock.

        `filter`: only the events an `EventFilter` lets through (evaluated by
        PostgreSQL; the others' payloads are never read). With
        `filtered_envelopes=True` the others come too, key and offset only
        (`envelope.filtered`): what a consumer that tracks every seq_nr of an id
        needs (projections do).

        `query_settings`: the `QuerySettings` of this stream (default: the journal's).
        `settings=` is its deprecated name (until 0.4.0): elsewhere `settings` is a
        `JournalSettings`.
        """
        check_slice_query(entity_type, min_slice, max_slice, offset)
        query_settings = renamed_query_settings(query_settings, settings)
        return self._slices.stream(
            entity_type,
            min_slice,
            max_slice,
            offset,
            source=EVENTS,
            live=True,
            heartbeats=heartbeats,
            settings=query_settings,
            event_filter=check_filter(filter),
            filtered_envelopes=filtered_envelopes,
        )

    def current_events_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None = None,
        *,
        query_settings: QuerySettings | None = None,
        filter: EventFilter | None = None,
        filtered_envelopes: bool = False,
        settings: QuerySettings | None = None,
    ) -> Generator[EventEnvelope, None, None]:
        """The range's events up to the database time at the start, then the end
        (`filter`, `filtered_envelopes`: as for `events_by_slices`)."""
        check_slice_query(entity_type, min_slice, max_slice, offset)
        query_settings = renamed_query_settings(query_settings, settings)
        return self._slices.stream(
            entity_type,
            min_slice,
            max_slice,
            offset,
            source=EVENTS,
            live=False,
            settings=query_settings,
            event_filter=check_filter(filter),
            filtered_envelopes=filtered_envelopes,
        )

    def events_by_slices_from_snapshots(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None = None,
        *,
        heartbeats: bool = False,
        query_settings: QuerySettings | None = None,
    ) -> Generator[EventEnvelope, None, None]:
        """`events_by_slices`, with each id's snapshot in place of its events up to the
        snapshot's seq_nr: the server ships the snapshots and the events after them.

        A snapshot's envelope has `from_snapshot` True, `event` the snapshot's state,
        `seq_nr` its seq_nr and `db_timestamp` that of the event it was taken at, so it
        comes where that event would have, before every later event of its id, and its
        `offset` resumes right after it. The rule holds for every stretch the stream
        has not read yet, so a snapshot saved while the stream runs replaces the events
        it covers that were not delivered yet (and a consumer gets events 1..k, then the
        snapshot at N > k, then N + 1 ...). Ids without a snapshot come as events.
        Backtracking re-delivers events only (a covered one is a duplicate for a
        consumer that tracks seq_nrs, as projections do). Save snapshots after their
        event is stored (`save_snapshot` after `append`, or in its transaction).
        """
        check_slice_query(entity_type, min_slice, max_slice, offset)
        return self._slices.stream(
            entity_type,
            min_slice,
            max_slice,
            offset,
            source=EVENTS_FROM_SNAPSHOTS,
            live=True,
            heartbeats=heartbeats,
            settings=query_settings,
        )

    def current_events_by_slices_from_snapshots(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | None = None,
        *,
        query_settings: QuerySettings | None = None,
    ) -> Generator[EventEnvelope, None, None]:
        """`events_by_slices_from_snapshots` up to the database time at the start, then
        the end: a new read model's catch-up from snapshots."""
        check_slice_query(entity_type, min_slice, max_slice, offset)
        return self._slices.stream(
            entity_type,
            min_slice,
            max_slice,
            offset,
            source=EVENTS_FROM_SNAPSHOTS,
            live=False,
            settings=query_settings,
        )

    @translate_errors
    def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope | None:
        """One event with its payload (e.g. for a backtracking envelope), or None."""
        pid = validate_persistence_id(persistence_id)
        check_seq_range(seq_nr, None)
        with self.read_pool.connection() as conn:
            cur = conn.execute(q.one_event(self.tables), (pid, seq_nr))
            row = cur.fetchone()
        if row is None:
            return None
        return row_to_envelope(row, self.serializers, source="load")

    @translate_errors
    def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """The db_timestamp of a stored (not deleted) event, or None."""
        pid = validate_persistence_id(persistence_id)
        check_seq_range(seq_nr, None)
        with self.read_pool.connection() as conn:
            cur = conn.execute(q.timestamp_of(self.tables), (pid, seq_nr))
            row = cur.fetchone()
        return None if row is None else row[0]

    @translate_errors
    def database_time(self) -> datetime:
        """The database's current transaction time."""
        return self._slices.database_time()

# Generated from projections/aio/runner.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""SyncProjection runners: a slice range of the journal turned into a read model.

One `SyncProjection` owns one slice range. It loads that range's offsets, resumes
the slice query from the earliest of its slices' latest offsets, offers each
envelope to the projection core (`core.py`) and executes what the core asks
for: journal reads, handler calls, transactions. The core decides; this
module does the I/O and its policy (retries, dead letters, pause checks,
cleanup). Accepted envelopes go to the handler in one of three delivery modes:

* exactly-once — the handler gets the connection of the transaction that also
  stores the offset: both commit or neither does;
* grouped — the same, a batch per transaction;
* at-least-once — the handler runs on its own; offsets are saved every N
  envelopes or T ms, so a crash may repeat events but never loses one.

The same three modes run over the durable state's changes
(`exactly_once_changes`, `grouped_changes`, `at_least_once_changes`): the
pump reads `SyncDurableStateStore.changes_by_slices` instead of the events, and
the core validates revisions (`source=STATE_CHANGES`: the latest revision of
each changed id, gaps normal); the handlers get `DurableStateChange`s.

A pump task (a thread in the sync flavour) moves the stream, a part of up to
`PART` envelopes at a time (`SliceReader.stream_parts`: one step per part,
not per envelope), into a bounded queue so the consumer can flush batches on
time even when the stream is quiet. Every instance reports to its telemetry hook
(`projections/telemetry.py`): batches, errors, dead letters, offsets, and
(if the hook asks) its backlog, sampled by a task of its own so a stuck
handler shows. This module is the one source of both runners:
`projections/sync/runner.py` (`SyncProjection`) is generated from it.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import attrs
import psycopg
from psycopg import Connection, Pipeline
from psycopg.pq import TransactionStatus

from journal.connection import driver_errors, schema_errors
from journal.durable_state import DurableStateChange
from journal.errors import InvalidArgument
from journal.filter import EventFilter, check_filter
from journal.model import EventEnvelope, TimestampOffset
from journal.query.source import EVENTS, EVENTS_FROM_SNAPSHOTS, STATE_CHANGES, RowSource
from journal.settings import QuerySettings
from journal.slices import SliceRange
from journal.sync.durable_state import SyncDurableStateStore
from journal.sync.flavour import (
    ASYNC,
    CancelledError,
    Event,
    Queue,
    cancel_and_wait,
    queue_get,
    queue_offer,
    queue_put,
    sleep,
    spawn,
    wait_event,
)
from journal.sync.journal import SyncJournal
from journal.sync.notifications import Notifier
from journal.sync.pool import connect
from journal.sync.slice_reader import PART
from projections.core import (
    Action,
    Commit,
    Envelope,
    Handle,
    Mode,
    ProjectionCore,
    ProjectionStats,
    SaveOffsets,
    record_of,
    wanted,
)
from projections.errors import ProjectionError
from projections.fencing import Fence, bounds_whole_transactions, offset_error
from projections.management_sql import ManagementSql
from projections.names import check_handler_flavour, check_instance, wrong_journal
from projections.recovery import OnFailure, RecoveryStrategy, check_decoded
from projections.settings import ProjectionSettings
from projections.sync.core_io import CoreReads, drive
from projections.sync.offset_dao import (
    OffsetDao,
    insert_dead_letters,
    range_is_paused,
    read_backlog,
    record_filter,
    record_reads,
)
from projections.sync.replay import DeadLetterReplayer
from projections.tables import ProjectionTables
from projections.telemetry import (
    NO_INSTANCE_TELEMETRY,
    InstanceTelemetry,
    Telemetry,
    telemetry_for_runner,
)

# Lifecycle (start, stop, pause, resume, failure) at INFO/ERROR, retries and
# skips at WARNING/ERROR; see the README's "Logging" section.
_log = logging.getLogger("slicejournal.projections.runner")

_IN_TRANSACTION = TransactionStatus.INTRANS

_FLAVOUR = "async" if ASYNC else "sync"

SyncHandler = Callable[[Connection[Any], EventEnvelope], None]
SyncGroupedHandler = Callable[[Connection[Any], list[EventEnvelope]], None]
SyncAtLeastOnceHandler = Callable[[EventEnvelope], None]
# The handlers of projections over durable state (`exactly_once_changes`, ...).
SyncChangeHandler = Callable[[Connection[Any], DurableStateChange], None]
SyncGroupedChangeHandler = Callable[[Connection[Any], list[DurableStateChange]], None]
SyncAtLeastOnceChangeHandler = Callable[[DurableStateChange], None]


__all__ = [
    "ProjectionError",
    "SyncAtLeastOnceChangeHandler",
    "SyncAtLeastOnceHandler",
    "SyncChangeHandler",
    "SyncGroupedChangeHandler",
    "SyncGroupedHandler",
    "SyncHandler",
    "SyncProjection",
]


@attrs.frozen
class _StreamEnded:
    """Put in the queue by the pump: the stream ended (`error` None) or failed."""

    error: Exception | None = None


# Put in the queue by `stop()`, so a consumer waiting for an envelope wakes at once.
_WAKE = _StreamEnded()
# The pump's items: a part of the stream (`SliceReader.stream_parts`), or its end.
_Item = list[EventEnvelope] | list[DurableStateChange] | _StreamEnded


class SyncProjection:
    """One running instance of a projection over one slice range.

    Built by the factory of its delivery mode, which types its handler:
    `exactly_once`, `grouped`, `at_least_once` over events, and
    `exactly_once_changes`, `grouped_changes`, `at_least_once_changes` over the
    durable state. (`SyncProjection(..., mode=..., handler=...)` is deprecated, until
    0.4.0.)
    """

    def __init__(
        self,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        mode: Mode,
        handler: SyncHandler | SyncGroupedHandler | SyncAtLeastOnceHandler,
        settings: ProjectionSettings | None = None,
        recovery: RecoveryStrategy | None = None,
        query_settings: QuerySettings | None = None,
        telemetry: Telemetry | None = None,
        filter: EventFilter | None = None,
    ) -> None:
        """Deprecated since 0.3.0 (removed in 0.4.0): use the factory of the mode,
        `SyncProjection.exactly_once` / `grouped` / `at_least_once`, which types the handler."""
        warnings.warn(
            "SyncProjection(..., mode=...) is deprecated (removed in 0.4.0): build it with "
            "SyncProjection.exactly_once / .grouped / .at_least_once "
            "(the handler's type follows the mode)",
            DeprecationWarning,
            stacklevel=2,
        )
        self._setup(journal, name=name, entity_type=entity_type, slice_range=slice_range,
                    mode=mode, handler=handler, settings=settings, recovery=recovery,
                    query_settings=query_settings, telemetry=telemetry, filter=filter,
                    source=EVENTS)  # fmt: skip

    def _setup(  # the factories' constructor: `cls.__new__`, then this (no warning)
        self,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        mode: Mode,
        handler: Callable[..., None],
        settings: ProjectionSettings | None,
        recovery: RecoveryStrategy | None,
        query_settings: QuerySettings | None,
        telemetry: Telemetry | None,
        filter: EventFilter | None = None,
        source: RowSource[Any] = EVENTS,
    ) -> None:
        instance = check_instance(name, entity_type, slice_range, handler)
        if filter is not None and not source.consecutive:
            raise InvalidArgument("an EventFilter selects events, not durable state changes")
        if filter is not None and source is EVENTS_FROM_SNAPSHOTS:
            raise InvalidArgument(
                "an EventFilter does not combine with from_snapshots: a snapshot stands for "
                "every event up to it, filtered or not"
            )
        check_handler_flavour(handler, asynchronous=ASYNC)
        if not isinstance(journal, SyncJournal):
            raise wrong_journal(journal, asynchronous=ASYNC)
        self.journal = journal
        self.name = instance.name
        self.entity_type = instance.entity_type
        self.slice_range = instance.slice_range
        self.key = instance.key
        self.mode = mode
        self.settings = settings or ProjectionSettings()
        self.recovery = recovery or RecoveryStrategy.fail()
        self.query_settings = query_settings
        self.stats = ProjectionStats()
        self._handler = handler
        self.tables = ProjectionTables(journal.tables, self.settings.tables)
        self._dao = OffsetDao(self.tables, self.name)
        self._management = ManagementSql(self.tables)
        # Only the events the filter lets through reach the handler; the others come as
        # keys (`envelope.filtered`), so the offset store sees every seq_nr of an id.
        self.filter = check_filter(filter)
        # What the pump reads: the journal's events, or the durable state's changes.
        self.source = source
        self._states = None if source.consecutive else SyncDurableStateStore(journal)
        self._reads = CoreReads(
            journal.tables,
            journal.serializers,
            pool=journal.read_pool,
            offsets=self._dao.sql,
            event_filter=self.filter,
            source=source,
        )
        self._stop = Event()
        self._queue: Queue[_Item] | None = None
        self._running = False
        # Every lifecycle log line carries these as `extra=` (JSON logs show them).
        self._fields: dict[str, object] = {"projection": self.name, "range": self.key}
        # Everything that decides; kept across runs like the stats it counts in.
        self._core = ProjectionCore(
            mode,
            self.settings,
            self.slice_range,
            stats=self.stats,
            where=f"{self.name} {self.key}",
            log=_log,
            fields=self._fields,
            source=source,
        )
        self._was_paused = False
        self._fence: Fence | None = None
        # A fenced batch outlived the lease TTL: its batches are synced from then on.
        self._synced_fence = False
        # None: the process's telemetry (`use_telemetry`) when a run starts.
        self._telemetry = telemetry
        self._tel: InstanceTelemetry = NO_INSTANCE_TELEMETRY
        # Announces committed offsets to `SyncProjectionManagement.wait_for` (any process);
        # a fresh one per run, closed (flushed) when the run ends.
        self._commits: Notifier | None = None
        self._replayer = DeadLetterReplayer(
            journal, self.tables, self.name, self.slice_range, mode, handler,
            states=self._states,
        )  # fmt: skip

    # -- construction --------------------------------------------------------------

    @classmethod
    def exactly_once(
        cls,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        handler: SyncHandler,
        settings: ProjectionSettings | None = None,
        recovery: RecoveryStrategy | None = None,
        query_settings: QuerySettings | None = None,
        telemetry: Telemetry | None = None,
        filter: EventFilter | None = None,
        from_snapshots: bool = False,
    ) -> SyncProjection:
        """`handler(conn, envelope)` runs in the transaction that stores the offset.

        Options (all keyword-only, each None for its default): `settings`
        (`ProjectionSettings`), `recovery` (`RecoveryStrategy`, default fail),
        `query_settings` (`QuerySettings`, default the journal's), `telemetry`
        (`Telemetry`, default the process's `use_telemetry`), `filter` (an
        `EventFilter`). `from_snapshots=True` reads
        `SyncJournal.events_by_slices_from_snapshots`: each id's snapshot comes in place of
        its events up to the snapshot's seq_nr (`envelope.from_snapshot`, `event` the
        snapshot's state; the handler builds the read model from it), so a new
        projection over long-lived ids reads the snapshots and the events after them.
        """
        projection = cls.__new__(cls)
        projection._setup(journal, mode=Mode.EXACTLY_ONCE, handler=handler, name=name,
                          entity_type=entity_type, slice_range=slice_range,
                          settings=settings, recovery=recovery, query_settings=query_settings,
                          telemetry=telemetry, filter=filter,
                          source=EVENTS_FROM_SNAPSHOTS if from_snapshots else EVENTS)  # fmt: skip
        return projection

    @classmethod
    def grouped(
        cls,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        handler: SyncGroupedHandler,
        settings: ProjectionSettings | None = None,
        recovery: RecoveryStrategy | None = None,
        query_settings: QuerySettings | None = None,
        telemetry: Telemetry | None = None,
        filter: EventFilter | None = None,
        from_snapshots: bool = False,
    ) -> SyncProjection:
        """`handler(conn, envelopes)` per batch, in the transaction that stores the offsets.

        Options as for `exactly_once`."""
        projection = cls.__new__(cls)
        projection._setup(journal, mode=Mode.GROUPED, handler=handler, name=name,
                          entity_type=entity_type, slice_range=slice_range,
                          settings=settings, recovery=recovery, query_settings=query_settings,
                          telemetry=telemetry, filter=filter,
                          source=EVENTS_FROM_SNAPSHOTS if from_snapshots else EVENTS)  # fmt: skip
        return projection

    @classmethod
    def at_least_once(
        cls,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        handler: SyncAtLeastOnceHandler,
        settings: ProjectionSettings | None = None,
        recovery: RecoveryStrategy | None = None,
        query_settings: QuerySettings | None = None,
        telemetry: Telemetry | None = None,
        filter: EventFilter | None = None,
        from_snapshots: bool = False,
    ) -> SyncProjection:
        """`handler(envelope)` outside any offset transaction; offsets saved periodically.

        Options as for `exactly_once`."""
        projection = cls.__new__(cls)
        projection._setup(journal, mode=Mode.AT_LEAST_ONCE, handler=handler, name=name,
                          entity_type=entity_type, slice_range=slice_range,
                          settings=settings, recovery=recovery, query_settings=query_settings,
                          telemetry=telemetry, filter=filter,
                          source=EVENTS_FROM_SNAPSHOTS if from_snapshots else EVENTS)  # fmt: skip
        return projection

    @classmethod
    def exactly_once_changes(
        cls,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        handler: SyncChangeHandler,
        settings: ProjectionSettings | None = None,
        recovery: RecoveryStrategy | None = None,
        query_settings: QuerySettings | None = None,
        telemetry: Telemetry | None = None,
    ) -> SyncProjection:
        """Over the durable state (`SyncDurableStateStore.changes_by_slices`):
        `handler(conn, change)` runs in the transaction that stores the change's offset.

        Each change is the latest revision of an id the query saw: a revision at
        or below the one handled is a duplicate, a higher one is applied, gaps are
        normal. A deletion arrives with `deleted=True`. Options as for
        `exactly_once` (no `filter`: it selects events)."""
        projection = cls.__new__(cls)
        projection._setup(journal, mode=Mode.EXACTLY_ONCE, handler=handler, name=name,
                          entity_type=entity_type, slice_range=slice_range,
                          settings=settings, recovery=recovery, query_settings=query_settings,
                          telemetry=telemetry, source=STATE_CHANGES)  # fmt: skip
        return projection

    @classmethod
    def grouped_changes(
        cls,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        handler: SyncGroupedChangeHandler,
        settings: ProjectionSettings | None = None,
        recovery: RecoveryStrategy | None = None,
        query_settings: QuerySettings | None = None,
        telemetry: Telemetry | None = None,
    ) -> SyncProjection:
        """Over the durable state: `handler(conn, changes)` per batch, in the transaction
        that stores their offsets. Revisions as for `exactly_once_changes`."""
        projection = cls.__new__(cls)
        projection._setup(journal, mode=Mode.GROUPED, handler=handler, name=name,
                          entity_type=entity_type, slice_range=slice_range,
                          settings=settings, recovery=recovery, query_settings=query_settings,
                          telemetry=telemetry, source=STATE_CHANGES)  # fmt: skip
        return projection

    @classmethod
    def at_least_once_changes(
        cls,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        handler: SyncAtLeastOnceChangeHandler,
        settings: ProjectionSettings | None = None,
        recovery: RecoveryStrategy | None = None,
        query_settings: QuerySettings | None = None,
        telemetry: Telemetry | None = None,
    ) -> SyncProjection:
        """Over the durable state: `handler(change)` outside any offset transaction,
        offsets saved periodically. Revisions as for `exactly_once_changes`."""
        projection = cls.__new__(cls)
        projection._setup(journal, mode=Mode.AT_LEAST_ONCE, handler=handler, name=name,
                          entity_type=entity_type, slice_range=slice_range,
                          settings=settings, recovery=recovery, query_settings=query_settings,
                          telemetry=telemetry, source=STATE_CHANGES)  # fmt: skip
        return projection

    # -- lifecycle -------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run` to finish the in-flight batch, save offsets and return.

        Safe to call from any thread in the sync flavour."""
        self._stop.set()
        queue = self._queue
        if queue is not None:
            queue_offer(queue, _WAKE)  # a full queue wakes the consumer anyway

    @property
    def running(self) -> bool:
        """True while `run` is running."""
        return self._running

    def run(self, *, until_caught_up: bool = False, fence: Fence | None = None) -> ProjectionStats:
        """Project until `stop()`; raises `ProjectionError` if the handler keeps failing.

        With `until_caught_up`, project the events up to the database time at
        the start and return (a backfill; a live run started later resumes
        from there). An event another instance stored already fails the
        transaction with `OffsetConflict`, never applied twice. Returns the
        instance's counters. (`fence=` is deprecated, until 0.4.0: fleet workers
        run their instances fenced by their leases themselves.)
        """
        if fence is not None:
            warnings.warn(
                "SyncProjection.run(fence=...) is deprecated: a fleet worker runs its instances "
                "fenced by their leases; run them with slicejournal worker / FleetWorker",
                DeprecationWarning,
                stacklevel=2,
            )
        return self._run_guarded(fence, until_caught_up)

    def _run_guarded(self, fence: Fence | None, until_caught_up: bool) -> ProjectionStats:
        # The journal's pool knows only the journal's tables; a missing one of the
        # projections' is `SchemaNotInitialized` too. What the driver raises outside a
        # handler (loading offsets, the pause check, saving offsets, cleanup) leaves as
        # the journal's typed errors: a terminated backend is `ConnectionLost`.
        try:
            with driver_errors(), schema_errors(self.tables):
                return self._run(fence, until_caught_up)
        except Exception:
            # Backends terminated (or a server restarted) while the pools' connections
            # sat idle would fail the next run at once: tested now, broken ones replaced.
            check_pools(self.journal)
            raise

    def _run(self, fence: Fence | None, until_caught_up: bool) -> ProjectionStats:
        if self._running:
            raise ProjectionError(f"projection {self.name} {self.key} is already running")
        self._running = True
        self._fence = fence
        tel = self._tel = telemetry_for_runner(self._telemetry).instance(
            self.name, self.key, _FLAVOUR
        )
        sampler = None
        try:
            if self._stop.is_set():  # stopped before it ever ran: a stop is never lost
                _log.info("projection %s %s stopped before it started", self.name, self.key,
                          extra=self._extra("stopped"))  # fmt: skip
                return self.stats
            with self.journal.pool.connection() as conn:
                records = self._dao.load(conn, self.slice_range)
                # Where `status` and management's backlog find the filter (None: cleared).
                record_filter(conn, self._management, self.name, self.filter)
                record_reads(conn, self._management, self.name, self.source)
            start = self._core.start(records)
            journal = self.journal
            self._commits = Notifier(
                self.tables.commit_channel,
                partial(
                    connect, journal.dsn, connect_timeout=journal.settings.connect_timeout_seconds
                ),
            )
            _log.info(
                "projection %s %s started (%s %s, entity type %r, resuming from %s)",
                self.name,
                self.key,
                _FLAVOUR,
                self.mode.value,
                self.entity_type,
                "the beginning" if start is None else start.timestamp.isoformat(),
                extra=self._extra("started", mode=self.mode.value),
            )
            tel.started()
            if tel.samples_backlog:  # events, or durable state changes (`source`)
                sampler = spawn(self._sample_backlog, tel, name=f"backlog {self.key}")
            # `buffer` envelopes, in parts of at most `PART` (a heartbeat is a part).
            queue: Queue[_Item] = Queue(max(2, -(-self.settings.buffer // PART)))
            self._queue = queue
            pump = spawn(self._pump, queue, start, until_caught_up, name=f"pump {self.key}")
            try:
                self._consume(queue)
            finally:
                self._queue = None
                cancel_and_wait(pump)
            _log.info(
                "projection %s %s stopped: %d accepted, %d duplicates, %d gap events, %d skipped",
                self.name,
                self.key,
                self.stats.accepted,
                self.stats.duplicates,
                self.stats.gaps_filled,
                self.stats.skipped,
                extra=self._extra("stopped", accepted=self.stats.accepted),
            )
        except CancelledError as cancelled:
            _log.info("projection %s %s cancelled", self.name, self.key,
                      extra=self._extra("stopped"))  # fmt: skip
            tel.stopped(cancelled)
            raise
        except Exception as error:
            _log.error("projection %s %s failed: %s", self.name, self.key, error,
                       extra=self._extra("failed", error=str(error)))  # fmt: skip
            tel.stopped(error)
            raise
        else:
            tel.stopped(None)
        finally:
            cancel_and_wait(sampler)
            self._close_commits()
            self._running = False
            # Consumed: a later run() starts afresh, a stop() before it is kept.
            self._stop.clear()
        return self.stats

    def _pump(
        self, queue: Queue[_Item], start: TimestampOffset | None, until_caught_up: bool
    ) -> None:
        r = self.slice_range
        # The slice query a part at a time (`SliceReader.stream_parts`, what the public
        # queries yield envelope by envelope): one queue item per part. A current stream
        # (until caught up) has no heartbeats, as `current_events_by_slices`.
        reader = self.journal._slices if self._states is None else self._states._slices
        parts = reader.stream_parts(
            self.entity_type, r.min_slice, r.max_slice, start, source=self.source,
            live=not until_caught_up, heartbeats=not until_caught_up,
            settings=self.query_settings, event_filter=self.filter,
            filtered_envelopes=True,
        )  # fmt: skip
        try:
            with contextlib.closing(parts):
                for part in parts:
                    # Waiting (a coroutine) only when the queue is full.
                    if not queue_offer(queue, part):
                        queue_put(queue, part)
        except Exception as error:  # handed to the consumer, which fails the run with it
            queue_put(queue, _StreamEnded(error))
            return
        queue_put(queue, _StreamEnded())

    def _sample_backlog(self, tel: InstanceTelemetry) -> None:
        """Read the range's backlog every `backlog_sample_interval` until cancelled, on a
        task (thread) of its own: a handler that blocks does not stop the readings."""
        interval = self.settings.backlog_sample_interval.total_seconds()
        while True:
            try:
                with self.journal.pool.connection() as conn:
                    backlog = read_backlog(
                        conn, self._management, self.name, self.entity_type, self.slice_range,
                        event_filter=self.filter, source=self.source,
                    )  # fmt: skip
                tel.backlog_sampled(backlog)
            except CancelledError:
                raise
            except Exception as error:  # the next reading may work; the run goes on
                _log.debug("projection %s %s: backlog reading failed: %s",
                           self.name, self.key, error)  # fmt: skip
            sleep(interval)

    def _consume(self, queue: Queue[_Item]) -> None:
        poll = self.settings.management_poll_interval.total_seconds()
        next_poll = time.monotonic()
        next_cleanup = time.monotonic() + self.settings.cleanup_interval.total_seconds()
        # What is left of a part whose offering stopped for a due check (pause, cleanup,
        # a batch's time): offered before the next item, after the checks.
        rest: list[EventEnvelope] | list[DurableStateChange] = []
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + poll
                if self._paused():
                    self._flush()
                    wait_event(self._stop, poll)
                    continue
                # Dead letters an operator asked to replay, of this instance's slices.
                self._replayer.run_pending(self._fence, self._raise_offset_failure)
            if now >= next_cleanup:
                next_cleanup = now + self.settings.cleanup_interval.total_seconds()
                self._cleanup()
            if rest:
                item: _Item | None = rest
            elif not queue.empty():  # the common case while busy: no wait, no timer
                item = queue.get_nowait()
            else:
                timeout = max(0.0, min(next_poll, self._core.next_deadline()) - time.monotonic())
                item = queue_get(queue, timeout)
            if isinstance(item, list):
                rest = self._offer_part(item, min(next_poll, next_cleanup))
            elif item is not None and item is not _WAKE:
                if item.error is not None:
                    error = item.error
                    raise ProjectionError(
                        f"slice stream of {self.name} {self.key} failed: {error}"
                    ) from error
                break  # a current (until caught up) stream ended
            polled = self._core.poll(time.monotonic())
            if polled is not None:
                self._drive(polled)
        self._flush()

    def _offer_part(
        self, part: list[EventEnvelope] | list[DurableStateChange], due: float
    ) -> list[EventEnvelope] | list[DurableStateChange]:
        """Offer a part of the stream in order, and return what is left of it when a
        check is due — at `due` (the management poll, cleanup) or the core's deadline
        (a batch's time, a held envelope's retry) — as after every envelope before
        parts. After `stop()`, the rest is dropped: its offsets are not stored, and the
        next run reads it again."""
        core, stop = self._core, self._stop
        envelopes: Sequence[Envelope] = part
        for i, env in enumerate(envelopes):
            if self._tel is NO_INSTANCE_TELEMETRY:
                # Inline, and `_drive` only when the core asks for something: most
                # envelopes are only collected into the batch (no await per event).
                offered = core.offer(env, time.monotonic())
                if offered is not None:
                    self._drive(offered)
            else:
                self._handle(env)
            if stop.is_set():
                return []
            now = time.monotonic()
            if now >= due or now >= core.next_deadline():
                return part[i + 1 :]
        return []

    # -- executing the core's actions -----------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic()

    def _handle(self, env: Envelope) -> None:
        """`offer` with telemetry: the duplicates and gap fills it counted, reported."""
        tel = self._tel
        stats = self.stats
        duplicates, gaps = stats.duplicates, stats.gaps_filled
        self._drive(self._core.offer(env, self._now()))
        if stats.duplicates != duplicates:
            tel.duplicates(stats.duplicates - duplicates)
        if stats.gaps_filled != gaps:
            tel.gaps_filled(stats.gaps_filled - gaps)

    def _flush(self) -> None:
        self._drive(self._core.flush(self._now()))

    def _drive(self, action: Action | None) -> None:
        """Execute actions, feeding each outcome back, until the core has nothing to do."""
        drive(
            self._core, action, self._reads,
            handle=self._handle_one, commit=self._commit, save=self._save_offsets,
        )  # fmt: skip

    def _handle_one(self, action: Handle) -> bool:
        """At-least-once: the handler outside any offset transaction, with recovery."""
        return self._batch([action.envelope], self._call_at_least_once)

    def _commit(self, action: Commit) -> bool:
        """Exactly-once / grouped: the handler and the offsets in one transaction."""
        skipped = self._batch(list(action.envelopes), partial(self._call_in_transaction, action))
        if self._tel is not NO_INSTANCE_TELEMETRY:
            self._tel.offsets_stored(len(action.events if skipped else action.records))
        self._committed()
        return skipped

    def _save_offsets(self, action: SaveOffsets) -> None:
        """Offsets alone (at-least-once, progress markers): their own short transaction."""
        try:
            with self.journal.pool.connection() as conn, conn.transaction():
                self._dao.save(conn, self.key, action.records, self._fence)
        except Exception as error:
            self._raise_offset_failure(error)
            raise
        self._tel.offsets_stored(len(action.records))
        self._committed()

    def _committed(self) -> None:
        """Offsets were committed: tell waiters (`wait_for`) soon, coalesced."""
        if self._commits is not None:
            self._commits.changed(self.name, self.slice_range.min_slice)

    def _close_commits(self) -> None:
        commits, self._commits = self._commits, None
        if commits is not None:
            with contextlib.suppress(Exception):
                commits.close()

    def _batch(
        self,
        envelopes: list[Envelope],
        call: Callable[[list[Envelope]], None],
    ) -> bool:
        """`_with_recovery`, reported to the telemetry as one batch (timed only if on)."""
        tel = self._tel
        if tel is NO_INSTANCE_TELEMETRY:
            return self._with_recovery(envelopes, call)
        started = tel.batch_started(len(envelopes))
        began = time.perf_counter()
        error: BaseException | None = None
        try:
            return self._with_recovery(envelopes, call)
        except BaseException as failure:
            error = failure
            raise
        finally:
            tel.batch_ended(started, len(envelopes), time.perf_counter() - began, error)

    # -- transactions ---------------------------------------------------------------------------

    def _call_in_transaction(self, commit: Commit, envelopes: list[Envelope]) -> None:
        """Exactly-once / grouped: the handler and the offsets in one transaction."""
        check_decoded(envelopes)
        handled = wanted(envelopes)
        began = 0.0
        pipelined = False
        held: Connection[Any] | None = None
        try:
            with self.journal.pool.connection() as conn:
                held, began = conn, time.monotonic()
                pipelined = self._pipelines(conn)
                with self._round_trips(conn, pipelined):
                    if self.mode is Mode.GROUPED:
                        if handled:
                            self._handler(conn, handled)
                    else:
                        for env in handled:
                            self._handler(conn, env)
                    if self._fence is not None and _ended_by_handler(conn, pipelined):
                        # Its offsets would be stored outside the handler's transaction.
                        raise ProjectionError(
                            "the handler ended the batch's transaction itself (commit or "
                            "rollback); the runner commits the handler's writes with the offsets"
                        )
                    unchecked = self._dao.save(conn, self.key, commit.records, self._fence)
            # In a pipeline the fenced insert's rows are counted only now, after COMMIT:
            # an alarm, not a guard (the fence is a scalar call joined with every row,
            # so the statement cannot write fewer; synced, the count precedes COMMIT).
            for written in unchecked:
                written.check()
        except psycopg.Error as error:
            if not (pipelined and self._outlived_limit(held, began)):
                raise
            # The server ended a batch that outlived the lease TTL (`transaction_limit`):
            # this instance's batches wait for every statement from now on, which bounds
            # only the time a batch sits idle, and this one runs again (it was rolled back).
            self._synced_fence = True
            _log.warning(
                "projection %s %s: a batch took longer than the lease TTL (%s); its "
                "batches are no longer pipelined",
                self.name,
                self.key,
                error,
                extra=self._extra("fence_synced"),
            )
            self._call_in_transaction(commit, envelopes)

    def _outlived_limit(self, conn: Connection[Any] | None, began: float) -> bool:
        """Whether a pipelined fenced batch failed because the server ended it at the
        lease TTL (`Fence.transaction_limit`): at least a TTL after it began, with its
        connection closed (the timeout ends the session; the client reads the timeout's
        error or only the closed connection, depending on where it was), whatever the
        error says. Any other failure (a deadlock, a lost lease) leaves it open."""
        fence = self._fence
        if fence is None or time.monotonic() - began < fence.idle_timeout_ms / 1000:
            return False
        return conn is not None and conn.broken

    def _pipelines(self, conn: Connection[Any]) -> bool:
        """Whether this batch is pipelined: always without a fence; with one, where the
        server bounds the whole transaction and no batch of this instance outlived it."""
        if self._fence is None:
            return True
        return not self._synced_fence and bounds_whole_transactions(conn.info.server_version)

    def _round_trips(
        self, conn: Connection[Any], pipelined: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """The handler transaction's context: pipelined, or synced for a fence on a server
        that cannot bound the whole transaction.

        Pipeline mode sends BEGIN, the handler's statements, the offsets and
        COMMIT without waiting for each reply. But the server arms
        `idle_in_transaction_session_timeout` only at a Sync, and a pipeline
        has none before COMMIT: a fleet worker frozen mid-batch would keep its
        read-model row locks, and after the fence its lease row, locked until
        it resumed, and the range's next owner could never claim it. A fenced
        transaction is therefore pipelined only under `transaction_timeout`
        (PostgreSQL 17 and later: `Fence.transaction_limit`), which the server
        enforces while it waits for the rest of a pipeline; elsewhere it syncs
        every statement (`_fenced_transaction`).
        """
        fence = self._fence
        if fence is None:
            return _pipelined_transaction(conn)
        if pipelined:
            return _pipelined_transaction(conn, fence.transaction_limit())
        return _fenced_transaction(conn, fence)

    def _raise_offset_failure(self, error: Exception) -> None:
        """A lost lease or an offset conflict ends the instance at once: no retry can help."""
        failure = offset_error(error, self.tables, f"{self.name} {self.key}")
        if failure is not None:
            self._core.failed()
            _log.error("%s", failure, extra=self._extra("failed", error=str(failure)))
            raise failure from error

    def _call_at_least_once(self, envelopes: list[Envelope]) -> None:
        check_decoded(envelopes)
        for env in wanted(envelopes):
            self._handler(env)

    def _with_recovery(
        self,
        envelopes: list[Envelope],
        call: Callable[[list[Envelope]], None],
    ) -> bool:
        """Run `call` with the recovery strategy; True if the envelopes were dead-lettered."""
        strategy = self.recovery
        for attempt in range(1, strategy.attempts + 1):
            try:
                call(envelopes)
                return False
            except CancelledError:
                raise
            except Exception as error:
                self._raise_offset_failure(error)
                self._tel.handler_error(error, attempt, attempt < strategy.attempts)
                if attempt < strategy.attempts:
                    self.stats.retries += 1
                    _log.warning(
                        "projection %s %s: handler failed (attempt %d of %d): %s",
                        self.name,
                        self.key,
                        attempt,
                        strategy.attempts,
                        error,
                        extra=self._extra("retry", attempt=attempt, error=str(error)),
                    )
                    sleep(strategy.delay(attempt))
                    continue
                if strategy.on_failure is OnFailure.RETRY_AND_SKIP:
                    self._dead_letter(envelopes, error)
                    return True
                self._core.failed()
                first = envelopes[0]
                raise ProjectionError(
                    f"projection {self.name} {self.key} failed on {first.persistence_id!r} "
                    f"seq_nr {first.seq_nr} after {attempt} attempt(s): {error!r}"
                ) from error
        raise AssertionError("unreachable: at least one attempt")  # pragma: no cover

    def _dead_letter(self, envelopes: list[Envelope], error: Exception) -> None:
        """The dead-letter rows and (exactly-once, grouped) the offsets, in one transaction."""
        text = f"{type(error).__name__}: {error}"
        try:
            with self.journal.pool.connection() as conn, conn.transaction():
                insert_dead_letters(conn, self._management, self.name, self.key, envelopes, text)
                if self.mode is not Mode.AT_LEAST_ONCE:
                    records = [record_of(e) for e in envelopes]
                    self._dao.save(conn, self.key, records, self._fence)
        except Exception as failure:
            self._raise_offset_failure(failure)
            raise
        self._tel.dead_lettered(len(envelopes))
        _log.error(
            "projection %s %s skipped %d envelope(s) after retries: %s",
            self.name,
            self.key,
            len(envelopes),
            text,
            extra=self._extra("dead_letter", events=len(envelopes), error=text),
        )

    def _extra(self, event: str, **more: object) -> dict[str, object]:
        """A lifecycle log line's structured fields: projection, range, the event, `more`."""
        return {**self._fields, "event": event, **more}

    # -- pause, cleanup -------------------------------------------------------------------------

    def _paused(self) -> bool:
        with self.journal.pool.connection() as conn:
            paused = range_is_paused(conn, self._management, self.name, self.slice_range)
        if paused != self._was_paused:
            self._was_paused = paused
            what = "paused" if paused else "resumed"
            _log.info("projection %s %s %s", self.name, self.key, what, extra=self._extra(what))
        return paused

    def _cleanup(self) -> None:
        with self.journal.pool.connection() as conn:
            deleted = self._dao.cleanup(
                conn,
                self.slice_range,
                self.settings.time_window,
                self.settings.delete_after_consumed,
            )
        self._core.cleaned_up(deleted)


def check_pools(journal: SyncJournal) -> None:
    """Test the idle connections of the journal's pools and replace the broken ones
    (never raises): after a connection failure, and before a group starts, so that a
    restarted instance does not fail at once on a connection whose backend is gone."""
    for pool in (journal.pool, journal.read_pool):
        with contextlib.suppress(Exception):
            pool.check()


def _ended_by_handler(conn: Connection[Any], pipelined: bool) -> bool:
    """Whether the handler committed or rolled back the batch's transaction itself.

    In a pipeline (with a Sync after BEGIN) the transaction shows as active while
    results are pending and as open once they are read; idle only after a handler's
    `commit()` or `rollback()`, which psycopg syncs. A raw `COMMIT` statement, which
    a pipeline reports only at its next Sync, goes unseen there."""
    status = conn.info.transaction_status
    if pipelined:
        return status == TransactionStatus.IDLE
    return status != _IN_TRANSACTION


# psycopg has no public way to send a Sync without waiting for the server's reply to
# it; `_send_sync` runs its pipeline's own steps, whose presence is checked once.
# Without them it syncs and waits: the same transaction, one more wait per batch.
SYNC_WITHOUT_WAIT: bool = all(
    hasattr(Pipeline, step) for step in ("_enqueue_sync", "_communicate_gen")
)


def _send_sync(conn: Connection[Any], pipeline: Pipeline) -> None:
    """Send a Sync after what `pipeline` has queued, without waiting for the reply. The
    reply (which tells libpq whether a transaction is open) is read in order, before
    the result of any statement sent after it."""
    if not SYNC_WITHOUT_WAIT:
        pipeline.sync()
        return
    with conn.lock:
        pipeline._enqueue_sync()
        conn.wait(pipeline._communicate_gen())


@contextlib.contextmanager
def _pipelined_transaction(
    conn: Connection[Any], limit: tuple[Any, Any] | None = None
) -> Iterator[None]:
    """BEGIN, `limit` (a statement), the block's statements and COMMIT sent as one
    pipeline, with one wait for the server, at its end.

    psycopg's `transaction()` inside a pipeline opens two nested pipelines and
    syncs at the end of each: three waits for the server per batch instead of
    one, and about 190 µs more client CPU per transaction (measured on a local
    server). A failed statement makes the server skip the rest, COMMIT
    included, up to the next Sync; whatever the block left open (a failed
    transaction, or one the block left by raising) is rolled back afterwards.
    The pool's connections autocommit, so psycopg sends no BEGIN of its own.
    A Sync follows BEGIN (`_send_sync`, not waited for): libpq learns that a
    transaction is open only from the server's reply to a Sync, and psycopg
    decides from it whether a handler's own `conn.transaction()` is a savepoint.
    Without it, once the handler had read a result, psycopg saw the connection
    idle and made that block a BEGIN and COMMIT of the batch's writes so far,
    committed before the offsets (and `_ended_by_handler` could not tell).
    """
    try:
        with conn.pipeline() as pipeline:
            conn.execute("BEGIN")
            if limit is not None:
                conn.execute(*limit)
            _send_sync(conn, pipeline)
            try:
                yield
                # A statement that failed on the server may surface only here, when
                # the pipeline reads its results (late on a busy machine).
                conn.execute("COMMIT")
            except BaseException:
                # Collect the results now, the skipped ones too: left for the
                # pipeline's exit, each would be logged as an "ignored" error.
                with contextlib.suppress(psycopg.Error):
                    pipeline.sync()
                raise
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()
        raise


@contextlib.contextmanager
def _fenced_transaction(conn: Connection[Any], fence: Fence) -> Iterator[None]:
    """A fenced handler transaction: every statement waits for the server (see
    `_round_trips`), and it starts with BEGIN and its idle limit in one query
    (`Fence.begin`), one wait instead of two. A nested `conn.transaction()` of the
    handler becomes a savepoint, as psycopg sees the transaction open."""
    try:
        conn.execute(fence.begin())
        yield
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()
        raise
    conn.commit()


def run_fenced(projection: SyncProjection, fence: Fence) -> ProjectionStats:
    """Run `projection` live with every offset transaction fenced by a fleet worker's
    lease: each first proves the lease is still held, else it rolls back and this
    raises `LeaseLost`. For the fleet worker; not a mode of `SyncProjection.run`."""
    return projection._run_guarded(fence, until_caught_up=False)

"""`SyncProjection`: an exactly-once projection for code without an event loop.

A batch script, a Django management command or a Spark executor projects one
slice range synchronously. It shares everything that decides with the async
runner — the offset store (`OffsetState`, the same rows in the same table),
the projection core (`projections.core.admit`, answered here with blocking
calls) and the progress markers — so a projection run synchronously can be
resumed by the async runner, and the other way round.

Scope today: exactly-once delivery (one transaction per envelope: the
handler's writes and the offset rows), recovery by `fail` or
`retry_and_fail`. Pause/resume and dead letters are the async runner's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from psycopg import Connection

from journal.errors import InvalidArgument
from journal.model import EventEnvelope
from journal.settings import QuerySettings
from journal.slices import SliceRange
from journal.sync_journal import SyncJournal
from projections.core import (
    MissingEvents,
    PreviousTimestamp,
    ProjectionStats,
    Request,
    admit,
    converse,
    progress_markers,
    record_of,
)
from projections.names import check_instance
from projections.offset_dao import SyncOffsetDao
from projections.offset_store import OffsetState, Record
from projections.recovery import OnFailure, RecoveryStrategy
from projections.runner import ProjectionError
from projections.settings import ProjectionSettings

_log = logging.getLogger("slicejournal.projections.sync_runner")

SyncHandler = Callable[[Connection[Any], EventEnvelope], None]


class SyncProjection:
    """One exactly-once projection instance over one slice range, run in the caller's thread."""

    def __init__(
        self,
        journal: SyncJournal,
        *,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        handler: SyncHandler,
        settings: ProjectionSettings | None = None,
        recovery: RecoveryStrategy | None = None,
        query_settings: QuerySettings | None = None,
    ) -> None:
        instance = check_instance(name, entity_type, slice_range, handler)
        recovery = recovery or RecoveryStrategy.fail()
        if recovery.on_failure is OnFailure.RETRY_AND_SKIP:
            raise InvalidArgument("the synchronous runner supports fail and retry_and_fail")
        self.journal = journal
        self.name = instance.name
        self.entity_type = instance.entity_type
        self.slice_range = instance.slice_range
        self.key = instance.key
        self.settings = settings or ProjectionSettings()
        self.recovery = recovery
        self.query_settings = query_settings
        self.stats = ProjectionStats()
        self._handler = handler
        self._dao = SyncOffsetDao(journal.tables, self.name)
        self._stop = threading.Event()
        self._state: OffsetState | None = None
        self._progress_saved_at = 0.0

    def stop(self) -> None:
        """Ask `run` (in another thread) to return after the envelope in hand."""
        self._stop.set()

    def run(self, *, until_caught_up: bool = False) -> ProjectionStats:
        """Project until `stop()` (checked at least every `heartbeat_interval`), or with
        `until_caught_up` up to the database time at the start, then return (a backfill;
        a live runner started later resumes from there and re-reads the backtracking
        window). Raises `ProjectionError` if the handler keeps failing.
        """
        with self.journal.pool.connection() as conn:
            state = self._state = OffsetState(
                self.settings.time_window, self._dao.load(conn, self.slice_range)
            )
        start = state.start_offset(self.slice_range)
        _log.info("projection %s %s started (sync exactly_once)", self.name, self.key)
        r = self.slice_range
        stream = (
            self.journal.current_events_by_slices(
                self.entity_type, r.min_slice, r.max_slice, start, settings=self.query_settings
            )
            if until_caught_up
            else self.journal.events_by_slices(
                self.entity_type,
                r.min_slice,
                r.max_slice,
                start,
                heartbeats=True,
                settings=self.query_settings,
            )
        )
        try:
            with contextlib.closing(stream):
                for env in stream:
                    if self._stop.is_set():
                        break
                    if env.is_heartbeat:  # only a chance to notice stop()
                        self.stats.heartbeats += 1
                        continue
                    conversation = admit(state, env, self.stats, where=f"{self.name} {self.key}")
                    for accepted in converse(conversation, self._answer):
                        self._commit(accepted, env)
                    if env.source == "query" and env.offset is not None:
                        self.stats.latest_timestamp = env.offset.timestamp
        finally:
            self._stop.clear()
        _log.info(
            "projection %s %s stopped: %d accepted, %d duplicates",
            self.name,
            self.key,
            self.stats.accepted,
            self.stats.duplicates,
        )
        return self.stats

    def _answer(self, request: Request) -> Any:
        if isinstance(request, PreviousTimestamp):
            return self.journal.timestamp_of(request.persistence_id, request.seq_nr)
        if isinstance(request, MissingEvents):
            return list(
                self.journal.current_events_by_persistence_id(
                    request.persistence_id, request.from_seq_nr, request.to_seq_nr
                )
            )
        return self.journal.load_envelope(request.persistence_id, request.seq_nr)

    def _markers(self, progress: EventEnvelope) -> list[Record]:
        # Only positions of the normal query count as progress (a backtracking
        # envelope's offset lies behind it).
        if self._state is None or progress.offset is None or progress.source != "query":
            return []
        return progress_markers(
            self._state,
            self.slice_range,
            progress.offset.timestamp,
            self._progress_saved_at,
            time.monotonic(),
            self.settings.progress_interval,
        )

    def _commit(self, env: EventEnvelope, delivered: EventEnvelope) -> None:
        """Handler and offset rows in one transaction, with the recovery strategy."""
        if self._state is None:
            raise ProjectionError(f"projection {self.name} {self.key} is not running")
        records = [record_of(env), *self._markers(delivered)]
        attempts = self.recovery.attempts
        for attempt in range(1, attempts + 1):
            try:
                with self.journal.pool.connection() as conn, conn.transaction():
                    self._handler(conn, env)
                    self._dao.save(conn, self.key, records)
                break
            except Exception as error:
                if attempt < attempts:
                    self.stats.retries += 1
                    _log.warning(
                        "projection %s %s: handler failed (attempt %d of %d): %s",
                        self.name, self.key, attempt, attempts, error,
                    )  # fmt: skip
                    time.sleep(self.recovery.delay(attempt))
                    continue
                self._state.discard_inflight()
                _log.error("projection %s %s failed: %s", self.name, self.key, error)
                raise ProjectionError(
                    f"projection {self.name} {self.key} failed on {env.persistence_id!r} "
                    f"seq_nr {env.seq_nr} after {attempt} attempt(s): {error!r}"
                ) from error
        self._saved(records)

    def _saved(self, records: list[Record]) -> None:
        if self._state is not None:
            self._state.saved(records)
        self.stats.transactions += 1
        if any(r.is_progress for r in records):
            self._progress_saved_at = time.monotonic()

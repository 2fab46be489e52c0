"""`SyncProjection`: an exactly-once projection for code without an event loop.

A batch script, a Django management command or a Spark executor projects one
slice range synchronously. It shares everything that decides with the async
runner — the projection core (`projections.core.ProjectionCore`: validation,
gap fills, progress markers; its actions executed here with blocking calls)
and the offset store (the same rows in the same table, built by the same
`OffsetSql`) — so a projection run synchronously can be resumed by the async
runner, and the other way round.

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
    Action,
    Commit,
    LoadPayload,
    MissingEvents,
    Mode,
    PreviousTimestamp,
    ProjectionCore,
    ProjectionStats,
    SaveOffsets,
)
from projections.errors import ProjectionError
from projections.fencing import offset_error
from projections.names import check_instance
from projections.offset_dao import SyncOffsetDao
from projections.recovery import OnFailure, RecoveryStrategy, check_decoded
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
        self._core = ProjectionCore(
            Mode.EXACTLY_ONCE,
            self.settings,
            self.slice_range,
            stats=self.stats,
            where=f"{self.name} {self.key}",
            log=_log,
        )

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
            start = self._core.start(self._dao.load(conn, self.slice_range))
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
                    self._drive(self._core.offer(env, time.monotonic()))
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

    def _drive(self, action: Action | None) -> None:
        """Execute the core's actions, feeding each outcome back, until it has none."""
        core = self._core
        while action is not None:
            if isinstance(action, PreviousTimestamp):
                previous = self.journal.timestamp_of(action.persistence_id, action.seq_nr)
                action = core.answer(previous, time.monotonic())
            elif isinstance(action, MissingEvents):
                missing = self.journal.current_events_by_persistence_id(
                    action.persistence_id, action.from_seq_nr, action.to_seq_nr
                )
                action = core.answer(list(missing), time.monotonic())
            elif isinstance(action, LoadPayload):
                loaded = self.journal.load_envelope(action.persistence_id, action.seq_nr)
                action = core.answer(loaded, time.monotonic())
            elif isinstance(action, Commit):
                self._commit(action)
                action = core.committed(time.monotonic())
            elif isinstance(action, SaveOffsets):
                with self.journal.pool.connection() as conn, conn.transaction():
                    self._dao.save(conn, self.key, action.records)
                action = core.committed(time.monotonic())
            else:  # Handle: at-least-once, never asked of an exactly-once core
                raise ProjectionError(f"unexpected {action!r}")

    def _commit(self, commit: Commit) -> None:
        """Handler and offset rows in one transaction, with the recovery strategy."""
        attempts = self.recovery.attempts
        for attempt in range(1, attempts + 1):
            try:
                check_decoded(commit.envelopes)
                with self.journal.pool.connection() as conn, conn.transaction():
                    for env in commit.envelopes:
                        self._handler(conn, env)
                    self._dao.save(conn, self.key, commit.records)
                return
            except Exception as error:
                failure = offset_error(error, self.journal.tables, f"{self.name} {self.key}")
                if failure is not None:
                    self._core.failed()
                    raise failure from error
                if attempt < attempts:
                    self.stats.retries += 1
                    _log.warning(
                        "projection %s %s: handler failed (attempt %d of %d): %s",
                        self.name, self.key, attempt, attempts, error,
                    )  # fmt: skip
                    time.sleep(self.recovery.delay(attempt))
                    continue
                self._core.failed()
                _log.error("projection %s %s failed: %s", self.name, self.key, error)
                first = commit.envelopes[0]
                raise ProjectionError(
                    f"projection {self.name} {self.key} failed on {first.persistence_id!r} "
                    f"seq_nr {first.seq_nr} after {attempt} attempt(s): {error!r}"
                ) from error

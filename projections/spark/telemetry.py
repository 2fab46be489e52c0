"""A Spark projection's telemetry, reported from the driver.

The sink runs on executors and PySpark calls the writer's `commit` in a
Python worker process of its own, so neither can reach the telemetry hook a
user installed in the application. The driver can: it owns the
`StreamingQuery`. A daemon thread here follows `query.lastProgress` and
reports each finished micro-batch (its input rows and duration) to the
projection's instance hook (runner "spark"), and, when the hook samples
backlogs, reads each partition range's backlog with the same statement as
every other runner — so a Spark run appears in the same series as an
in-process or fleet one. It ends with the query.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from journal.filter import EventFilter
from journal.query.source import EVENTS, RowSource
from journal.settings import JournalSettings
from journal.slices import SliceRange
from journal.sync.pool import open_connection
from journal.tables import Tables
from projections.management_sql import ManagementSql
from projections.settings import ProjectionTableNames
from projections.sync.offset_dao import read_backlog
from projections.tables import projection_tables
from projections.telemetry import InstanceTelemetry, Telemetry

_log = logging.getLogger("slicejournal.projections.spark")

# How often the driver looks at the query's progress.
POLL_SECONDS = 0.5
# How long the end of the query's report waits for its leases to be given back.
RELEASE_WAIT_SECONDS = 10.0


def batch_of(progress: Any) -> tuple[int, int, float] | None:
    """(batch id, input rows, seconds) of a `StreamingQuery.lastProgress`, or None."""
    if not progress:
        return None
    try:
        batch = int(progress["batchId"])
        rows = int(progress.get("numInputRows", 0))
        millis = float((progress.get("durationMs") or {}).get("triggerExecution", 0))
    except (KeyError, TypeError, ValueError):
        return None
    return batch, rows, millis / 1000


class SparkQueryTelemetry:
    """Reports one Spark projection's batches and backlog, from the driver."""

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        dsn: str,
        settings: JournalSettings,
        name: str,
        entity_type: str,
        slice_range: SliceRange,
        ranges: tuple[SliceRange, ...],
        backlog_interval: float,
        holder: str | None = None,
        epochs: tuple[int, ...] = (),
        released: Callable[[float], None] | None = None,
        tables: ProjectionTableNames | None = None,
        event_filter: EventFilter | None = None,
        source: RowSource[Any] = EVENTS,
    ) -> None:
        """`holder`: the lease owner (`spark:<query id>`), reported with the `epochs` of
        the `ranges`' leases as claimed when watching starts and released when it ends.
        `released(timeout)` waits until the leases are given back, so the report never
        runs ahead of the lease table (`status` read after it shows the ranges free).
        `tables`: the names of the projections' tables, if not the defaults;
        `event_filter`: the projection's (the backlog counts what it lets through);
        `source`: what it reads (`STATE_CHANGES`: the backlog counts durable state)."""
        self.name = name
        self._telemetry = telemetry
        self._holder = holder
        self._epochs = epochs
        self._released = released
        self.entity_type = entity_type
        self.instance: InstanceTelemetry = telemetry.instance(name, slice_range.key, "spark")
        self.ranges = {r: telemetry.instance(name, r.key, "spark") for r in ranges}
        self._dsn = dsn
        self._settings = settings
        self._statements = ManagementSql(projection_tables(Tables(settings), tables))
        self._backlog_interval = backlog_interval
        self._filter = event_filter
        self._source = source
        self._thread: threading.Thread | None = None

    def watch(self, query: Any) -> None:
        """Follow `query` from a daemon thread until it ends."""
        self.instance.started()
        if self._holder is not None:
            for r, epoch in zip(self.ranges, self._epochs, strict=False):
                self._telemetry.lease_claimed(self.name, r.key, self._holder, epoch)
        self._thread = threading.Thread(
            target=self._follow, args=(query,), name=f"slicejournal telemetry {self.name}"
        )
        self._thread.daemon = True
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread (it ends soon after the query)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _follow(self, query: Any) -> None:
        last_batch = -1
        next_sample = time.monotonic()
        error: BaseException | None = None
        try:
            while True:
                active = bool(query.isActive)
                last_batch = self._report_progress(query.lastProgress, last_batch)
                if not active:
                    break
                if time.monotonic() >= next_sample and any(
                    t.samples_backlog for t in self.ranges.values()
                ):
                    next_sample = time.monotonic() + self._backlog_interval
                    self._sample_backlogs()
                time.sleep(POLL_SECONDS)
            with contextlib.suppress(Exception):
                failure = query.exception()
                error = None if failure is None else RuntimeError(str(failure))
        except Exception as e:  # telemetry must never take the query down
            _log.warning("telemetry of spark projection %s stopped: %s", self.name, e)
        finally:
            if self._released is not None:
                with contextlib.suppress(Exception):
                    self._released(RELEASE_WAIT_SECONDS)
            if self._holder is not None:
                for r in list(self.ranges)[: len(self._epochs)]:
                    self._telemetry.lease_released(self.name, r.key, self._holder)
            self.instance.stopped(error)

    def _report_progress(self, progress: Any, last_batch: int) -> int:
        batch = batch_of(progress)
        if batch is None or batch[0] == last_batch:
            return last_batch
        batch_id, rows, seconds = batch
        token = self.instance.batch_started(rows)
        self.instance.batch_ended(token, rows, seconds, None)
        return batch_id

    def _sample_backlogs(self) -> None:
        try:
            with open_connection(self._dsn, self._settings) as conn:
                for r, tel in self.ranges.items():
                    if tel.samples_backlog:
                        backlog = read_backlog(
                            conn, self._statements, self.name, self.entity_type, r,
                            event_filter=self._filter, source=self._source,
                        )  # fmt: skip
                        tel.backlog_sampled(backlog)
        except Exception as e:  # a missed sample; the next one may succeed
            _log.debug("backlog sample of spark projection %s failed: %s", self.name, e)

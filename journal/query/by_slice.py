"""The slice query as a sans-I/O state machine.

This object decides *what to ask the database next* and *what each returned
row means*, but never talks to the database itself: the driver in
`journal/aio/slice_reader.py` (and its generated sync twin) executes its
requests and feeds the rows back. Keeping it pure
means the subtle parts (late commits, backtracking, ties, bounded catch-up)
are tested in microseconds without a server, and a sync driver (Spark
executors) can reuse it unchanged.

Why the query stays behind the clock: `db_timestamp` is the *start* of the
writing transaction, so an event can become visible after events with later
timestamps. The normal query only reads rows older than
`now - behind_current_time`, and a backtracking query periodically re-reads a
window in the past (`window + backtracking.behind_current_time` before the
latest offset, never past it) to pick up what committed late. Backtracking
rows are emitted without payload; the offset store drops the duplicates.

Why `seen`: several events can share one timestamp (an atomic write, or many
writers in one transaction). A query resumes *at* the latest timestamp and
excludes the (pid, seq_nr) pairs already emitted there, so even more than
`buffer_size` rows at one timestamp never stall it.

Why the horizon: with it (see `horizon.py`) a live query reads exactly up to
where no row can still appear, instead of `behind_current_time` behind the
clock, so a transaction of any length is never passed while it is open, and the
tail is not held back when nothing is in flight. Before each live query the
machine asks for a `HorizonQuery`; open transactions it does not wait for are
remembered, and once one ends a backtracking run re-reads from its start.

Why buckets: far behind the tail, `ORDER BY db_timestamp` over everything
after the offset would sort the rest of the journal on every poll, so bucket
counts bound each catch-up scan (see `buckets.py`).

The state lives in small immutable parts, each with its own tests, as Pekko's
`QueryState` reads: `ScanPosition` (`scan.py`), `BucketTracker`
(`buckets.py`), `BacktrackingTracker` (`backtracking.py`), `HorizonTracker`
(`horizon_tracker.py`) and `TailTracker` (`tail.py`). This class holds them,
the explicit `Mode`, the query in flight and the timing of waits and
heartbeats, and decides which part is asked what.
"""

from __future__ import annotations

import copy
import enum
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from journal.errors import InvalidArgument, ProtocolError
from journal.model import TimestampOffset
from journal.query.backtracking import BacktrackingTracker
from journal.query.buckets import (
    BUCKET_SECONDS,
    CHUNK_BUFFERS,
    Bucket,
    BucketTracker,
    bucket_start,
)
from journal.query.horizon import Horizon
from journal.query.horizon_tracker import HorizonTracker
from journal.query.scan import ScanPosition
from journal.query.tail import TailTracker
from journal.rows import ROW_DB_TIMESTAMP, ROW_PID, ROW_SEQ_NR, Emitted
from journal.settings import QuerySettings
from journal.slices import SliceRange, validate_entity_type

__all__ = [
    "BUCKET_SECONDS",
    "Bucket",
    "BucketsQuery",
    "BySliceQuery",
    "Done",
    "HeartbeatDue",
    "HorizonQuery",
    "Mode",
    "Request",
    "RowsQuery",
    "Wait",
    "bucket_start",
    "check_slice_query",
    "warn_if_unfinished",
]

# Every decision (mode switch, backtracking start and end, bucket bound, wait)
# is logged at DEBUG, as Pekko's query logs each of its own.
_log = logging.getLogger("slicejournal.journal.query")

# After a notification, query once the notified event is older than
# behind_current_time, plus this much for the trip to the server.
NOTIFICATION_MARGIN = 0.005


@attrs.frozen
class RowsQuery:
    """Read journal rows of the slice range, ordered by (db_timestamp, seq_nr).

    Rows with `db_timestamp >= from_timestamp` are read, except those at exactly
    `from_timestamp` whose seq_nr is <= `exclude[pid]`. `to_inclusive` and
    `until_exclusive` bound the scan from above; live queries also stay below
    the visibility `horizon`, or, without one, `behind_current_time` behind
    the database clock. `limit=None` means a chunk bounded by `until_exclusive`
    that is streamed whole, or, with no `until_exclusive`, a current query's last
    statement: the rest up to `to_inclusive`.
    """

    backtracking: bool
    from_timestamp: datetime
    exclude: Mapping[str, int]
    to_inclusive: datetime | None
    until_exclusive: datetime | None
    behind_current_time: timedelta | None
    limit: int | None
    horizon: datetime | None = None

    @property
    def with_payload(self) -> bool:
        return not self.backtracking


@attrs.frozen
class BucketsQuery:
    """Count non-deleted rows per 10-second bucket from `from_timestamp` on.

    `until_exclusive` is the end of a window of `limit` buckets: ordered by
    time across a slice range, the count cannot stop at `limit` buckets and
    would otherwise read every row to the end of the journal on each count,
    which makes a catch-up from far back cost the square of its length.
    """

    from_timestamp: datetime
    to_inclusive: datetime | None
    limit: int
    until_exclusive: datetime | None = None


@attrs.frozen
class HorizonQuery:
    """Read the open transactions (`journal.query.sql.horizon`) and report `on_horizon`."""


@attrs.frozen
class Wait:
    """Sleep until monotonic time `until`, or earlier if a notification arrives."""

    until: float


@attrs.frozen
class HeartbeatDue:
    """Nothing arrived for `heartbeat_interval`: read the database time and emit a heartbeat."""


@attrs.frozen
class Done:
    """A `current` query has reached the database time at its start."""


Request = RowsQuery | BucketsQuery | HorizonQuery | Wait | HeartbeatDue | Done


class Mode(enum.Enum):
    """Which kind of query the stream runs next.

    NORMAL -> BACKTRACKING when a run is due before a normal query;
    BACKTRACKING -> AFTER_BACKTRACKING when a run's query returns fewer rows
    than its limit; AFTER_BACKTRACKING -> NORMAL at the next decision past the
    horizon reading, which is never a run, so a window with nothing to re-read
    cannot make the two ping-pong; NORMAL or AFTER_BACKTRACKING -> DONE when a
    current query has read everything up to its end. Whether the normal query
    is a bounded catch-up chunk is the `BucketTracker`'s business; past its last
    bound a current query reads the rest at once and a live one polls with LIMIT
    (`_normal_query`).
    """

    NORMAL = "normal"
    BACKTRACKING = "backtracking"
    AFTER_BACKTRACKING = "after backtracking"
    DONE = "done"


def check_slice_query(
    entity_type: object, min_slice: object, max_slice: object, offset: object
) -> None:
    """Validate a slice query's arguments (both drivers), before any I/O."""
    validate_entity_type(entity_type)
    SliceRange(min_slice, max_slice)  # type: ignore[arg-type]  # validates both
    if offset is not None and not isinstance(offset, TimestampOffset):
        raise InvalidArgument(
            f"offset must be a TimestampOffset or None, got {type(offset).__name__}"
        )


class BySliceQuery:
    """Decides the next query of one slice-range stream and interprets its rows.

    Protocol, driven by the caller::

        while True:
            req = q.next_request(now)
            RowsQuery    -> for each row: offset = q.on_row(row, read_ts);
                            emit if not None (or per batch of rows, each
                            ending with its read_ts: emit what
                            q.on_rows(rows) returns); then q.on_rows_done()
            HorizonQuery -> q.on_horizon(horizon_from_row(row))
            BucketsQuery -> q.on_buckets([(bucket_start, count), ...])
            Wait         -> sleep until req.until, or until a notification
                            (report it with q.on_notification(now))
            HeartbeatDue -> offset = q.on_heartbeat(db_now, now); emit a heartbeat
            Done         -> stop

    `now` is a monotonic clock in seconds; notifications are reported with
    `on_notification(now)` at any time.
    """

    def __init__(
        self,
        settings: QuerySettings,
        offset: TimestampOffset | None = None,
        *,
        live: bool = True,
        end: datetime | None = None,
        heartbeats: bool = False,
        now: float,
    ) -> None:
        if not live and end is None:
            raise InvalidArgument("a current (non-live) query needs the end timestamp")
        self.settings = settings
        self.live = live
        self.end = end
        self.heartbeats = heartbeats and live
        start = offset or TimestampOffset.zero()
        self._mode = Mode.NORMAL
        self._scan = ScanPosition.at(start)
        self._buckets = BucketTracker(settings.buffer_size, settings.bucket_limit)
        self._backtracking = BacktrackingTracker.resuming_from(
            settings.backtracking, settings.buffer_size, start
        )
        self._horizon = HorizonTracker.for_stream(settings.horizon, live)
        self._tail = TailTracker()
        # The RowsQuery in flight, the rows it returned so far, and the database
        # time its last emitted row was read at (None: it emitted none).
        self._current: RowsQuery | None = None
        self._rows = 0
        self._read_at: datetime | None = None
        self._wait: Wait | None = None
        self._pending_notifications: list[float] = []
        self._last_emit = now
        self._asked_at = now
        # Whether the last normal LIMIT query (live; a current query's last statement
        # sets it False) came back full: a burst at the tail.
        self._tail_full = False
        # Statistics for tests and benchmarks.
        self.queries = 0
        self.backtracking_queries = 0
        self.bucket_queries = 0

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def latest(self) -> TimestampOffset:
        """What normal queries have emitted: the stream's offset."""
        return self._scan.latest

    @property
    def latest_backtracking(self) -> TimestampOffset | None:
        return self._backtracking.position

    @property
    def backtracking(self) -> bool:
        return self._mode is Mode.BACKTRACKING

    @property
    def done(self) -> bool:
        return self._mode is Mode.DONE

    # -- decisions --------------------------------------------------------

    def next_request(self, now: float) -> Request:
        """What the driver should do next (call again after a wait or a notification)."""
        self._asked_at = now
        if self._mode is Mode.DONE:
            return Done()
        if self.heartbeats and now >= self._heartbeat_due():
            return HeartbeatDue()
        if self._wait is not None:
            if now < self._wait.until:
                return Wait(min(self._wait.until, self._heartbeat_due()))
            self._wait = None
        if self._mode is not Mode.BACKTRACKING and self._horizon.reading_due:
            return HorizonQuery()
        if self._mode is Mode.AFTER_BACKTRACKING:
            self._mode = Mode.NORMAL
        elif self._mode is Mode.NORMAL and self._backtracking_due():
            self._start_backtracking()
        if self._mode is Mode.BACKTRACKING:
            return self._rows_query(self._backtracking_query())
        scan_from = self._scan.scan_from
        if self._buckets.needs_count(scan_from):
            self.bucket_queries += 1
            return BucketsQuery(
                scan_from,
                self.end,
                self.settings.bucket_limit,
                self._buckets.window_end(scan_from),
            )
        return self._rows_query(self._normal_query(now))

    def next_chunk_if_whole(self, now: float) -> RowsQuery | None:
        """The chunk `next_request` asks for after the one being read (a bounded chunk,
        or a current query's last statement), if that one is read whole and no bucket
        count comes between; None when there is none or it cannot be known yet.

        The chunk's statement does not depend on the rows still coming, so the driver
        may start it early on another connection, and the server finds and sorts its
        rows while the client decodes these; the driver reads it only if the next
        request equals it. Only for a stream that is not live: a live stream's next
        chunk is bounded by a horizon reading taken after this one ends.
        """
        query = self._current
        if (
            self.live
            or query is None
            or query.backtracking
            or query.limit is not None
            or query.until_exclusive is None
        ):
            return None
        # What this query would do, on a copy: its parts are immutable values.
        ghost = copy.copy(self)
        ghost._pending_notifications = list(self._pending_notifications)
        ghost.on_rows_done(now)
        request = ghost.next_request(now)
        if isinstance(request, RowsQuery) and request.limit is None:
            return request
        return None

    def _heartbeat_due(self) -> float:
        if not self.heartbeats:
            return float("inf")
        return self._last_emit + self.settings.heartbeat_interval.total_seconds()

    def _rows_query(self, query: RowsQuery) -> RowsQuery:
        self._current = query
        self._rows = 0
        self._read_at = None
        self.queries += 1
        if query.backtracking:
            self.backtracking_queries += 1
        return query

    def _backtracking_due(self) -> bool:
        # A transaction not waited for has ended: re-read from its start.
        return bool(self._horizon.ended) or self._backtracking.due(self.latest, self.live)

    def _start_backtracking(self) -> None:
        self._horizon, ended = self._horizon.start_backtracking()
        self._backtracking = self._backtracking.start(self.latest.timestamp, ended)
        self._mode = Mode.BACKTRACKING

    def _backtracking_query(self) -> RowsQuery:
        position = self._backtracking.position
        if position is None:
            raise ProtocolError("backtracking query before backtracking started")
        return RowsQuery(
            backtracking=True,
            from_timestamp=position.timestamp,
            exclude=dict(position.seen),
            # Up to where the normal scan has passed, which a bounded catch-up
            # chunk can move past the last emitted event: a row that commits
            # late inside that stretch is seen by no normal query again.
            to_inclusive=self._scan.scan_from,
            until_exclusive=None,
            behind_current_time=self._backtracking.behind_current_time,
            limit=self.settings.buffer_size,
        )

    def _normal_query(self, now: float) -> RowsQuery:
        bound = self._buckets.scan_bound(self._scan.scan_from, self.end)
        if self._pending_notifications:
            covered = now - self._lag()
            self._pending_notifications = [t for t in self._pending_notifications if t > covered]
        self._horizon, reading = self._horizon.use_reading()
        self._tail = self._tail.asking(held=reading is not None and reading.held)
        horizon = None if reading is None else reading.bound
        behind = None
        if self.live and horizon is None:
            behind = self.settings.behind_current_time
        # Past the last bound (none left, or the next one past `end`) a current query
        # reads the rest up to its end in one statement, streamed, rather than
        # `buffer_size` rows per LIMIT query. A live query is at the tail, where new
        # rows keep coming and the counts leave the newest, incomplete bucket out:
        # it reads with LIMIT, `buffer_size` rows at a time, or a chunk's worth while
        # its last LIMIT query came back full (a burst in the newest bucket, which the
        # counts leave out): each LIMIT query sorts everything after its start, so
        # reading a burst 1,000 rows at a time costs its square over 1,000.
        limit: int | None = None
        if bound is None and self.live:
            limit = self.settings.buffer_size
            if self._tail_full:
                limit *= CHUNK_BUFFERS
        return RowsQuery(
            backtracking=False,
            from_timestamp=self._scan.scan_from,
            exclude=dict(self._scan.exclude),
            to_inclusive=self.end,
            until_exclusive=bound,
            behind_current_time=behind,
            limit=limit,
            horizon=horizon,
        )

    def _lag(self) -> float:
        """Seconds after a commit until a live query can read it."""
        return self._horizon.lag(self.settings.behind_current_time).total_seconds()

    # -- results ----------------------------------------------------------

    def on_buckets(self, rows: Sequence[tuple[int, int]]) -> None:
        """Bucket counts (start in epoch seconds, count), ordered by start.

        The driver counts only complete buckets older than the query's lag, so
        no bound ever lies ahead of what a normal query may read.
        """
        self._buckets = self._buckets.on_counts(rows)
        if self._buckets.counts is not None:
            _log.debug(
                "catch-up bound from %d bucket counts: %s",
                len(rows),
                self._buckets.bound(self._scan.scan_from),
            )

    def on_horizon(self, horizon: Horizon) -> None:
        """A reading of the open transactions, taken just now, before the next query."""
        # The next normal query starts at this same scan position (a bucket count
        # may come between, a backtracking run uses the reading up).
        self._horizon = self._horizon.on_reading(horizon, self._scan.scan_from)

    def on_row(
        self, row: Sequence[Any], read_timestamp: datetime, now: float
    ) -> TimestampOffset | None:
        """The offset to emit the row with, or None if it was already emitted."""
        query = self._current
        if query is None:
            raise ProtocolError("on_row called outside a RowsQuery")
        self._rows += 1
        ts: datetime = row[ROW_DB_TIMESTAMP]
        pid: str = row[ROW_PID]
        seq_nr: int = row[ROW_SEQ_NR]
        if query.backtracking:
            backtracking = self._backtracking.emit(ts, pid, seq_nr, read_timestamp)
            if backtracking is None:
                return None
            self._backtracking = backtracking
            return backtracking.position
        scan = self._scan.emit(ts, pid, seq_nr, read_timestamp)
        if scan is None:
            return None
        self._scan = scan
        self._read_at = read_timestamp
        self._last_emit = now
        return scan.latest

    def on_rows(
        self, rows: Sequence[Sequence[Any]], now: float
    ) -> list[tuple[Sequence[Any], Emitted]]:
        """`on_row` for a batch of rows, each ending with the database time it was read
        at: the rows to emit, each with its offset (or its read time, where the offset
        is the row's own: `journal.rows.Emitted`), in order (the others were emitted
        already). The drivers feed every fetched batch through here."""
        query = self._current
        if query is None:
            raise ProtocolError("on_rows called outside a RowsQuery")
        if query.backtracking:
            emitted: list[tuple[Sequence[Any], Emitted]] = []
            for row in rows:
                offset = self.on_row(row, row[-1], now)
                if offset is not None:
                    emitted.append((row, offset))
            return emitted
        self._rows += len(rows)
        self._scan, emitted = self._scan.emit_rows(rows)
        if emitted:
            self._read_at = emitted[-1][0][-1]
            self._last_emit = now
        return emitted

    def on_rows_done(self, now: float) -> None:
        """The current RowsQuery has returned all its rows."""
        query = self._current
        if query is None:
            raise ProtocolError("on_rows_done called outside a RowsQuery")
        self._current = None
        rows = self._rows
        full = query.limit is not None and rows >= query.limit
        if query.backtracking:
            if not full:
                self._backtracking = self._backtracking.end_run(rows)
                self._mode = Mode.AFTER_BACKTRACKING
            return
        self._backtracking = self._backtracking.after_normal_query(rows)
        if query.until_exclusive is not None:
            # A bounded chunk was read whole: nothing more is below its bound (or
            # the horizon, if that is lower), so the next scan may start there.
            end = query.until_exclusive
            if query.horizon is not None:
                end = min(end, query.horizon)
            # Still catching up (a chunk is only asked for then): the counts still bound.
            self._scan = self._scan.skip_to(end)
            self._backtracked_by_reading(query)
            if end == query.until_exclusive:
                return
            # Held back by an open transaction: wait as at the tail.
            self._tail = self._tail.after_clipped_chunk(end)
        else:
            self._tail_full = full
            self._buckets = self._buckets.after_limit_query(full)
            self._backtracked_by_reading(query)
            if not full:
                self._tail = self._tail.after_tail_query(query.horizon, self._asked_at)
        if not self.live:
            if not full:
                self._mode = Mode.DONE
            return
        if full:
            return
        self._tail, delay = self._tail.poll(rows, self.settings)
        self._wait = Wait(now + delay)
        _log.debug("%d rows: waiting %.3f s before the next query", rows, delay)
        if self._pending_notifications:
            self._notification_wait()

    def _backtracked_by_reading(self, query: RowsQuery) -> None:
        if self._read_at is None or not self.live:
            return
        self._backtracking = self._backtracking.covered_by_normal_read(
            query.from_timestamp, self._scan.scan_from, self._read_at
        )

    def on_notification(self, now: float) -> None:
        """A NOTIFY for this range arrived: query as soon as its event is old enough."""
        if self._mode is Mode.DONE:
            return
        self._pending_notifications.append(now)
        if self._wait is not None:
            self._notification_wait()

    def _notification_wait(self) -> None:
        if self._wait is None:
            raise ProtocolError("notification wait without a wait")
        due = min(self._pending_notifications) + self._lag() + NOTIFICATION_MARGIN
        if due < self._wait.until:
            self._wait = Wait(due)

    def on_heartbeat(self, db_now: datetime, now: float) -> TimestampOffset:
        """Offset of an idle heartbeat: as far as the last query that reached the tail read."""
        self._last_emit = now
        reached = self._tail.reached(
            self.latest.timestamp,
            db_now,
            now,
            self.unfinished_reread,
            self.settings.behind_current_time,
        )
        return TimestampOffset(reached, db_now, {})

    @property
    def unfinished_reread(self) -> datetime | None:
        """The start of the oldest transaction not waited for and not re-read for yet.

        A stream closed while this is set relies on the next one: that sees the
        transaction if it is still open, but if it ended meanwhile, only
        backtracking's window covers it. The drivers log a warning, so such a
        miss is never silent.
        """
        reread = self._backtracking.reread
        due = [*self._horizon.rereads_due(), *([reread.start] if reread else [])]
        return min(due) if due else None


def warn_if_unfinished(machine: BySliceQuery, entity_type: str, min_slice: int) -> None:
    """Called by the drivers when a stream closes: say if a re-read was still due."""
    due = machine.unfinished_reread
    if due is not None:
        _log.warning(
            "slice stream %s from slice %d closed before re-reading from %s for a "
            "transaction it did not wait for; a stream resumed after that transaction "
            "ended covers it only within the backtracking window",
            entity_type,
            min_slice,
            due.isoformat(),
        )

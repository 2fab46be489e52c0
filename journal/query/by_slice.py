"""The slice query as a sans-I/O state machine.

This object decides *what to ask the database next* and *what each returned
row means*, but never talks to the database itself: the async driver in
`reader.py` executes its requests and feeds the rows back. Keeping it pure
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
after the offset would sort the rest of the journal on every poll. Counts per
10-second bucket give an upper timestamp that bounds each scan to about
`buffer_size` rows (at least one bucket); such a bounded chunk is streamed
without LIMIT, so each row is sorted once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from journal.errors import InvalidArgument, ProtocolError
from journal.model import EPOCH, TimestampOffset
from journal.query.horizon import Horizon, Split, split
from journal.rows import ROW_DB_TIMESTAMP, ROW_PID, ROW_SEQ_NR
from journal.settings import QuerySettings
from journal.slices import SliceRange, validate_entity_type

# Every decision (mode switch, backtracking start and end, bucket bound, wait)
# is logged at DEBUG, as Pekko's query logs each of its own.
_log = logging.getLogger("slicejournal.journal.query")

BUCKET_SECONDS = 10
IDLE_POLLS_BEFORE_BACKTRACKING = 5
BACKTRACKING_AFTER_BUFFERS = 3
# After a notification, query once the notified event is older than
# behind_current_time, plus this much for the trip to the server.
NOTIFICATION_MARGIN = 0.005
# While an open transaction holds the horizon back, poll again after this, doubling
# up to the refresh interval: most such transactions are a few milliseconds long.
HELD_POLL = 0.01


@attrs.frozen
class RowsQuery:
    """Read journal rows of the slice range, ordered by (db_timestamp, seq_nr).

    Rows with `db_timestamp >= from_timestamp` are read, except those at exactly
    `from_timestamp` whose seq_nr is <= `exclude[pid]`. `to_inclusive` and
    `until_exclusive` bound the scan from above; live queries also stay below
    the visibility `horizon`, or, without one, `behind_current_time` behind
    the database clock. `limit=None` means a chunk bounded by `until_exclusive`
    that is streamed whole.
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


@attrs.frozen
class Bucket:
    """Number of rows whose db_timestamp falls in [start, start + 10 s)."""

    start: int  # epoch seconds, a multiple of BUCKET_SECONDS
    count: int


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


def bucket_start(ts: datetime) -> int:
    """The start (epoch seconds) of the bucket holding `ts`."""
    return int((ts - EPOCH).total_seconds() // BUCKET_SECONDS) * BUCKET_SECONDS


class BySliceQuery:
    """Decides the next query of one slice-range stream and interprets its rows.

    Protocol, driven by the caller::

        while True:
            req = q.next_request(now)
            RowsQuery    -> for each row: offset = q.on_row(row, read_ts);
                            emit if not None; then q.on_rows_done()
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
        # What has been emitted by normal queries (the stream's offset).
        self.latest = start
        self._latest_seen: dict[str, int] = dict(start.seen)
        # Where the next normal scan starts; runs ahead of `latest` after a
        # bounded chunk that held no more rows.
        self._scan_from = start.timestamp
        self._scan_seen: Mapping[str, int] = self._latest_seen
        # Backtracking position (None until the first backtracking query).
        self.latest_backtracking: TimestampOffset | None = None
        # Before the first backtracking run: where it may start without re-reading
        # anything it must. From the beginning, nothing lies before; a stream that
        # resumes first re-reads a window before its offset, as it always did.
        self._backtracked_to: datetime | None = EPOCH if start.timestamp == EPOCH else None
        self._bt_seen: dict[str, int] = {}
        self.backtracking = False
        self._after_backtracking = False
        self._buckets: list[Bucket] | None = None
        # The last windowed count was empty: count once to the end, to cross a gap
        # (so the count asked for, and being answered, is windowed unless this is set).
        self._count_unbounded = False
        self._buckets_complete = False
        self._current: RowsQuery | None = None
        self._rows = 0
        self._last_full = True  # unknown position: count buckets before the first scan
        self._idle_polls = 0
        self._rows_since_backtracking = 0
        self._read_at: datetime | None = None  # database time of the current query
        self._wait: Wait | None = None
        self._pending_notifications: list[float] = []
        self._last_emit = now
        # When (monotonic) the last normal query that reached the tail was asked
        # for: everything older than the database time then, minus the lag, was read.
        self._tail_read_at: float | None = None
        self._asked_at = now
        self._done = False
        # The visibility horizon: whether a reading is waiting for the next query and
        # what it means there (None when it could not be trusted); whether the last
        # one could be trusted; how far the last tail query read with it.
        self._use_horizon = live and settings.horizon.enabled
        self._fresh = False
        self._split: Split | None = None
        self._exact = self._use_horizon
        self._tail_bound: datetime | None = None
        self._held_polls = 0  # consecutive queries held back by an open transaction
        self._held_rows = 0  # and the rows they read
        self._held = False
        # Open transactions not waited for (backend, start) -> start, and the starts
        # of those that ended since: a backtracking run re-reads from the earliest.
        self._not_waited_for: dict[tuple[int, datetime], datetime] = {}
        self._ended: list[datetime] = []
        # What the running backtracking run re-reads for, and the regular
        # backtracking position to return to after it.
        self._rereading: list[datetime] = []
        self._bt_resume: tuple[TimestampOffset | None, dict[str, int]] | None = None
        # Statistics for tests and benchmarks.
        self.queries = 0
        self.backtracking_queries = 0
        self.bucket_queries = 0

    # -- decisions --------------------------------------------------------

    def next_request(self, now: float) -> Request:
        """What the driver should do next (call again after a wait or a notification)."""
        self._asked_at = now
        if self._done:
            return Done()
        if self.heartbeats and now >= self._heartbeat_due():
            return HeartbeatDue()
        if self._wait is not None:
            if now < self._wait.until:
                return Wait(min(self._wait.until, self._heartbeat_due()))
            self._wait = None
        if self._use_horizon and not self.backtracking and not self._fresh:
            return HorizonQuery()
        if self._after_backtracking:
            # One normal query always follows a backtracking run, so a window
            # with nothing to re-read cannot make the two modes ping-pong.
            self._after_backtracking = False
        elif not self.backtracking and self._should_switch_to_backtracking():
            self._start_backtracking()
        if self.backtracking:
            return self._rows_query(self._backtracking_query())
        if self._needs_buckets():
            self.bucket_queries += 1
            limit = self.settings.bucket_limit
            window = None
            if not self._count_unbounded:
                end = bucket_start(self._scan_from) + limit * BUCKET_SECONDS
                window = EPOCH + timedelta(seconds=end)
            return BucketsQuery(self._scan_from, self.end, limit, window)
        return self._rows_query(self._normal_query(now))

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

    def _should_switch_to_backtracking(self) -> bool:
        if self._ended:
            return True  # a transaction not waited for has ended: re-read from its start
        bt = self.settings.backtracking
        if not (self.live and bt.enabled) or self.latest.timestamp == EPOCH:
            return False
        if self.latest.read_timestamp - self.latest.timestamp > bt.window:
            # Catching up far behind the clock: nothing back there can still
            # commit late, and re-reading it would duplicate the whole backlog.
            return False
        if self._idle_polls >= IDLE_POLLS_BEFORE_BACKTRACKING:
            return True
        if self._rows_since_backtracking >= BACKTRACKING_AFTER_BUFFERS * self.settings.buffer_size:
            return True
        if self._rows_since_backtracking == 0:
            return False  # nothing new since the last run; the idle rule covers quiet streams
        lag_from = (
            self.latest_backtracking.timestamp if self.latest_backtracking is not None else EPOCH
        )
        return self.latest.timestamp - lag_from > bt.window / 2

    def _start_backtracking(self) -> None:
        bt = self.settings.backtracking
        first = self.latest.timestamp - (bt.window + bt.behind_current_time)
        if self.latest_backtracking is None or self.latest_backtracking.timestamp < first:
            # Never further back than a window: after a catch-up the previous
            # backtracking position may be far behind.
            self.latest_backtracking = TimestampOffset(max(first, EPOCH), EPOCH, {})
            self._bt_seen = {}
        self._fresh = False  # the run starts after the reading; the next normal query reads anew
        if self._ended:
            # Re-read from the start of the earliest transaction that ended (all of
            # them ended before the reading, so before this run's snapshots), up to
            # the scan position and not behind the clock; then resume the regular
            # backtracking where it was, so this run skips nothing it would re-read.
            self._rereading, self._ended = self._ended, []
            self._bt_resume = (self.latest_backtracking, dict(self._bt_seen))
            self.latest_backtracking = TimestampOffset(min(self._rereading), EPOCH, {})
            self._bt_seen = {}
        self.backtracking = True
        _log.debug(
            "switching to backtracking from %s (idle polls %d, rows since %d)",
            self._bt_position(),
            self._idle_polls,
            self._rows_since_backtracking,
        )
        self._idle_polls = 0
        self._rows_since_backtracking = 0

    def _bt_position(self) -> str:
        bt = self.latest_backtracking
        return "the start" if bt is None else bt.timestamp.isoformat()

    def _backtracking_query(self) -> RowsQuery:
        if self.latest_backtracking is None:
            raise ProtocolError("backtracking query before backtracking started")
        return RowsQuery(
            backtracking=True,
            from_timestamp=self.latest_backtracking.timestamp,
            exclude=dict(self._bt_seen),
            # Up to where the normal scan has passed, which a bounded catch-up
            # chunk can move past the last emitted event: a row that commits
            # late inside that stretch is seen by no normal query again.
            to_inclusive=self._scan_from,
            until_exclusive=None,
            behind_current_time=(
                None if self._rereading else self.settings.backtracking.behind_current_time
            ),
            limit=self.settings.buffer_size,
        )

    def _needs_buckets(self) -> bool:
        if not self._last_full:
            return False  # at the tail: a LIMIT query touches few rows anyway
        if self._buckets is None:
            return True
        return self._bound() is None and not self._buckets_complete

    def _bound(self) -> datetime | None:
        """End of the first bucket where rows from the scan position reach buffer_size.

        If the counts were cut off at `bucket_limit` before reaching it, the end
        of the last counted bucket still bounds the scan.
        """
        if not self._buckets:
            return None
        first = bucket_start(self._scan_from)
        total = 0
        last: Bucket | None = None
        for bucket in self._buckets:
            if bucket.start < first:
                continue
            last = bucket
            total += bucket.count
            if total >= self.settings.buffer_size:
                break
        else:
            if self._buckets_complete or last is None:
                return None
        if last is None:  # the loop ran at least once (total reached the buffer)
            raise ProtocolError("bucket bound without buckets")
        return EPOCH + timedelta(seconds=last.start + BUCKET_SECONDS)

    def _normal_query(self, now: float) -> RowsQuery:
        bound = self._bound() if self._last_full else None
        if bound is not None and self.end is not None and bound > self.end:
            bound = None
        if self._pending_notifications:
            covered = now - self._lag()
            self._pending_notifications = [t for t in self._pending_notifications if t > covered]
        horizon = self._horizon_bound()
        behind = None
        if self.live and horizon is None:
            behind = self.settings.behind_current_time
        return RowsQuery(
            backtracking=False,
            from_timestamp=self._scan_from,
            exclude=dict(self._scan_seen),
            to_inclusive=self.end,
            until_exclusive=bound,
            behind_current_time=behind,
            limit=None if bound is not None else self.settings.buffer_size,
            horizon=horizon,
        )

    def _horizon_bound(self) -> datetime | None:
        """Use up the last reading: the exact bound, or None to stay behind the clock."""
        parts = self._split if self._fresh else None
        self._fresh = False
        self._held = parts is not None and parts.held
        return None if parts is None else parts.bound

    def _lag(self) -> float:
        """Seconds after a commit until a live query can read it."""
        lag = self.settings.horizon.margin if self._exact else self.settings.behind_current_time
        return lag.total_seconds()

    # -- results ----------------------------------------------------------

    def on_buckets(self, rows: Sequence[tuple[int, int]]) -> None:
        """Bucket counts (start in epoch seconds, count), ordered by start.

        The driver counts only complete buckets older than the query's lag, so
        no bound ever lies ahead of what a normal query may read.
        """
        windowed = not self._count_unbounded
        if windowed and not rows:
            self._buckets = None  # nothing in the window: count again, to the end
            self._count_unbounded = True
            return
        self._count_unbounded = False
        self._buckets = [Bucket(int(start), int(count)) for start, count in rows]
        # A window cut the count short of the end: its last bucket still bounds a scan.
        self._buckets_complete = len(rows) < self.settings.bucket_limit and not windowed
        _log.debug("catch-up bound from %d bucket counts: %s", len(rows), self._bound())

    def on_horizon(self, horizon: Horizon) -> None:
        """A reading of the open transactions, taken just now, before the next query."""
        self._fresh = True
        self._exact = horizon.blind is None
        if horizon.blind is not None:
            self._split = None
            return  # nothing can be concluded about who ended
        # The next normal query starts at this same scan position (a bucket count
        # may come between, a backtracking run uses the reading up).
        self._split = split(horizon, self._scan_from, self.settings.horizon)
        current = {(t.backend, t.start): t.start for t in self._split.not_waited_for}
        for key, start in self._not_waited_for.items():
            if key not in current:
                self._ended.append(start)
                _log.debug("a transaction started at %s and not waited for has ended", start)
        for key, start in current.items():
            if key not in self._not_waited_for:
                _log.debug("not waiting for the open transaction started at %s", start)
        self._not_waited_for = current

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
            if self.latest_backtracking is None:
                raise ProtocolError("backtracking row before backtracking started")
            seen = self._bt_seen
            if ts > self.latest_backtracking.timestamp:
                seen = self._bt_seen = {}
            elif ts < self.latest_backtracking.timestamp or seen.get(pid, 0) >= seq_nr:
                return None
            seen[pid] = seq_nr
            self.latest_backtracking = TimestampOffset(ts, read_timestamp, seen)
            return self.latest_backtracking
        if ts > self.latest.timestamp:
            self._latest_seen = {}
        elif ts < self.latest.timestamp or self._latest_seen.get(pid, 0) >= seq_nr:
            return None
        self._latest_seen[pid] = seq_nr
        self.latest = TimestampOffset(ts, read_timestamp, self._latest_seen)
        self._read_at = read_timestamp
        self._scan_from = ts
        self._scan_seen = self._latest_seen
        self._last_emit = now
        return self.latest

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
                self.backtracking = False
                self._after_backtracking = True
                _log.debug("backtracking ends at %s (%d rows)", self._bt_position(), rows)
                if self._bt_resume is not None:
                    self.latest_backtracking, self._bt_seen = self._bt_resume
                    self._bt_resume = None
                    self._rereading = []
            return
        self._rows_since_backtracking += rows
        self._idle_polls = self._idle_polls + 1 if rows == 0 else 0
        if query.until_exclusive is not None:
            # A bounded chunk was read whole: nothing more is below its bound (or
            # the horizon, if that is lower), so the next scan may start there.
            end = query.until_exclusive
            if query.horizon is not None:
                end = min(end, query.horizon)
            clipped = end < query.until_exclusive
            if end > self._scan_from:
                self._scan_from = end
                self._scan_seen = {}
            self._last_full = True
            self._backtracked_by_reading(query)
            if not clipped:
                return
            # Held back by an open transaction: wait as at the tail.
            self._tail_bound = end
        else:
            self._last_full = full
            self._backtracked_by_reading(query)
            if full:
                self._buckets = None  # catching up again: recount from here
            else:
                self._tail_read_at = self._asked_at
                self._tail_bound = query.horizon
        if not self.live:
            if not full:
                self._done = True
            return
        if full:
            return
        buffer = self.settings.buffer_size
        refresh = self.settings.refresh_interval.total_seconds()
        # Rows read since the last poll that was not held back: a short re-poll
        # after a hold must not make a busy stream look quiet.
        counted = rows + self._held_rows
        delay = refresh if counted <= buffer // 10 else refresh / 2
        if self._held:
            delay = min(delay, HELD_POLL * 2 ** min(self._held_polls, 16))
            self._held_polls += 1
            self._held_rows = counted
        else:
            self._held_polls = 0
            self._held_rows = 0
        self._wait = Wait(now + delay)
        _log.debug("%d rows: waiting %.3f s before the next query", rows, delay)
        if self._pending_notifications:
            self._notification_wait()

    def _backtracked_by_reading(self, query: RowsQuery) -> None:
        """Move the backtracking position past what this normal query read long enough
        after it was written.

        Backtracking re-reads a row once it is `backtracking.behind_current_time`
        old, on the premise that every row is visible by then. A normal query that
        read a stretch at least that long after its timestamps saw it just as
        completely, so re-reading it would only yield duplicates. This is what
        keeps a catch-up of recent events from reading its backlog twice. Only a
        stretch that joins what is already covered counts (the query must start
        at or before the backtracking position); rows younger than that delay
        when read are still re-read.
        """
        read_at = self._read_at
        if read_at is None or not self.live:
            return
        current = self.latest_backtracking
        done = current.timestamp if current is not None else self._backtracked_to
        if done is None or done < query.from_timestamp:
            return
        covered = min(self._scan_from, read_at - self.settings.backtracking.behind_current_time)
        if covered > done:
            self.latest_backtracking = TimestampOffset(covered, EPOCH, {})
            self._bt_seen = {}

    def on_notification(self, now: float) -> None:
        """A NOTIFY for this range arrived: query as soon as its event is old enough."""
        if self._done:
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
        """Offset of an idle heartbeat: as far as the last query that reached the tail read.

        Not `db_now - behind_current_time`: rows written since that query (with
        older timestamps than `db_now` minus the lag) have not been read yet, and
        a progress marker at the heartbeat's offset must not pass them.
        """
        self._last_emit = now
        reached = self.latest.timestamp
        if self._tail_bound is not None:
            # Exact: the last tail query read everything below its horizon. Not
            # past a transaction that was not waited for, though: a restart from
            # this marker would not know to re-read for it.
            floor = self.unfinished_reread
            reached = max(
                reached, self._tail_bound if floor is None else min(self._tail_bound, floor)
            )
        elif self._tail_read_at is not None:
            since = timedelta(seconds=max(0.0, now - self._tail_read_at))
            reached = max(reached, db_now - since - self.settings.behind_current_time)
        return TimestampOffset(reached, db_now, {})

    @property
    def done(self) -> bool:
        return self._done

    @property
    def unfinished_reread(self) -> datetime | None:
        """The start of the oldest transaction not waited for and not re-read for yet.

        A stream closed while this is set relies on the next one: that sees the
        transaction if it is still open, but if it ended meanwhile, only
        backtracking's window covers it. The drivers log a warning, so such a
        miss is never silent.
        """
        due = [*self._not_waited_for.values(), *self._ended, *self._rereading]
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

"""Where a slice query's backtracking is, and when its next run is due.

`db_timestamp` is the *start* of the writing transaction, so an event can
become visible after events with later timestamps. A backtracking run
periodically re-reads a window in the past (`window + behind_current_time`
before the latest offset, never past the scan) to pick up what committed late;
its rows are emitted without payload and the offset store drops duplicates.
This value holds that second position and the counters that trigger a run,
apart from the normal scan, so each rule is tested on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

import attrs

from journal.errors import ProtocolError
from journal.model import EPOCH, TimestampOffset
from journal.query.scan import offset_after
from journal.settings import BacktrackingSettings

_log = logging.getLogger("slicejournal.journal.query")

IDLE_POLLS_BEFORE_BACKTRACKING = 5
BACKTRACKING_AFTER_BUFFERS = 3


@attrs.frozen
class Reread:
    """A run that re-reads for transactions not waited for that have ended."""

    start: datetime  # the earliest of their starts
    resume: TimestampOffset  # the regular backtracking position, taken up after the run


@attrs.frozen
class BacktrackingTracker:
    """The backtracking position and what decides the next run.

    `position` is None until the first run. Before it, `backtracked_to` says
    where that run may start without skipping anything it must re-read: from
    the beginning of the journal nothing lies before, while a stream that
    resumes first re-reads a window before its offset (None).
    """

    settings: BacktrackingSettings
    buffer_size: int
    position: TimestampOffset | None = None
    backtracked_to: datetime | None = None
    idle_polls: int = 0  # consecutive normal queries without rows
    rows_since: int = 0  # rows normal queries read since the last run
    reread: Reread | None = None

    @classmethod
    def resuming_from(
        cls, settings: BacktrackingSettings, buffer_size: int, offset: TimestampOffset
    ) -> BacktrackingTracker:
        backtracked_to = EPOCH if offset.timestamp == EPOCH else None
        return cls(settings, buffer_size, backtracked_to=backtracked_to)

    @property
    def behind_current_time(self) -> timedelta | None:
        """How far behind the clock a run stays; a re-read run reads up to the scan.

        The transactions it re-reads for ended before the reading that saw
        them end, so before this run's snapshots: nothing there is still open.
        """
        return None if self.reread is not None else self.settings.behind_current_time

    def due(self, latest: TimestampOffset, live: bool) -> bool:
        """Whether a regular run should start before the next normal query."""
        bt = self.settings
        if not (live and bt.enabled) or latest.timestamp == EPOCH:
            return False
        if latest.read_timestamp - latest.timestamp > bt.window:
            # Catching up far behind the clock: nothing back there can still
            # commit late, and re-reading it would duplicate the whole backlog.
            return False
        if self.idle_polls >= IDLE_POLLS_BEFORE_BACKTRACKING:
            return True
        if self.rows_since >= BACKTRACKING_AFTER_BUFFERS * self.buffer_size:
            return True
        if self.rows_since == 0:
            return False  # nothing new since the last run; the idle rule covers quiet streams
        lag_from = self.position.timestamp if self.position is not None else EPOCH
        return latest.timestamp - lag_from > bt.window / 2

    def start(self, latest: datetime, ended: Sequence[datetime]) -> BacktrackingTracker:
        """Start a run behind `latest`; from the earliest of `ended`, if any.

        A re-read run goes back to the start of the earliest transaction that
        ended, then regular backtracking resumes where it was, so the re-read
        skips nothing a regular run would have read.
        """
        first = latest - (self.settings.window + self.settings.behind_current_time)
        position = self.position
        if position is None or position.timestamp < first:
            # Never further back than a window: after a catch-up the previous
            # position may be far behind.
            position = TimestampOffset(max(first, EPOCH), EPOCH, {})
        reread = None
        if ended:
            reread = Reread(min(ended), position)
            position = TimestampOffset(reread.start, EPOCH, {})
        _log.debug(
            "switching to backtracking from %s (idle polls %d, rows since %d)",
            position.timestamp.isoformat(),
            self.idle_polls,
            self.rows_since,
        )
        return attrs.evolve(self, position=position, reread=reread, idle_polls=0, rows_since=0)

    def emit(
        self, ts: datetime, pid: str, seq_nr: int, read_timestamp: datetime
    ) -> BacktrackingTracker | None:
        """The tracker after a run's row, or None if the run emitted it already."""
        if self.position is None:
            raise ProtocolError("backtracking row before backtracking started")
        position = offset_after(self.position, ts, pid, seq_nr, read_timestamp)
        if position is None:
            return None
        return self._moved(position, self.idle_polls, self.rows_since)

    def end_run(self, rows: int) -> BacktrackingTracker:
        """The run's last query returned fewer rows than its limit."""
        _log.debug("backtracking ends at %s (%d rows)", self.describe(), rows)
        if self.reread is None:
            return self
        return attrs.evolve(self, position=self.reread.resume, reread=None)

    def after_normal_query(self, rows: int) -> BacktrackingTracker:
        idle_polls = self.idle_polls + 1 if rows == 0 else 0
        return self._moved(self.position, idle_polls, self.rows_since + rows)

    def _moved(
        self, position: TimestampOffset | None, idle_polls: int, rows_since: int
    ) -> BacktrackingTracker:
        # Once per row and per query: built directly, as attrs.evolve costs several
        # times more.
        return BacktrackingTracker(
            self.settings,
            self.buffer_size,
            position,
            self.backtracked_to,
            idle_polls,
            rows_since,
            self.reread,
        )

    def covered_by_normal_read(
        self, from_timestamp: datetime, scan_from: datetime, read_at: datetime
    ) -> BacktrackingTracker:
        """Move the position past what a normal query read long enough after it was written.

        Backtracking re-reads a row once it is `behind_current_time` old, on the
        premise that every row is visible by then. A normal query (from
        `from_timestamp`, read at database time `read_at`, now at `scan_from`)
        that read a stretch at least that long after its timestamps saw it just
        as completely, so re-reading it would only yield duplicates. This is
        what keeps a catch-up of recent events from reading its backlog twice.
        Only a stretch that joins what is already covered counts (the query must
        start at or before the position); rows younger than that delay when
        read are still re-read.
        """
        done = self.position.timestamp if self.position is not None else self.backtracked_to
        if done is None or done < from_timestamp:
            return self
        covered = min(scan_from, read_at - self.settings.behind_current_time)
        if covered <= done:
            return self
        return attrs.evolve(self, position=TimestampOffset(covered, EPOCH, {}))

    def describe(self) -> str:
        return "the start" if self.position is None else self.position.timestamp.isoformat()

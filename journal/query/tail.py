"""What a live slice query knows from its last query at the tail.

Two decisions depend on it and on nothing else: how far an idle heartbeat may
claim the stream has read (never past a row not read yet), and how soon to
poll again, which is much sooner while an open transaction holds the horizon
back, as most such transactions last a few milliseconds.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from journal.settings import QuerySettings

# While an open transaction holds the horizon back, poll again after this, doubling
# up to the refresh interval.
HELD_POLL = 0.01


@attrs.frozen
class TailTracker:
    """How far the last tail query read, and the polls an open transaction held back.

    `bound` is the horizon the last tail query read up to (None: it stayed
    behind the clock); `read_at` is when (monotonic) the last LIMIT query that
    reached the tail was asked for. `held` is whether the last normal query was
    held back; `held_polls` and `held_rows` count the consecutive held polls
    and the rows they read.
    """

    bound: datetime | None = None
    read_at: float | None = None
    held: bool = False
    held_polls: int = 0
    held_rows: int = 0

    # `asking`, `after_tail_query` and `poll` run on every poll of every live
    # stream, so they build the next value directly (attrs.evolve costs several
    # times more) and keep this one when nothing changes.

    def asking(self, held: bool) -> TailTracker:
        """A normal query is asked for, `held` back by an open transaction or not."""
        if held == self.held:
            return self
        return TailTracker(self.bound, self.read_at, held, self.held_polls, self.held_rows)

    def after_tail_query(self, horizon: datetime | None, asked_at: float) -> TailTracker:
        return TailTracker(horizon, asked_at, self.held, self.held_polls, self.held_rows)

    def after_clipped_chunk(self, end: datetime) -> TailTracker:
        """A chunk stopped short of its bound at the horizon: it read up to `end`."""
        return attrs.evolve(self, bound=end)

    def poll(self, rows: int, settings: QuerySettings) -> tuple[TailTracker, float]:
        """After a query that did not fill its buffer: seconds to wait before the next."""
        refresh = settings.refresh_interval.total_seconds()
        # Rows read since the last poll that was not held back: a short re-poll
        # after a hold must not make a busy stream look quiet.
        counted = rows + self.held_rows
        delay = refresh if counted <= settings.buffer_size // 10 else refresh / 2
        if not self.held:
            if self.held_polls == 0 and self.held_rows == 0:
                return self, delay
            return TailTracker(self.bound, self.read_at, False, 0, 0), delay
        delay = min(delay, HELD_POLL * 2 ** min(self.held_polls, 16))
        return TailTracker(self.bound, self.read_at, True, self.held_polls + 1, counted), delay

    def reached(
        self,
        latest: datetime,
        db_now: datetime,
        now: float,
        floor: datetime | None,
        behind_current_time: timedelta,
    ) -> datetime:
        """How far an idle heartbeat at `db_now` (monotonic `now`) may claim the stream read.

        With a horizon, exactly as far as the last tail query read, but not past
        `floor`, a transaction not waited for: a restart from the heartbeat would
        not know to re-read for it. Without one, not `db_now - behind_current_time`:
        rows written since that query, with older timestamps, have not been read.
        """
        if self.bound is not None:
            return max(latest, self.bound if floor is None else min(self.bound, floor))
        if self.read_at is not None:
            since = timedelta(seconds=max(0.0, now - self.read_at))
            return max(latest, db_now - since - behind_current_time)
        return latest

"""The streaming source's offsets and the decisions that make them, with no database handle.

A Spark micro-batch is a pair of offsets (start, end]. Ours is a database
timestamp `timestamp` — every row below it has been delivered, or will be
re-read once it can be — and what the stream needs to keep that promise across
batches and restarts (Spark writes each offset to its checkpoint before the
batch runs, and re-plans the batch from the two offsets after a crash).

`db_timestamp` is the start of the writing transaction, so a row can commit
after a batch has passed its timestamp. The live slice query avoids that with
the visibility horizon (`journal.query.horizon`): PostgreSQL says which
transactions are open and when each started; a batch never ends past the start
of one it waits for. One it does not wait for (open before the stream got
there, or idle in transaction for longer than `max_hold` without writing to the
journal) is kept in the offset as `pending`; the first batch whose reading
shows it ended re-reads from its start (`reread`), so its rows are delivered
late but delivered. The projection sink drops what it already applied (per pid
and seq_nr, against the offset store), so re-reading costs reads, never doubles.

When the horizon cannot be read (a role without `pg_read_all_stats`,
activity tracking off), the stream stays `behindCurrentTime` behind the clock
like Pekko, and falls back to counting the rows of the backtracking window
below each offset (`window`): a late row changes the count, and the next batch
re-reads the window.

Every decision is made in `latestOffset`, and `partitions(start, end)` is a
function of the two offsets alone, so a batch re-planned from the checkpoint
reads exactly what it read the first time. Spark compares offsets as JSON
strings, so `to_json` always writes the keys in the same order. Everything
here is pure and pickles.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from journal.model import EPOCH
from journal.query.horizon import Horizon, ReadPast, ended_since, read_past, split
from projections.spark.options import SourceOptionError, SourceOptions, parse_timestamp

ONE_MICROSECOND = timedelta(microseconds=1)
UNKNOWN_WINDOW = -1

Pending = ReadPast  # (server process id, transaction start)


@attrs.frozen
class StreamOffset:
    """Rows below `timestamp` were delivered, except those of the `pending` transactions.

    `pending` is None when the stream does not know which transactions it read
    past (a first offset, a blind reading): the next batch then re-reads the
    backtracking window below `timestamp`, unless `window` (blind readings
    only) shows that no row appeared there. `reread` is where the batch that
    ends at this offset starts reading, when that is before its start offset.
    """

    timestamp: datetime
    window: int = UNKNOWN_WINDOW
    pending: tuple[Pending, ...] | None = None
    reread: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        # Key order is part of the value: Spark compares serialised offsets.
        pending = None if self.pending is None else [[b, s.isoformat()] for b, s in self.pending]
        return {
            "timestamp": self.timestamp.isoformat(),
            "window": self.window,
            "pending": pending,
            "reread": None if self.reread is None else self.reread.isoformat(),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StreamOffset:
        # Offsets checkpointed by 0.2 have only timestamp and window: read as "unknown".
        try:
            raw_pending = value.get("pending")
            pending = (
                None
                if raw_pending is None
                else tuple((int(b), parse_timestamp(str(s), "offset")) for b, s in raw_pending)
            )
            raw_reread = value.get("reread")
            return cls(
                parse_timestamp(str(value["timestamp"]), "offset"),
                int(value["window"]),
                pending,
                None if raw_reread is None else parse_timestamp(str(raw_reread), "offset"),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise SourceOptionError(f"not a slicejournal stream offset: {value!r}") from error


def initial_offset(options: SourceOptions) -> StreamOffset:
    """Where a stream without a checkpoint starts; the first batch re-reads the window
    below it (nobody knows what was open there), as a projection resuming in-process does."""
    start = options.starting_timestamp or options.from_timestamp or EPOCH
    return StreamOffset(start)


def is_exact(reading: Horizon, options: SourceOptions) -> bool:
    """Whether the stream may trust `reading`: the horizon is enabled and the reading
    saw every open transaction. Otherwise batches stay behind the clock and the
    re-read is decided by counting rows in the window."""
    return reading.blind is None and options.settings.query.horizon.enabled


def batch_bound(start: StreamOffset, reading: Horizon, options: SourceOptions) -> datetime:
    """The exclusive upper bound on the rows the batch after `start` may take.

    An exact reading gives the live query's bound: the start of the oldest open
    transaction the stream waits for (less a margin). A blind one falls back to
    staying `behindCurrentTime` behind the database clock.
    """
    if not is_exact(reading, options):
        return reading.db_now - options.behind_current_time
    return split(reading, start.timestamp, options.settings.query.horizon).bound


def end_timestamp(
    start: StreamOffset,
    newest: datetime | None,
    nth: datetime | None,
    target: datetime | None,
) -> datetime:
    """The next batch's exclusive upper bound.

    `newest`: the latest db_timestamp at or after `start` below the batch
    bound (None: no such row); `nth`: with a row limit, the db_timestamp of the
    limit-th such row in order (None: fewer rows than the limit); `target`:
    an upper bound fixed earlier (`Trigger.AvailableNow`, `toTimestamp`).

    A limit cuts between timestamps, never through one: rows that share a
    timestamp go into the same batch, even when that exceeds the limit.
    """
    end = start.timestamp if newest is None else newest + ONE_MICROSECOND
    if nth is not None:
        end = min(end, nth if nth > start.timestamp else nth + ONE_MICROSECOND)
    if target is not None:
        end = min(end, target)
    return max(end, start.timestamp)


def window_floor(start: StreamOffset, options: SourceOptions) -> datetime:
    """The lowest timestamp a re-read below `start` goes to: the backtracking window,
    never before the epoch or the stream's `fromTimestamp`."""
    lower = max(start.timestamp - options.backtracking_window, EPOCH)
    return _at_least_from(lower, options)


def _at_least_from(ts: datetime, options: SourceOptions) -> datetime:
    if options.from_timestamp is not None:
        return max(ts, options.from_timestamp)
    return ts


def next_offset(
    start: StreamOffset,
    reading: Horizon,
    end: datetime,
    options: SourceOptions,
    *,
    window_at_start: int = UNKNOWN_WINDOW,
    window_at_end: int = UNKNOWN_WINDOW,
) -> StreamOffset:
    """The offset after `start`, given the reading taken before the batch's bounds were
    read and the batch's end timestamp (`end_timestamp`); `start` itself if nothing moved.

    With an exact reading, every transaction still open that started below `end`
    is one the stream reads past: it becomes pending. A pending transaction
    of `start` that the reading no longer shows has ended; the batch re-reads
    from the earliest such start. Blind readings count rows instead
    (`window_at_start`: the window below `start` now; `window_at_end`: below
    `end`), and are not asked for otherwise.
    """
    pending: tuple[Pending, ...] | None
    if is_exact(reading, options):
        open_now = read_past(reading.open)
        pending = tuple(sorted(t for t in open_now if t[1] < end))
        window = UNKNOWN_WINDOW
        if start.pending is None:
            reread: datetime | None = window_floor(start, options)
        else:
            ended = ended_since(start.pending, open_now)
            reread = _at_least_from(ended[0], options) if ended else None
    else:
        pending = None
        window = window_at_end
        unchanged = start.window != UNKNOWN_WINDOW and window_at_start == start.window
        reread = None if unchanged else window_floor(start, options)
    if reread is not None and reread >= start.timestamp:
        reread = None
    if end == start.timestamp and reread is None and pending == start.pending:
        return start  # nothing to read: Spark runs no batch
    return StreamOffset(end, window, pending, reread)


def batch_start(start: StreamOffset, end: StreamOffset) -> datetime:
    """Where the batch (start, end] reads from."""
    return start.timestamp if end.reread is None else min(end.reread, start.timestamp)


def is_empty(start: StreamOffset, end: StreamOffset) -> bool:
    """Whether the batch (start, end] has nothing to read."""
    return batch_start(start, end) >= end.timestamp

"""The streaming source's offsets and its two decisions, with no database handle.

A Spark micro-batch is a pair of offsets (start, end]. Ours is a database
timestamp `timestamp` — every row below it that was visible when the offset
was made has been delivered — plus `window`, the number of journal rows of
the range in the `backtracking_window` just below `timestamp` at that moment.

Why the count: `db_timestamp` is the start of the writing transaction, so a
row can commit *after* a batch has passed its timestamp (a late commit). If
the offset were only a timestamp, a late row would never move it, Spark would
see no new data and the row would never be read — the measured loss this
module exists to prevent. The count moves when a late row appears, so
`latest_end` reports progress and `reread_from` tells the next batch to re-read
the window; the projection sink drops what it already applied (per pid and
seq_nr, against the offset store), so re-reading costs reads, never doubles.

Spark compares offsets as JSON strings, so `to_json` always writes the keys in
the same order. Everything here is pure and pickles.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from journal.model import EPOCH
from projections.spark.options import SourceOptionError, SourceOptions, parse_timestamp

ONE_MICROSECOND = timedelta(microseconds=1)
UNKNOWN_WINDOW = -1


@attrs.frozen
class StreamOffset:
    """Rows below `timestamp` were delivered; `window` rows lay in the window below it."""

    timestamp: datetime
    window: int = UNKNOWN_WINDOW

    def to_json(self) -> dict[str, Any]:
        # Key order is part of the value: Spark compares serialised offsets.
        return {"timestamp": self.timestamp.isoformat(), "window": self.window}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StreamOffset:
        try:
            return cls(parse_timestamp(str(value["timestamp"]), "offset"), int(value["window"]))
        except (KeyError, TypeError, ValueError) as error:
            raise SourceOptionError(f"not a slicejournal stream offset: {value!r}") from error


def initial_offset(options: SourceOptions) -> StreamOffset:
    """Where a stream without a checkpoint starts; the first batch re-reads the window
    below it (its count is unknown), as a projection resuming in-process does."""
    start = options.starting_timestamp or options.from_timestamp or EPOCH
    return StreamOffset(start, UNKNOWN_WINDOW)


def end_timestamp(
    start: StreamOffset,
    newest: datetime | None,
    nth: datetime | None,
    target: datetime | None,
) -> datetime:
    """The next batch's exclusive upper bound.

    `newest`: the latest db_timestamp at or after `start` that is behind the
    clock (None: no such row); `nth`: with a row limit, the db_timestamp of the
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


def reread_from(start: StreamOffset, window_now: int, options: SourceOptions) -> datetime:
    """Where a batch starting at `start` reads from: `start` itself, or the window below
    it if rows appeared there since `start` was made (or nobody counted them)."""
    if start.window != UNKNOWN_WINDOW and window_now == start.window:
        return start.timestamp
    lower = max(start.timestamp - options.backtracking_window, EPOCH)
    if options.from_timestamp is not None:
        lower = max(lower, options.from_timestamp)
    return min(lower, start.timestamp)

"""Bucket counts that bound a slice query's catch-up scans.

Far behind the tail, `ORDER BY db_timestamp` over everything after the offset
would sort the rest of the journal on every poll. Counts per 10-second bucket
give an upper timestamp that bounds each scan to about `CHUNK_BUFFERS` times
`buffer_size` rows (at least one bucket); such a bounded chunk is streamed
without LIMIT, `buffer_size` rows per fetch, so each row is sorted once. This
module holds what the query knows about those counts and what it derives from
them; at the tail, where a live LIMIT query touches few rows anyway, it asks for none.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import attrs

from journal.model import EPOCH

BUCKET_SECONDS = 10
# Buffers per bounded chunk. Each chunk is one statement that visits every slice
# of the range in the index and sorts what it finds, so its fixed cost is spread
# over more rows the larger it is: at one buffer (1,000 rows) a 200k-event
# catch-up ran 124 chunks at 3.5 us an event of fetching, at 8 buffers 31 chunks
# at 2.8 us. 8,000 rows of about 160 bytes still sort in the default work_mem.
CHUNK_BUFFERS = 8


def bucket_start(ts: datetime) -> int:
    """The start (epoch seconds) of the bucket holding `ts`."""
    return int((ts - EPOCH).total_seconds() // BUCKET_SECONDS) * BUCKET_SECONDS


@attrs.frozen
class Bucket:
    """Number of rows whose db_timestamp falls in [start, start + 10 s)."""

    start: int  # epoch seconds, a multiple of BUCKET_SECONDS
    count: int

    @property
    def end(self) -> datetime:
        return EPOCH + timedelta(seconds=self.start + BUCKET_SECONDS)


@attrs.frozen
class Counts:
    """The answer to one bucket count."""

    buckets: tuple[Bucket, ...]
    # They reach the end of the journal: cut off neither by a window nor by the
    # bucket limit, so past the last of them there is nothing to bound.
    complete: bool


@attrs.frozen
class BucketTracker:
    """Whether the next scan needs a count, and the bound the last count gives it.

    `catching_up` is whether the last normal query was full (at the start the
    position is unknown, so it counts before the first scan); `counts` is None
    when a count is due. `to_the_end` is set after a windowed count came back
    empty: the next count has no window, so a gap longer than one window is
    crossed in one count instead of one window per poll.
    """

    buffer_size: int
    limit: int  # buckets per count
    catching_up: bool = True
    counts: Counts | None = None
    to_the_end: bool = False

    def needs_count(self, scan_from: datetime) -> bool:
        if not self.catching_up:
            return False
        if self.counts is None:
            return True
        return self.bound(scan_from) is None and not self.counts.complete

    def window_end(self, scan_from: datetime) -> datetime | None:
        """Where the next count stops, None for the end of the journal."""
        if self.to_the_end:
            return None
        end = bucket_start(scan_from) + self.limit * BUCKET_SECONDS
        return EPOCH + timedelta(seconds=end)

    def bound(self, scan_from: datetime) -> datetime | None:
        """End of the first bucket where rows from `scan_from` reach the chunk size.

        If the counts were cut off (by the window or `limit`) before reaching
        it, the end of the last counted bucket still bounds the scan.
        """
        if self.counts is None or not self.counts.buckets:
            return None
        first = bucket_start(scan_from)
        total = 0
        last: Bucket | None = None
        for bucket in self.counts.buckets:
            if bucket.start < first:
                continue
            total += bucket.count
            if total >= self.buffer_size * CHUNK_BUFFERS:
                return bucket.end
            last = bucket
        if self.counts.complete or last is None:
            return None
        return last.end

    def scan_bound(self, scan_from: datetime, end: datetime | None) -> datetime | None:
        """The `until_exclusive` of the next normal scan: None past the last bound (a
        live query's LIMIT poll, a current query's last statement)."""
        if not self.catching_up:
            return None
        bound = self.bound(scan_from)
        if bound is not None and end is not None and bound > end:
            return None
        return bound

    def on_counts(self, rows: Sequence[tuple[int, int]]) -> BucketTracker:
        """The answer to the count asked for (`window_end` as it was then)."""
        windowed = not self.to_the_end
        if windowed and not rows:
            return attrs.evolve(self, counts=None, to_the_end=True)
        buckets = tuple(Bucket(int(start), int(count)) for start, count in rows)
        complete = len(rows) < self.limit and not windowed
        return attrs.evolve(self, counts=Counts(buckets, complete), to_the_end=False)

    def after_limit_query(self, full: bool) -> BucketTracker:
        """A LIMIT query returned: full means behind again, so count anew from here."""
        if full:
            return attrs.evolve(self, catching_up=True, counts=None)
        # At the tail this runs on every poll: keep the value when it stays the same.
        return attrs.evolve(self, catching_up=False) if self.catching_up else self

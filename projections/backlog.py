"""What "lag" means, once, for `slicejournal status`, the metrics and the telemetry hook.

A projection's lag used to be `now - the newest event it handled`: on a quiet
journal that grows forever for a caught-up projection, and a stuck projection
looks like a healthy one. The backlog is what an operator means instead:

* **age** — how long the oldest event of the range that the projection has
  not yet handled has been waiting: `now - its db_timestamp`; 0 when nothing
  is waiting, however quiet the journal;
* **size** — how many events are waiting (counted up to a cap, so reading it
  stays cheap with a huge backlog: `capped` says the figure is a lower bound).

"Not yet handled" is read per slice from the stored offsets: an event of the
slice newer than the slice's latest stored offset row (an event's own row, a
progress marker of a heartbeat, or a start marker of `set_offset`). A slice
with no row has every event of the slice waiting. The statement
(`ManagementSql.backlog`) reads the oldest waiting event, the capped count and
the database's `now()` for a range in one round trip; `measure` below turns
them into a `Backlog`. Two approximations, both bounded: an event stored with
the very timestamp of its slice's latest row, and an event that committed
late behind it (backtracking delivers it), are not counted.

Paused ranges are not special-cased: their backlog grows while events arrive,
which is the truth; `RangeStatus.paused` says why.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

# Waiting events counted at most, per range and reading: the count is an index
# range scan, and a backlog this large is "large" for every decision it serves.
DEFAULT_SIZE_CAP = 100_000


@attrs.frozen
class Backlog:
    """The events of one slice range a projection has not handled yet, at `measured_at`."""

    age: timedelta
    size: int
    capped: bool = False
    oldest_unhandled: datetime | None = None
    measured_at: datetime | None = None

    @property
    def age_seconds(self) -> float:
        """`age` in seconds (0.0: nothing waits)."""
        return self.age.total_seconds()

    @property
    def caught_up(self) -> bool:
        """True when no event of the range waits to be handled."""
        return self.size == 0


def measure(
    now: datetime,
    oldest_unhandled: datetime | None,
    unhandled: int,
    cap: int = DEFAULT_SIZE_CAP,
) -> Backlog:
    """The backlog from one reading: the database's `now`, the db_timestamp of the oldest
    event not yet handled (None: none) and how many are waiting (counted up to `cap`)."""
    if oldest_unhandled is None or unhandled <= 0:
        return Backlog(timedelta(0), 0, False, None, now)
    age = max(now - oldest_unhandled, timedelta(0))
    return Backlog(age, unhandled, unhandled >= cap, oldest_unhandled, now)

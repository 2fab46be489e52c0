"""Read your writes: what `ProjectionManagement.wait_for` waits for, with no I/O.

A web request appends an event and redirects to a page that reads the read
model, which may not have the event yet. `wait_for(name, events)` returns once
the projection has handled every given event. "Handled" is read from the
offset store, the same evidence a restarted instance trusts, so it holds
across processes (a fleet) and across restarts:

* a record of the event's id at or after the event, ordered as the offset
  store orders an id's records: by (timestamp, seq_nr), so a later lifetime of
  a reset id is never taken for an earlier one; or
* the slice's progress (or start) marker later than the event: everything of
  the slice before it was handled (or is to be ignored).

An event given as `(persistence_id, seq_nr)` is looked up in the journal for
its timestamp; one that is not there any more was deleted (retention deletes
only what registered projections consumed; an erasure removed it), and counts
as done. Running instances send a NOTIFY after each commit of offsets
(coalesced, after the commit, like the journal's append hints), and the waiter
re-checks when one names its projection; a re-check every
`RECHECK_SECONDS` covers a lost notification.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import attrs
from psycopg import sql

from journal.errors import InvalidArgument
from journal.model import EventEnvelope
from journal.slices import slice_for, validate_persistence_id
from journal.tables import rendered
from projections.errors import WaitTimeout
from projections.offset_sql import Statement
from projections.offset_store import PROGRESS_PID, PROGRESS_SEQ_NR
from projections.tables import ProjectionTables

__all__ = ["RECHECK_SECONDS", "WaitSql", "WaitTarget", "check_targets", "timed_out"]

# A lost notification costs at most this much latency.
RECHECK_SECONDS = 1.0


@attrs.frozen
class WaitTarget:
    """One event to wait for: its id, seq_nr and, when known, its db_timestamp."""

    persistence_id: str
    seq_nr: int
    timestamp: datetime | None

    @property
    def slice(self) -> int:
        return slice_for(self.persistence_id)

    def __str__(self) -> str:
        return f"{self.persistence_id}:{self.seq_nr}"


def check_targets(events: Iterable[EventEnvelope | tuple[str, int]]) -> list[WaitTarget]:
    """Validate what `wait_for` was given, before any I/O."""
    if isinstance(events, EventEnvelope | str | bytes) or not isinstance(events, Iterable):
        raise InvalidArgument(
            "wait_for takes a list of envelopes (what append returns) or (persistence_id, "
            f"seq_nr) pairs, got {type(events).__name__}"
        )
    targets = []
    for event in events:
        if isinstance(event, EventEnvelope):
            targets.append(WaitTarget(event.persistence_id, event.seq_nr, event.db_timestamp))
            continue
        if not isinstance(event, tuple) or len(event) != 2:
            raise InvalidArgument(
                f"wait_for: {event!r} is neither an EventEnvelope nor a (persistence_id, "
                "seq_nr) pair"
            )
        pid, seq_nr = event
        pid = validate_persistence_id(pid)
        if isinstance(seq_nr, bool) or not isinstance(seq_nr, int) or seq_nr < 0:
            raise InvalidArgument(f"wait_for: seq_nr must be an int >= 0, got {seq_nr!r}")
        targets.append(WaitTarget(pid, seq_nr, None))
    return targets


def check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidArgument(f"wait_for: timeout must be a number of seconds > 0, got {timeout!r}")
    return float(timeout)


def timed_out(name: str, pending: Sequence[WaitTarget], timeout: float) -> WaitTimeout:
    shown = ", ".join(str(t) for t in pending[:5]) + (" ..." if len(pending) > 5 else "")
    return WaitTimeout(
        f"projection {name!r} had not handled {len(pending)} event(s) after {timeout:g} s: "
        f"{shown} (is an instance running for their slices, and not paused?)",
        name=name,
        pending=[(t.persistence_id, t.seq_nr) for t in pending],
    )


_PENDING = """
WITH t AS (
  SELECT * FROM unnest(%(pids)s::text[], %(slices)s::int[], %(seqs)s::bigint[],
    %(ts)s::timestamptz[]) WITH ORDINALITY AS t(pid, slice, seq, ts, i)),
k AS (
  SELECT t.i, t.pid, t.slice, t.seq, coalesce(t.ts, j.db_timestamp) AS ts
  FROM t LEFT JOIN {j} AS j ON t.ts IS NULL AND j.persistence_id = t.pid AND j.seq_nr = t.seq)
SELECT k.i FROM k
WHERE k.ts IS NOT NULL AND NOT EXISTS (
  SELECT 1 FROM {o} AS o
  WHERE o.slice = k.slice AND o.projection_name = %(name)s AND o.timestamp_offset >= k.ts
    AND ((o.persistence_id = k.pid AND (o.timestamp_offset, o.seq_nr) >= (k.ts, k.seq))
      OR (o.persistence_id = %(marker_pid)s AND o.seq_nr <= %(marker_seq)s
          AND o.timestamp_offset > k.ts)))
ORDER BY k.i"""


class WaitSql:
    """The one statement `wait_for` runs: which of the targets are still pending."""

    def __init__(self, tables: ProjectionTables) -> None:
        self._pending = rendered(
            sql.SQL(_PENDING).format(j=tables.journal_tables.journal, o=tables.offset_store)
        )
        self.listen = sql.SQL("LISTEN {}").format(sql.Identifier(tables.commit_channel))

    def pending(self, name: str, targets: Sequence[WaitTarget]) -> Statement:
        """One row per target still pending: its 1-based position in `targets`."""
        params: dict[str, Any] = {
            "pids": [t.persistence_id for t in targets],
            "slices": [t.slice for t in targets],
            "seqs": [t.seq_nr for t in targets],
            "ts": [t.timestamp for t in targets],
            "name": name,
            "marker_pid": PROGRESS_PID,
            "marker_seq": PROGRESS_SEQ_NR,
        }
        return Statement(self._pending, params)

"""The visibility horizon: how far a live slice query may read without passing a late row.

`db_timestamp` is the start of the writing transaction, and a transaction can
stay open for as long as its caller likes: an `append(conn=...)` inside a slow
request, a JVM service's batch. A query that has read past a timestamp never
looks there again (only backtracking does, and only for a window), so a row
that commits late enough is missed. Pekko guesses: it stays
`behind_current_time` behind the clock. PostgreSQL does not have to guess, it
knows which transactions are open and when each started (`pg_stat_activity`).

The horizon is read *before* the query that uses it: a transaction that is open
at the reading has a start time in it, and one that starts later has a start
time (and so every `db_timestamp` it writes, which is never earlier than its
start) after the reading's clock. So every row below the smallest of those that
is not visible to the next query's snapshot is a row that can never appear.

Two kinds of open transactions are not waited for, because waiting could stall
every live stream indefinitely: one that has not written to the journal and has
been open longer than `max_hold` (an idle-in-transaction session), and one that
started before where the stream already is (it was open before the stream
started, or it was not waited for). The stream remembers those and, once one has
ended, re-reads from its start by backtracking, so a late write is delivered
late but delivered.

Everything here is pure: the row the horizon statement returns goes in, a
`Horizon` comes out, and `split` says what it means for one stream.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any

import attrs

from journal.settings import HorizonSettings

_log = logging.getLogger("slicejournal.journal.query")

# The journal's own query connections carry this application_name. They only
# read, so the horizon does not wait for their (catch-up cursor) transactions.
READER_APPLICATION = "slicejournal-read"


@attrs.frozen
class OpenTransaction:
    """A transaction in the journal's database that may still write to the journal."""

    backend: int  # the server process id
    start: datetime  # its transaction_timestamp(), the db_timestamp it would write
    writes_journal: bool  # it holds a write lock on the journal table


@attrs.frozen
class Blind:
    """Why a reading of the open transactions cannot be trusted."""

    kind: str  # "tracking off", "hidden roles", "sessions untracked", "prepared"
    detail: str


@attrs.frozen
class Horizon:
    """One reading of the open transactions, taken before the query that uses it.

    `blind` says why the reading cannot be trusted (missing privileges, activity
    tracking off, prepared transactions); the query then falls back to staying
    `behind_current_time` behind the clock, as without a horizon.
    """

    db_now: datetime
    open: tuple[OpenTransaction, ...] = ()
    blind: Blind | None = None


@attrs.frozen
class Split:
    """What one reading means to a stream positioned at `scan_from`."""

    bound: datetime  # read rows with db_timestamp below this
    held: bool  # an open transaction holds the bound back
    not_waited_for: tuple[OpenTransaction, ...]  # re-read from their start once they end


def horizon_from_row(row: Sequence[Any]) -> Horizon:
    """Interpret the row of `journal.query.sql.horizon`."""
    db_now, user, tracking, prepared, hidden_roles, disabled, backends, starts, writes = row
    blind = None
    if not tracking:
        blind = Blind(
            "tracking off", "track_activities is off, so pg_stat_activity shows no transactions"
        )
    elif hidden_roles:
        roles = ", ".join(sorted(hidden_roles))
        blind = Blind(
            "hidden roles",
            f"pg_stat_activity hides the transactions of role(s) {roles} from {user}, and "
            f"they may write to the journal; grant the missing privilege with "
            f"GRANT pg_read_all_stats TO {user}",
        )
    elif disabled:
        blind = Blind("sessions untracked", f"{disabled} session(s) turned track_activities off")
    elif prepared:
        blind = Blind(
            "prepared",
            f"{prepared} prepared transaction(s) in this database hold a write lock on the "
            f"journal; they can commit at any time, and PostgreSQL does not show when they "
            f"started",
        )
    in_flight = zip(backends, starts, writes, strict=True)
    open_ = tuple(OpenTransaction(int(b), s, bool(w)) for b, s, w in in_flight)
    return Horizon(db_now, open_, blind)


def split(horizon: Horizon, scan_from: datetime, settings: HorizonSettings) -> Split:
    """The bound of the next query, and the open transactions it will not wait for.

    A transaction is waited for (the bound stays at its start) if the stream has
    not passed its start yet and it either writes to the journal already or
    has been open less than `max_hold`.
    """
    hold_from = horizon.db_now - settings.max_hold
    bound = horizon.db_now
    skipped = []
    for t in horizon.open:
        if t.start >= scan_from and (t.writes_journal or t.start >= hold_from):
            bound = min(bound, t.start)
        else:
            skipped.append(t)
    held = bound < horizon.db_now
    return Split(bound - settings.margin, held, tuple(skipped))


ReadPast = tuple[int, datetime]
"""An open transaction a stream read past, kept between readings: (backend, start)."""


def read_past(transactions: Iterable[OpenTransaction]) -> frozenset[ReadPast]:
    """The (backend, start) of open transactions a stream reads past, to remember."""
    return frozenset((t.backend, t.start) for t in transactions)


def ended_since(before: Iterable[ReadPast], now: AbstractSet[ReadPast]) -> list[datetime]:
    """The starts, oldest first, of the transactions read past at an earlier reading that
    a new one (`now`, what it shows open or read past) no longer shows: they ended, so
    whatever they wrote below the stream's position is visible now, and the stream
    re-reads from their starts. One rule for every stream that remembers what it read
    past: the live slice query (`horizon_tracker.py`) and Spark's stream offsets
    (`projections/spark/offsets.py`)."""
    return sorted(start for backend, start in set(before) if (backend, start) not in now)


class BlindWarning:
    """Logs, once per journal and reason, that the horizon is unavailable and why."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def note(self, horizon: Horizon) -> None:
        blind = horizon.blind
        if blind is None or blind.kind in self._said:
            return
        self._said.add(blind.kind)
        _log.warning(
            "the exact visibility horizon is unavailable: %s. Until it is, live slice "
            "queries stay behind_current_time behind the clock and rely on backtracking, "
            "which misses an event whose transaction commits more than "
            "backtracking.behind_current_time after it started.",
            blind.detail,
        )

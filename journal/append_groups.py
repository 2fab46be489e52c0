"""When concurrent appends of one process share a statement: a group commit.

Why: every append on the pool's own connections is one statement, one round
trip and one commit. With many appends in flight in one process the client's
CPU per statement and the server's per commit are the limit, not the rows
(eight writers on two cores stayed at 0.5-0.7 of a bare `INSERT` with every
append its own statement). Pekko's journals take a batch of `AtomicWrite`s in
one call for the same reason, each with its own outcome.

The rule (`AppendGroups`): at most `statements` append statements run at once
on the journal's own connections. An append that arrives below that runs at
once and alone, as before (no wait is added to a lone writer). One that arrives
while that many run waits; when a statement ends, everything waiting (up to
`max_events` events, one append per persistence id; the rest waits for the
next) goes as one statement, `WriterSql.append_group`, in one transaction.

Each append in a group is still all or nothing, with its own outcome: one
whose `expected_seq_nr` is not current stores nothing (its caller gets
`ConcurrencyError`), the others are stored. Two writers racing for a seq_nr
collide on the primary key, which fails the whole statement; the driver then
runs each append of that group alone, so each gets the outcome it would have
had alone. Two appends to one id never share a group: the second's
`expected_seq_nr` usually names the first's last event.

This module is the decision only, with no I/O and no waiting: the drivers
(`journal/aio/writer.py` and its sync twin) run the statements and wake the
callers. Its state is guarded by a lock, for the sync flavour's threads.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from journal.writer import PreparedAppend


@attrs.define(eq=False)
class Waiting:
    """An append waiting for a group; `done` (the driver's event) is set once it has
    its outcome: `stored_at` (None: `expected_seq_nr` was not current) or `error`."""

    batch: PreparedAppend
    done: Any
    stored_at: datetime | None = None
    error: BaseException | None = None
    # Whether a group has taken it (it can no longer be withdrawn).
    taken: bool = False

    def succeeded(self, stored_at: datetime | None) -> None:
        self.stored_at = stored_at
        self.done.set()

    def failed(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class AppendGroups:
    """How many append statements run, and what waits for the next one."""

    def __init__(self, statements: int, max_events: int) -> None:
        self._statements = statements
        self._max_events = max_events
        self._running = 0
        self._waiting: deque[Waiting] = deque()
        self._lock = threading.Lock()

    @property
    def running(self) -> int:
        """The append statements running now."""
        return self._running

    def try_run(self) -> bool:
        """True if an append may run now, alone: it then counts as running until its
        statement's `finish`. False: it has to wait (`queue`)."""
        with self._lock:
            if self._running < self._statements:
                self._running += 1
                return True
            return False

    def queue(self, waiting: Waiting) -> bool:
        """Queue an append for the next group; True instead if a statement ended since
        `try_run` and it may run now, alone (as there)."""
        with self._lock:
            if self._running < self._statements:
                self._running += 1
                return True
            self._waiting.append(waiting)
            return False

    def finish(self) -> list[Waiting]:
        """A statement ended: the group to run next in its place (it keeps counting as
        running), or an empty list when nothing waits (one statement fewer runs)."""
        with self._lock:
            group = self._take()
            if not group:
                self._running -= 1
            return group

    def withdraw(self, waiting: Waiting) -> bool:
        """Take a waiting append out of the queue (its caller gave up); False if a group
        has already taken it."""
        with self._lock:
            if waiting.taken:
                return False
            self._waiting.remove(waiting)
            return True

    def _take(self) -> list[Waiting]:
        group: list[Waiting] = []
        ids: set[str] = set()
        events = 0
        passed: list[Waiting] = []
        queue = self._waiting
        while queue:
            waiting = queue.popleft()
            batch = waiting.batch
            count = len(batch.payloads)
            if batch.persistence_id in ids or (group and events + count > self._max_events):
                passed.append(waiting)
                continue
            ids.add(batch.persistence_id)
            events += count
            waiting.taken = True
            group.append(waiting)
        queue.extendleft(reversed(passed))  # what did not fit keeps its place
        return group


def stored_in_group(size: int, rows: Sequence[tuple[Any, ...]]) -> list[datetime | None]:
    """Each append's `stored_at` from the group statement's rows `(n, db_timestamp)`
    (positions from 1): None for an append that stored nothing."""
    stored: list[datetime | None] = [None] * size
    for n, stored_at in rows:
        stored[n - 1] = stored_at
    return stored

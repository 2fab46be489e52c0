"""When concurrent appends of one process share a statement: a group commit.

Why: every append on the pool's own connections is one statement, one round
trip and one commit. With many appends in flight in one process the client's
CPU per statement and the server's per commit are the limit, not the rows.
Pekko's journals take a batch of `AtomicWrite`s in one call for the same
reason, each with its own outcome.

The rule (`AppendGroups`): at most `statements` append statements run at once
on the journal's own connections. An append that arrives below that runs at
once and alone, as before (no wait is added to a lone writer). One that arrives
while that many run waits; when a statement ends, what waits (up to
`max_events` events and `max_bytes` of payload, one append per persistence id)
goes as one statement, `WriterSql.append_group`, in one transaction. An append
that has waited `ESCAPE_SECONDS` without being sent runs alone beyond the
bound: the statements running may be blocked by a transaction that waits for
that very append (a caller's own transaction, `conn=`, holding a row the
others need), and the bound must not turn that into a deadlock the server
cannot see.

Each append in a group is still all or nothing, with its own outcome: one
whose `expected_seq_nr` is not current stores nothing (its caller gets
`ConcurrencyError`), the others are stored. When the server rolls the group
back (two writers racing for a seq_nr collide on the primary key; a row lock
not granted within the group's `lock_timeout`; a value refused) each caller
runs its append alone, concurrently, so each gets the outcome it would have
had alone, and none waits behind another's lock. The lock timeout matters: a
group waiting for a row that a caller's own open transaction inserted would
otherwise wait for a caller that waits for the group. Two appends to one id
never share a group, and a later one never goes in a group ahead of an earlier
one still waiting: the second's `expected_seq_nr` usually names the first's
last event.

An append's life here: queued, taken into a group, sent. Its caller may give up
(`withdraw`) until it is sent; a group sends only what is still wanted.

This module is the decision only, with no I/O and no waiting: the drivers
(`journal/aio/writer.py` and its sync twin) run the statements and wake the
callers. Its state is guarded by a lock, for the sync flavour's threads.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from enum import Enum
from typing import Any, Final

import attrs

from journal.writer import PreparedAppend

# How long an append waits for a group before it runs alone, beyond the bound.
ESCAPE_SECONDS: Final = 0.1


class Stage(Enum):
    QUEUED = "queued"
    TAKEN = "taken"
    SENT = "sent"
    WITHDRAWN = "withdrawn"


@attrs.define(eq=False)
class Waiting:
    """An append waiting for a group; `done` (the driver's event) is set once it has
    its outcome: `stored_at` (None: `expected_seq_nr` was not current) or `error`."""

    batch: PreparedAppend
    done: Any
    stored_at: datetime | None = None
    error: BaseException | None = None
    stage: Stage = Stage.QUEUED
    # When it was queued (the driver's monotonic clock), for `expired`.
    queued_at: float = 0.0
    # The outcome "run it alone": its group was not sent or rolled back, and the
    # caller runs it on its own connection, as an append without a group would.
    alone: bool = False
    # The outcome "run it alone, in place of a statement": a group of it alone, which
    # its caller runs as an append without a group would, holding that statement's place.
    leads: bool = False
    # The outcome "run this group, then pass the place on" (the blocking flavour, where
    # a thread of its own is dear): the group, sent, of which it is the first.
    group: list[Waiting] | None = None
    payload_bytes: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.payload_bytes = sum(len(p.payload) for p in self.batch.payloads)

    def succeeded(self, stored_at: datetime | None) -> None:
        self.stored_at = stored_at
        self.done.set()

    def failed(self, error: BaseException) -> None:
        self.error = error
        self.done.set()

    def run_alone(self) -> None:
        self.alone = True
        self.done.set()


class AppendGroups:
    """How many append statements run, and what waits for the next one."""

    def __init__(self, statements: int, max_events: int, max_bytes: int) -> None:
        self._statements = statements
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._running = 0
        self._waiting: deque[Waiting] = deque()
        # Every append queued or taken and not sent or withdrawn yet, oldest first.
        self._unsent: dict[Waiting, None] = {}
        self._last_queued = 0.0
        self._lock = threading.Lock()

    @property
    def running(self) -> int:
        """The append statements running now (escaped appends not counted)."""
        return self._running

    def try_run(self) -> bool:
        """True if an append may run now, alone: it then counts as running until its
        statement's `finish`. False: it has to wait (`queue`)."""
        with self._lock:
            if self._running < self._statements:
                self._running += 1
                return True
            return False

    def queue(self, waiting: Waiting, now: float) -> bool:
        """Queue an append for the next group at time `now`; True instead if a statement
        ended since `try_run` and it may run now, alone (as there)."""
        with self._lock:
            if self._running < self._statements:
                self._running += 1
                return True
            # In queue order, whatever the threads' clock readings: `expired` relies on it.
            waiting.queued_at = self._last_queued = max(now, self._last_queued)
            self._waiting.append(waiting)
            self._unsent[waiting] = None
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
        """Its caller gives up on an append (cancelled, or it runs alone instead): True
        if it will not be sent; False if it has been sent already."""
        with self._lock:
            return self._withdraw(waiting)

    def _withdraw(self, waiting: Waiting, *, queued: bool = True) -> bool:
        if waiting.stage is Stage.SENT:
            return False
        if waiting.stage is Stage.QUEUED and queued:
            self._waiting.remove(waiting)
        waiting.stage = Stage.WITHDRAWN
        self._unsent.pop(waiting, None)
        return True

    def expired(self, before: float) -> list[Waiting]:
        """Withdraw every append queued before `before` and not sent yet (they are to run
        alone, `ESCAPE_SECONDS`), oldest first."""
        with self._lock:
            late = []
            for waiting in self._unsent:
                if waiting.queued_at > before:
                    break
                late.append(waiting)
            for waiting in late:
                self._withdraw(waiting, queued=False)
            if late:  # out of the queue at once, not one `remove` each
                self._waiting = deque(w for w in self._waiting if w.stage is Stage.QUEUED)
            return late

    def oldest_unsent(self) -> float | None:
        """When the oldest append not sent yet was queued; None if there is none."""
        with self._lock:
            for waiting in self._unsent:
                return waiting.queued_at
            return None

    def hand_over(self, group: Sequence[Waiting]) -> Waiting | None:
        """Send a group to be run by the caller of its first append still wanted: its
        role (`leads` for a group of one, else `group`) is given under the lock, so a
        caller giving up at that moment sees it. None if nothing is still wanted. The
        driver then wakes it (`done`)."""
        with self._lock:
            sent = self._send(group)
            if not sent:
                return None
            leader = sent[0]
            if len(sent) == 1:
                leader.leads = True
            else:
                leader.group = sent
            return leader

    def send(self, group: Sequence[Waiting]) -> list[Waiting]:
        """The appends of a group still wanted, now sent (no longer withdrawable); called
        just before their statement goes to the server."""
        with self._lock:
            return self._send(group)

    def _send(self, group: Sequence[Waiting]) -> list[Waiting]:
        sent = [w for w in group if w.stage is Stage.TAKEN]
        for waiting in sent:
            waiting.stage = Stage.SENT
            del self._unsent[waiting]
        return sent

    def _take(self) -> list[Waiting]:
        group: list[Waiting] = []
        ids: set[str] = set()
        events = size = 0
        passed: list[Waiting] = []
        queue = self._waiting
        while queue:
            waiting = queue.popleft()
            pid = waiting.batch.persistence_id
            count = len(waiting.batch.payloads)
            fits = not group or (
                events + count <= self._max_events
                and size + waiting.payload_bytes <= self._max_bytes
            )
            if pid in ids or not fits:
                ids.add(pid)  # a later append of this id must not pass this one
                passed.append(waiting)
                continue
            ids.add(pid)
            events += count
            size += waiting.payload_bytes
            waiting.stage = Stage.TAKEN
            group.append(waiting)
        queue.extendleft(reversed(passed))  # what did not go keeps its place
        return group


def stored_in_group(size: int, rows: Sequence[tuple[Any, ...]]) -> list[datetime | None]:
    """Each append's `stored_at` from the group statement's rows `(n, db_timestamp)`
    (positions from 1): None for an append that stored nothing."""
    stored: list[datetime | None] = [None] * size
    for n, stored_at in rows:
        stored[n - 1] = stored_at
    return stored

"""`SyncAggregateRepository`: event-sourced aggregates on the synchronous journal.

The same rules as `AggregateRepository` (they live in `AggregateRules`):
load from the latest snapshot plus the events after it, persist with the
loaded seq_nr as `expected_seq_nr`, snapshot when a write crosses a multiple
of N, and retry a decide-and-persist function on `ConcurrencyError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from psycopg import Connection

from journal.aggregate import AggregateRules, Loaded
from journal.errors import ConcurrencyError
from journal.sync_journal import SyncJournal

S = TypeVar("S")
E = TypeVar("E")


class SyncAggregateRepository(AggregateRules[S, E]):
    """Loads, evolves and persists aggregates of one kind, blocking."""

    def __init__(
        self,
        journal: SyncJournal,
        *,
        initial: Callable[[], S],
        evolve: Callable[[S, E], S],
        snapshot_every: int | None = 100,
    ) -> None:
        super().__init__(initial=initial, evolve=evolve, snapshot_every=snapshot_every)
        self._journal = journal

    def load(self, persistence_id: str) -> Loaded[S]:
        """Rebuild the aggregate from its snapshot and the events after it."""
        state = self._initial()
        seq_nr = 0
        if self._snapshot_every is not None:
            snapshot = self._journal.load_snapshot(persistence_id)
            if snapshot is not None:
                state, seq_nr = snapshot.state, snapshot.seq_nr
        # Highest first, then fold up to it (see AggregateRepository.load).
        highest = self._journal.highest_seq_nr(persistence_id)
        for env in self._journal.current_events_by_persistence_id(
            persistence_id, from_seq_nr=seq_nr + 1, to_seq_nr=highest
        ):
            state = self._evolve(state, env.decoded_event())
            seq_nr = env.seq_nr
        return Loaded(persistence_id, state, max(seq_nr, highest))

    def persist(
        self,
        loaded: Loaded[S],
        events: Sequence[E],
        *,
        tags: Sequence[str] = (),
        conn: Connection[Any] | None = None,
    ) -> Loaded[S]:
        """Append `events` after `loaded.seq_nr`; `ConcurrencyError` if another writer won."""
        if not events:
            return loaded
        state = self._fold(loaded.state, events)
        self._journal.append(
            loaded.persistence_id, events, expected_seq_nr=loaded.seq_nr, tags=tags, conn=conn
        )
        new_seq = loaded.seq_nr + len(events)
        if conn is None and self._snapshot_due(loaded.seq_nr, new_seq):
            self._journal.save_snapshot(loaded.persistence_id, new_seq, state)
            self.snapshots_saved += 1
        return Loaded(loaded.persistence_id, state, new_seq)

    def update(
        self,
        persistence_id: str,
        decide: Callable[[S], Sequence[E]],
        *,
        max_attempts: int = 10,
        tags: Sequence[str] = (),
    ) -> Loaded[S]:
        """Load, `decide(state) -> events`, persist; on `ConcurrencyError` reload and retry."""
        for attempt in range(1, max_attempts + 1):
            loaded = self.load(persistence_id)
            try:
                return self.persist(loaded, list(decide(loaded.state)), tags=tags)
            except ConcurrencyError:
                if attempt == max_attempts:
                    raise
                time.sleep(self._backoff(attempt))
        raise AssertionError("unreachable")

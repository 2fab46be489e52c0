# Generated from journal/aio/aggregate.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The sync aggregate repository: load, decide, persist, snapshot, retry.

The rules (validation, folding, snapshot cadence, backoff) are
`journal.aggregate.AggregateRules`; this module only performs the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from psycopg import Connection

from journal.aggregate import AggregateRules, Loaded, SyncDecide
from journal.errors import ConcurrencyError
from journal.sync.flavour import sleep
from journal.sync.journal import SyncJournal

S = TypeVar("S")
E = TypeVar("E")


class SyncAggregateRepository(AggregateRules[S, E]):
    """Loads, evolves and persists aggregates of one kind.

    `initial` builds the state of an aggregate with no events; `evolve` applies
    one event. `snapshot_every=N` saves a snapshot whenever a write crosses a
    multiple of N (None disables snapshots).
    """

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
        # Read the highest seq_nr first and fold only up to it: an event committed
        # after that read then stays out of both, so `state` is exactly the state at
        # the returned seq_nr (asking afterwards could claim events never folded in).
        highest = self._journal.highest_seq_nr(persistence_id)
        for env in self._journal.current_events_by_persistence_id(
            persistence_id, from_seq_nr=seq_nr + 1, to_seq_nr=highest
        ):
            state = self._evolve(state, env.decoded_event())
            seq_nr = env.seq_nr
        # Deleted events are skipped by the query but still own their seq_nrs.
        seq_nr = max(seq_nr, highest)
        return Loaded(persistence_id, state, seq_nr)

    def persist(
        self,
        loaded: Loaded[S],
        events: Sequence[E],
        *,
        tags: Sequence[str] = (),
        conn: Connection[Any] | None = None,
    ) -> Loaded[S]:
        """Append `events` after `loaded.seq_nr` and return the evolved aggregate.

        Raises `ConcurrencyError` if another writer appended in between.
        """
        if not events:
            return loaded
        state = self._fold(loaded.state, events)
        self._journal.append(
            loaded.persistence_id, events, expected_seq_nr=loaded.seq_nr, tags=tags, conn=conn
        )
        new_seq = loaded.seq_nr + len(events)
        if conn is None and self._snapshot_due(loaded.seq_nr, new_seq):
            # Outside the append: a failed snapshot never undoes stored events.
            self._journal.save_snapshot(loaded.persistence_id, new_seq, state)
            self.snapshots_saved += 1
        return Loaded(loaded.persistence_id, state, new_seq)

    def update(
        self,
        persistence_id: str,
        decide: SyncDecide[S, E],
        *,
        max_attempts: int = 10,
        tags: Sequence[str] = (),
    ) -> Loaded[S]:
        """Load, `decide(state) -> events`, persist; on `ConcurrencyError` reload and retry.

        `decide` may be sync or async and may raise to reject the command.
        After `max_attempts` conflicts the last `ConcurrencyError` propagates.
        """
        for attempt in range(1, max_attempts + 1):
            loaded = self.load(persistence_id)
            decided = decide(loaded.state)
            events = decided
            try:
                return self.persist(loaded, list(events), tags=tags)
            except ConcurrencyError:
                if attempt == max_attempts:
                    raise
                sleep(self._backoff(attempt))
        raise AssertionError("unreachable")

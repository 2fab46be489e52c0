"""Event-sourced aggregates on top of the journal.

An aggregate's state is never stored as such: it is the fold of its events
with the caller's `evolve(state, event)`. The repository loads it (from the
latest snapshot plus the events after it), persists new events with
optimistic concurrency (the loaded seq_nr is the `expected_seq_nr`), saves a
snapshot every N events, and retries a decide-and-persist function when
another writer got there first.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import attrs
from psycopg import AsyncConnection

from journal.errors import ConcurrencyError, InvalidArgument
from journal.journal import Journal

S = TypeVar("S")
E = TypeVar("E")


@attrs.frozen
class Loaded(Generic[S]):
    """An aggregate's state as of `seq_nr` (0 = no events yet)."""

    persistence_id: str
    state: S
    seq_nr: int


Decide = Callable[[S], Sequence[E] | Awaitable[Sequence[E]]]


class AggregateRules(Generic[S, E]):
    """What both repositories (async and sync) share: validation, folding, snapshot cadence."""

    def __init__(
        self,
        *,
        initial: Callable[[], S],
        evolve: Callable[[S, E], S],
        snapshot_every: int | None = 100,
    ) -> None:
        if snapshot_every is not None and (
            isinstance(snapshot_every, bool)
            or not isinstance(snapshot_every, int)
            or snapshot_every < 1
        ):
            raise InvalidArgument(
                f"snapshot_every must be an int >= 1 or None, got {snapshot_every!r}"
            )
        self._initial = initial
        self._evolve = evolve
        self._snapshot_every = snapshot_every
        self.snapshots_saved = 0

    def _fold(self, state: S, events: Sequence[E]) -> S:
        for event in events:
            state = self._evolve(state, event)
        return state

    def _snapshot_due(self, before: int, after: int) -> bool:
        """Whether a write from seq_nr `before` to `after` crossed a multiple of N."""
        every = self._snapshot_every
        return every is not None and after // every > before // every

    @staticmethod
    def _backoff(attempt: int) -> float:
        return random.uniform(0, 0.002 * attempt)


class AggregateRepository(AggregateRules[S, E]):
    """Loads, evolves and persists aggregates of one kind.

    `initial` builds the state of an aggregate with no events; `evolve` applies
    one event. `snapshot_every=N` saves a snapshot whenever a write crosses a
    multiple of N (None disables snapshots).
    """

    def __init__(
        self,
        journal: Journal,
        *,
        initial: Callable[[], S],
        evolve: Callable[[S, E], S],
        snapshot_every: int | None = 100,
    ) -> None:
        super().__init__(initial=initial, evolve=evolve, snapshot_every=snapshot_every)
        self._journal = journal

    async def load(self, persistence_id: str) -> Loaded[S]:
        """Rebuild the aggregate from its snapshot and the events after it."""
        state = self._initial()
        seq_nr = 0
        if self._snapshot_every is not None:
            snapshot = await self._journal.load_snapshot(persistence_id)
            if snapshot is not None:
                state, seq_nr = snapshot.state, snapshot.seq_nr
        # Read the highest seq_nr first and fold only up to it: an event committed
        # after that read then stays out of both, so `state` is exactly the state at
        # the returned seq_nr (asking afterwards could claim events never folded in).
        highest = await self._journal.highest_seq_nr(persistence_id)
        async for env in self._journal.current_events_by_persistence_id(
            persistence_id, from_seq_nr=seq_nr + 1, to_seq_nr=highest
        ):
            state = self._evolve(state, env.decoded_event())
            seq_nr = env.seq_nr
        # Deleted events are skipped by the query but still own their seq_nrs.
        seq_nr = max(seq_nr, highest)
        return Loaded(persistence_id, state, seq_nr)

    async def persist(
        self,
        loaded: Loaded[S],
        events: Sequence[E],
        *,
        tags: Sequence[str] = (),
        conn: AsyncConnection[Any] | None = None,
    ) -> Loaded[S]:
        """Append `events` after `loaded.seq_nr` and return the evolved aggregate.

        Raises `ConcurrencyError` if another writer appended in between.
        """
        if not events:
            return loaded
        state = self._fold(loaded.state, events)
        await self._journal.append(
            loaded.persistence_id, events, expected_seq_nr=loaded.seq_nr, tags=tags, conn=conn
        )
        new_seq = loaded.seq_nr + len(events)
        if conn is None and self._snapshot_due(loaded.seq_nr, new_seq):
            # Outside the append: a failed snapshot never undoes stored events.
            await self._journal.save_snapshot(loaded.persistence_id, new_seq, state)
            self.snapshots_saved += 1
        return Loaded(loaded.persistence_id, state, new_seq)

    async def update(
        self,
        persistence_id: str,
        decide: Decide[S, E],
        *,
        max_attempts: int = 10,
        tags: Sequence[str] = (),
    ) -> Loaded[S]:
        """Load, `decide(state) -> events`, persist; on `ConcurrencyError` reload and retry.

        `decide` may be sync or async and may raise to reject the command.
        After `max_attempts` conflicts the last `ConcurrencyError` propagates.
        """
        for attempt in range(1, max_attempts + 1):
            loaded = await self.load(persistence_id)
            decided = decide(loaded.state)
            events = await decided if inspect.isawaitable(decided) else decided
            try:
                return await self.persist(loaded, list(events), tags=tags)
            except ConcurrencyError:
                if attempt == max_attempts:
                    raise
                await asyncio.sleep(self._backoff(attempt))
        raise AssertionError("unreachable")

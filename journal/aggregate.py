"""Event-sourced aggregates on top of the journal: the rules both repositories share.

An aggregate's state is never stored as such: it is the fold of its events
with the caller's `evolve(state, event)`. The repository loads it (from the
latest snapshot plus the events after it), persists new events with
optimistic concurrency (the loaded seq_nr is the `expected_seq_nr`), saves a
snapshot every N events, and retries a decide-and-persist function when
another writer got there first. The repositories themselves are drivers
(`journal/aio/aggregate.py` and its generated sync twin).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import attrs

from journal.errors import InvalidArgument

S = TypeVar("S")
E = TypeVar("E")


@attrs.frozen
class Loaded(Generic[S]):
    """An aggregate's state as of `seq_nr` (0 = no events yet)."""

    persistence_id: str
    state: S
    seq_nr: int


Decide = Callable[[S], Sequence[E] | Awaitable[Sequence[E]]]
SyncDecide = Callable[[S], Sequence[E]]


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

"""What a live slice query remembers between its readings of the open transactions.

`horizon.py` interprets one reading: its row, and what it means at one scan
position (`split`). A stream needs more than one reading, though: which
reading the next normal query may still use, whether the last one could be
trusted (that sets how long after a notification the event is readable), and
which open transactions it did not wait for, so that once one of them ends a
backtracking run re-reads from its start. That memory is this value.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

import attrs

from journal.query.horizon import (
    Blind,
    Horizon,
    ReadPast,
    Split,
    ended_since,
    read_past,
    split,
)
from journal.settings import HorizonSettings

_log = logging.getLogger("slicejournal.journal.query")


@attrs.frozen
class HorizonTracker:
    """The stream's readings of the open transactions, as far as they still matter.

    `unused` is the reading taken for the next normal query and not used yet
    (a `Blind` one is used too: it tells that query to stay behind the clock).
    `exact` is whether the last reading could be trusted; before the first,
    whether there will be readings at all. `not_waited_for` holds the open
    transactions (backend, start) the stream read past, and `ended` the starts
    of those that have ended since and not been re-read for yet.
    """

    settings: HorizonSettings
    enabled: bool
    exact: bool
    unused: Split | Blind | None = None
    not_waited_for: frozenset[ReadPast] = frozenset()
    ended: tuple[datetime, ...] = ()

    @classmethod
    def for_stream(cls, settings: HorizonSettings, live: bool) -> HorizonTracker:
        enabled = live and settings.enabled
        return cls(settings, enabled, exact=enabled)

    @property
    def reading_due(self) -> bool:
        """Whether the next normal query needs a reading first."""
        return self.enabled and self.unused is None

    def on_reading(self, horizon: Horizon, scan_from: datetime) -> HorizonTracker:
        """A reading taken just now, for the next normal query from `scan_from`."""
        if horizon.blind is not None:
            # Nothing can be concluded about who ended: keep what is known.
            return attrs.evolve(self, exact=False, unused=horizon.blind)
        parts = split(horizon, scan_from, self.settings)
        current = read_past(parts.not_waited_for)
        ended = self.ended
        if current != self.not_waited_for:
            gone = ended_since(self.not_waited_for, current)
            for start in gone:
                _log.debug("a transaction started at %s and not waited for has ended", start)
            for _, start in sorted(current - self.not_waited_for):
                _log.debug("not waiting for the open transaction started at %s", start)
            ended += tuple(gone)
        return self._with(True, parts, current, ended)

    def use_reading(self) -> tuple[HorizonTracker, Split | None]:
        """Use up the reading: what it means for the query, None to stay behind the clock."""
        reading = self.unused if isinstance(self.unused, Split) else None
        return self._with(self.exact, None, self.not_waited_for, self.ended), reading

    def _with(
        self,
        exact: bool,
        unused: Split | Blind | None,
        not_waited_for: frozenset[ReadPast],
        ended: tuple[datetime, ...],
    ) -> HorizonTracker:
        # A reading and its use come once per poll of every live stream: built
        # directly, as attrs.evolve costs several times more.
        return HorizonTracker(self.settings, self.enabled, exact, unused, not_waited_for, ended)

    def start_backtracking(self) -> tuple[HorizonTracker, tuple[datetime, ...]]:
        """A run starts: it takes over the ended transactions to re-read for.

        The reading is dropped: the run comes after it, so the next normal
        query needs a reading taken after the run.
        """
        return attrs.evolve(self, unused=None, ended=()), self.ended

    def lag(self, behind_current_time: timedelta) -> timedelta:
        """How long after a commit a live query can read it."""
        return self.settings.margin if self.exact else behind_current_time

    def rereads_due(self) -> Iterator[datetime]:
        """Starts of transactions not waited for and not yet re-read for by a run."""
        for _, start in self.not_waited_for:
            yield start
        yield from self.ended

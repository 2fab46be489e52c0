"""Why a projection instance stopped, as types a supervisor can act on.

Pure (no psycopg): the runners raise these, the fleet's supervisor tells a
handler that keeps failing (restart with backoff) from a lost lease (stop:
another worker owns the range now) and from an offset conflict (two
instances over one slice: a bug in how they were started, never retried).
"""

from __future__ import annotations

from journal.errors import JournalError


class ProjectionError(JournalError):
    """A projection stopped because its handler kept failing (or the stream failed)."""


class LeaseLost(ProjectionError):
    """The instance's lease was taken over or expired: its transaction was rolled back.

    Raised by an instance run with a `Fence` (a fleet worker's). Nothing of the
    failed transaction was committed; the range now belongs to another worker.
    """


class OffsetConflict(ProjectionError):
    """Another instance already stored the offset of an event this one was committing.

    Two instances whose slice ranges overlap ran at once; the transaction was
    rolled back, so the event was applied once. Not retried: a retry could only
    fail the same way.
    """


class UnknownProjection(JournalError):
    """No projection of that name ever stored an offset, was paused/resumed or dead-lettered."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"unknown projection {name!r}: it has no stored offsets, no pause/resume entries "
            "and no dead letters (check the name; a projection is known once it has "
            "processed an event or been paused, resumed or given an offset)"
        )


class WaitTimeout(JournalError):
    """`ProjectionManagement.wait_for` timed out: the projection had not handled every
    given event. `pending` lists the (persistence_id, seq_nr) it was still waiting for."""

    def __init__(self, message: str, *, name: str, pending: list[tuple[str, int]]) -> None:
        super().__init__(message)
        self.name = name
        self.pending = pending

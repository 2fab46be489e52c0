"""The journal's exception hierarchy.

Every failure a caller can act on has its own type under `JournalError`, so
services can catch "the journal said no" without catching programming errors,
and so a message always names the thing that was wrong (pid, seq_nr, setting).
"""

from __future__ import annotations


class JournalError(Exception):
    """Base class of every error raised by slicejournal."""


class InvalidPersistenceId(JournalError, ValueError):
    """A persistence id (or one of its parts) is empty, too long or malformed."""


class InvalidSettings(JournalError, ValueError):
    """A settings object was built with a value outside its allowed range."""


class InvalidArgument(JournalError, ValueError):
    """An argument to a journal operation is out of range or of the wrong type."""


class ConcurrencyError(JournalError):
    """`append` was called with an `expected_seq_nr` that is not the current highest one."""

    def __init__(self, persistence_id: str, expected_seq_nr: int, actual_seq_nr: int) -> None:
        self.persistence_id = persistence_id
        self.expected_seq_nr = expected_seq_nr
        self.actual_seq_nr = actual_seq_nr
        super().__init__(
            f"concurrent modification of {persistence_id!r}: expected highest seq_nr "
            f"{expected_seq_nr}, but the journal has {actual_seq_nr}"
        )


class SerializationError(JournalError):
    """An event, snapshot or metadata value could not be turned into bytes."""


class DeserializationError(JournalError):
    """A stored payload could not be read back (unknown serializer id or manifest, bad bytes)."""

    def __init__(
        self, message: str, *, persistence_id: str | None = None, seq_nr: int | None = None
    ):
        self.persistence_id = persistence_id
        self.seq_nr = seq_nr
        where = ""
        if persistence_id is not None:
            where = f" (persistence id {persistence_id!r}, seq_nr {seq_nr})"
        super().__init__(message + where)


class EmbeddedServerError(JournalError):
    """The embedded PostgreSQL server could not be started."""

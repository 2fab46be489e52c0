"""The journal's exception hierarchy.

Every failure a caller can act on has its own type under `JournalError`, so
services can catch "the journal said no" without catching programming errors,
and so a message always names the thing that was wrong (pid, seq_nr, setting).
"""

from __future__ import annotations

import shlex


class JournalError(Exception):
    """Base class of every error raised by slicejournal."""


class InvalidPersistenceId(JournalError, ValueError):
    """A persistence id (or one of its parts) is empty, too long or malformed."""


class InvalidSettings(JournalError, ValueError):
    """A settings object was built with a value outside its allowed range."""


class InvalidArgument(JournalError, ValueError):
    """An argument to a journal operation is out of range or of the wrong type."""


class ConnectionFailed(JournalError):
    """PostgreSQL could not be reached or refused the connection (host, port and reason named).

    Raised within the `connect_timeout` of `JournalSettings` by `Journal.connect`,
    `Journal.open` and `slicejournal migrate`; the message never contains the password.
    """


class ConnectionLost(JournalError):
    """The connection broke during a call (server restart, backend terminated, network);
    the call's outcome is unknown unless it was a read. The psycopg error is `__cause__`."""


class JournalClosed(JournalError, RuntimeError):
    """The journal was used after `close()` (or before `open()`): nothing was sent to the
    database, so no write's outcome is in doubt. Open a new `Journal`; a closed one
    cannot be reopened. Also a `RuntimeError`."""


class PoolExhausted(JournalError):
    """No pooled connection became free within the pool's timeout (raise
    `JournalSettings.pool_max_size`, or look for connections held too long)."""


class QueryCancelled(JournalError):
    """The server cancelled a statement (statement_timeout, pg_cancel_backend)."""


class LockTimeout(JournalError):
    """A statement waited longer than its `lock_timeout` for a lock another transaction
    held, and the server cancelled it; its transaction was rolled back, so nothing of it
    was applied. Retry once that transaction has ended (`pg_stat_activity` shows it)."""


class DatabaseError(JournalError):
    """Any other error the database reported for a journal call (psycopg's is `__cause__`)."""


class SchemaNotInitialized(JournalError):
    """A journal table does not exist: run `slicejournal migrate` (or pass `create_schema=True`)."""

    def __init__(self, schema: str, table: str, where: str | None = None) -> None:
        self.schema = schema
        self.table = table
        location = f" in {where}" if where else ""
        super().__init__(
            f"table {schema}.{table} does not exist{location}: the journal schema {schema!r} "
            "is not initialised; run `slicejournal migrate --dsn DSN --schema "
            f"{shlex.quote(schema)}` "
            "once, or pass create_schema=True to Journal.connect"
        )


class SchemaOutdated(JournalError):
    """The database's schema is older than this library: run `slicejournal migrate`."""

    def __init__(self, schema: str, detail: str) -> None:
        self.schema = schema
        super().__init__(
            f"the journal schema {schema!r} is older than this slicejournal release ({detail}); "
            f"run `slicejournal migrate --dsn DSN --schema {shlex.quote(schema)}` first"
        )


class SchemaTooNew(JournalError):
    """The database's schema was migrated by a newer release: this one must not write to it."""

    def __init__(self, schema: str, detail: str) -> None:
        self.schema = schema
        super().__init__(
            f"the journal schema {schema!r} was migrated by a newer slicejournal release "
            f"({detail}); this release refuses to use it: upgrade the library"
        )


class ProtocolError(JournalError, RuntimeError):
    """A sans-I/O state machine (the slice query's, a projection's `ProjectionCore`) was
    driven out of order, or the database answered what no statement can: a driver bug,
    never bad data. Also a `RuntimeError`."""


class ConcurrencyError(JournalError):
    """`append` was called with an `expected_seq_nr` that is not the current highest one
    (or a durable state write with a revision that is not the stored one + 1: then
    `expected_seq_nr` is the revision the write expected to find, `what` "revision")."""

    def __init__(
        self,
        persistence_id: str,
        expected_seq_nr: int,
        actual_seq_nr: int,
        *,
        what: str = "highest seq_nr",
        store: str = "journal",
    ) -> None:
        self.persistence_id = persistence_id
        self.expected_seq_nr = expected_seq_nr
        self.actual_seq_nr = actual_seq_nr
        if what == "revision":
            # A durable state write names the *new* revision: say which one it was.
            message = (
                f"concurrent modification of {persistence_id!r}: revision "
                f"{expected_seq_nr + 1} needs the stored revision to be {expected_seq_nr}, "
                f"but the {store} has {actual_seq_nr}"
            )
        else:
            message = (
                f"concurrent modification of {persistence_id!r}: expected {what} "
                f"{expected_seq_nr}, but the {store} has {actual_seq_nr}"
            )
        super().__init__(message)


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

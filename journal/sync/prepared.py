# Generated from journal/aio/prepared.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""Running a `WireStatement` with libpq's own calls, prepared once per connection.

Why not a cursor: for a statement as short as an append, psycopg's cursor
costs about as much client CPU as everything else together (`journal/wire.py`
has the figures); libpq's `PQsendQueryPrepared` and psycopg's own wait on the
connection do the same work without it. psycopg still owns the connection: its
`wait` runs the exchange (and on cancellation cancels the statement on the
server), its errors are raised for a failed result.

What is psycopg's own and not public is checked once (`PREPARED`): its
`generators.execute` and `errors.error_from_result`. Without them, or for a
session whose client encoding is not UTF8 (the binary text values are UTF-8),
`run` returns `NOT_RUN` and the caller uses a cursor, as before.

A statement is prepared on a connection the first time it runs there; the
names are remembered per connection object (weakly: they go when it does). If
the session lost it (`DEALLOCATE ALL`, `DISCARD ALL`), it is prepared again
and the statement runs once more; if the session has it though the name was
not remembered (a task cancelled while its statement was being prepared), it
is used as it is: a name is a hash of the statement's text and types.
"""

from __future__ import annotations

import weakref
from typing import Any, Final

from psycopg import Connection, RawCursor, errors, generators, pq

from journal.wire import Positional, WireStatement

PREPARED: bool = hasattr(generators, "execute") and hasattr(errors, "error_from_result")

# What `run` returns when it did not run the statement (the caller uses a cursor).
NOT_RUN: Final[Any] = object()

_BINARY: Final = pq.Format.BINARY
_TUPLES_OK: Final = pq.ExecStatus.TUPLES_OK
_COMMAND_OK: Final = pq.ExecStatus.COMMAND_OK
_SQLSTATE: Final = pq.DiagnosticField.SQLSTATE
_FATAL_ERROR: Final = pq.ExecStatus.FATAL_ERROR
_NO_SUCH_STATEMENT: Final = b"26000"  # invalid_sql_statement_name
_ALREADY_PREPARED: Final = b"42P05"  # duplicate_prepared_statement
_UTF8: Final = b"UTF8"

# The statements prepared on each connection, by name.
_prepared: weakref.WeakKeyDictionary[Connection[Any], set[bytes]] = weakref.WeakKeyDictionary()


def first_row(
    conn: Connection[Any], statement: Positional, values: list[Any], *, prepared: bool
) -> tuple[Any, ...] | None:
    """The first row of `statement`'s result (None if it has none).

    With `prepared` (a pool's connection held for this statement alone: idle,
    autocommit, not in pipeline mode) a statement that has a `wire` form runs through
    libpq (`run`); otherwise, or where that declines, through a raw cursor.
    """
    wire = statement.wire
    if prepared and wire is not None:
        result = _run_encoded(conn, wire, values)
        if result is not None:
            return wire.first_row(result, conn.info.timezone)
    with RawCursor(conn) as cur:  # numbered placeholders
        cur.execute(statement.text, values)
        row: tuple[Any, ...] | None = cur.fetchone()
        return row


def rows(
    conn: Connection[Any], statement: Positional, values: list[Any]
) -> list[tuple[Any, ...]] | None:
    """Every row of `statement`'s result, run through libpq on a pool's connection held
    for it alone (as `first_row` with `prepared`); None if it cannot run that way (a
    value its type cannot hold, a session that is not UTF8): the caller does otherwise."""
    wire = statement.wire
    if wire is None:
        return None
    result = _run_encoded(conn, wire, values)
    return None if result is None else wire.rows(result, conn.info.timezone)


def _run_encoded(
    conn: Connection[Any], statement: WireStatement, values: list[Any]
) -> pq.abc.PGresult | None:
    """`run` with `values` encoded first; None where a value does not fit its type or
    the statement cannot run this way (`NOT_RUN`)."""
    encoded = statement.encode(values)
    if encoded is None:
        return None
    result = run(conn, statement, encoded)
    return None if result is NOT_RUN else result


def run(
    conn: Connection[Any], statement: WireStatement, values: list[bytes | None]
) -> pq.abc.PGresult | Any:
    """The result of `statement` with its encoded `values` (binary rows), on an idle
    autocommit connection; `NOT_RUN` if it cannot be run this way. A failed statement
    raises psycopg's error for it (`UniqueViolation`, ...)."""
    pgconn = conn.pgconn
    if not PREPARED or pgconn.parameter_status(b"client_encoding") != _UTF8:
        return NOT_RUN
    names = _prepared.get(conn)
    if names is None:
        names = _prepared[conn] = set()
    for attempt in (1, 2):
        if statement.name not in names:
            pgconn.send_prepare(statement.name, statement.text, statement.oids)
            prepared = (conn.wait(generators.execute(pgconn)))[-1]
            if prepared.error_field(_SQLSTATE) != _ALREADY_PREPARED:
                _check(conn, prepared, _COMMAND_OK)
            names.add(statement.name)
        pgconn.send_query_prepared(statement.name, values, statement.formats, _BINARY)
        result = (conn.wait(generators.execute(pgconn)))[-1]
        if result.status == _TUPLES_OK:
            return result
        if attempt == 1 and result.error_field(_SQLSTATE) == _NO_SUCH_STATEMENT:
            names.discard(statement.name)  # the session forgot it: prepare it again
            continue
        _check(conn, result, _TUPLES_OK)
    raise AssertionError("unreachable")  # pragma: no cover


def _check(conn: Connection[Any], result: pq.abc.PGresult, expected: Any) -> None:
    """Raise psycopg's error for a failed result, `InternalError` for any other that is
    not `expected` (as psycopg's cursor does)."""
    if result.status == expected:
        return
    if result.status == _FATAL_ERROR:
        raise errors.error_from_result(result, encoding=conn.info.encoding)
    raise errors.InternalError(f"unexpected result status: {pq.ExecStatus(result.status).name}")

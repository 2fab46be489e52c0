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
names are remembered per connection (weakly: a closed connection takes them
with it). If the session lost it (`DEALLOCATE ALL`, `DISCARD ALL`), it is
prepared again and the statement runs once more.
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
_NO_SUCH_STATEMENT: Final = b"26000"  # invalid_sql_statement_name
_UTF8: Final = b"UTF8"

# The statements prepared on each connection, by name.
_prepared: weakref.WeakKeyDictionary[Connection[Any], set[bytes]] = weakref.WeakKeyDictionary()


def first_row(
    conn: Connection[Any], statement: Positional, values: list[Any], *, prepared: bool
) -> tuple[Any, ...] | None:
    """The first row of `statement`'s result (None if it has none).

    With `prepared` (the connection is the caller's own, idle and autocommit) a
    statement that has a `wire` form runs through libpq (`run`); otherwise, or where
    that declines, through a raw cursor, as psycopg runs any statement.
    """
    wire = statement.wire
    if prepared and wire is not None:
        encoded = wire.encode(values)
        if encoded is not None:
            result = run(conn, wire, encoded)
            if result is not NOT_RUN:
                return wire.first_row(result)
    with RawCursor(conn) as cur:  # numbered placeholders
        cur.execute(statement.text, values)
        row: tuple[Any, ...] | None = cur.fetchone()
        return row


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
    formats = [_BINARY] * len(values)
    for attempt in (1, 2):
        if statement.name not in names:
            pgconn.send_prepare(statement.name, statement.text, statement.oids)
            _check(conn, conn.wait(generators.execute(pgconn)), _COMMAND_OK)
            names.add(statement.name)
        pgconn.send_query_prepared(statement.name, values, formats, _BINARY)
        result = (conn.wait(generators.execute(pgconn)))[-1]
        if result.status == _TUPLES_OK:
            return result
        if attempt == 1 and result.error_field(_SQLSTATE) == _NO_SUCH_STATEMENT:
            names.discard(statement.name)  # the session forgot it: prepare it again
            continue
        _check(conn, [result], _TUPLES_OK)
    raise AssertionError("unreachable")  # pragma: no cover


def _check(conn: Connection[Any], results: list[pq.abc.PGresult], expected: Any) -> None:
    """Raise psycopg's error for a result that is not `expected`."""
    result = results[-1]
    if result.status != expected:
        raise errors.error_from_result(result, encoding=conn.info.encoding)

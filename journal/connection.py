"""The driver boundary's errors: typed, one line, never with a password in them.

Both drivers (`journal/aio/pool.py` and its generated twin) open every
connection and pool through these helpers, so an unreachable server, a bad
password or a malformed DSN surfaces as a `ConnectionFailed` /
`InvalidArgument` naming the host and port, never as a psycopg traceback; and
"relation does not exist" on one of the journal's own tables becomes
`SchemaNotInitialized`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, Protocol, TypeVar, cast

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolClosed, PoolTimeout

from journal.dsn import display_dsn, dsn_secrets, redact_dsn, userinfo_problem
from journal.errors import (
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    InvalidArgument,
    JournalClosed,
    JournalError,
    LockTimeout,
    PoolExhausted,
    QueryCancelled,
    SchemaNotInitialized,
)
from journal.settings import JournalSettings
from journal.tables import Tables

MASK = "***"


def mask_secrets(text: str, dsn: str) -> str:
    """`text` with the DSN (as written) shown redacted and every password-like part of
    it replaced by `***`."""
    text = text.replace(dsn, redact_dsn(dsn))
    for secret in dsn_secrets(dsn):
        text = text.replace(secret, MASK)
    return text


def one_line(error: BaseException | str) -> str:
    """A (possibly multi-line) driver message as one line, its lines as sentences."""
    parts = [part.strip() for part in str(error).splitlines() if part.strip()]
    return " ".join(
        p if i == len(parts) - 1 or p[-1] in ".:;,!?" else p + "." for i, p in enumerate(parts)
    )


def parse_dsn(dsn: object) -> dict[str, Any]:
    """The DSN's parameters, or `InvalidArgument` (password masked) if it is malformed."""
    if not isinstance(dsn, str):
        raise InvalidArgument(f"DSN must be a str, got {type(dsn).__name__}")
    problem = userinfo_problem(dsn)
    if problem is not None:
        raise InvalidArgument(f"invalid DSN {redact_dsn(dsn)!r}: {problem}")
    try:
        return conninfo_to_dict(dsn)
    except psycopg.Error as e:
        raise InvalidArgument(
            f"invalid DSN {redact_dsn(dsn)!r}: {mask_secrets(one_line(e), dsn)}"
        ) from None


def server_address(params: dict[str, Any]) -> str:
    """Host and port (or socket directory) a set of connection parameters points at."""
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST")
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    if not host:
        return f"the default socket directory, port {port}"
    if str(host).startswith("/"):
        return f"socket directory {host}, port {port}"
    return f"{host}:{port}"


def describe(conn: AsyncConnection[Any] | Connection[Any]) -> str:
    """Where an open connection points, as `database NAME at HOST:PORT` (for messages)."""
    info = conn.info
    return where_of({"dbname": info.dbname, "host": info.host, "port": str(info.port)})


def where_of(params: dict[str, Any]) -> str:
    """Where connection parameters point, as `database NAME at HOST:PORT` (for messages)."""
    dbname = params.get("dbname") or os.environ.get("PGDATABASE")
    database = f"database {dbname!r} at " if dbname else ""
    return database + server_address(params)


def connection_failed(dsn: str, error: BaseException | str) -> ConnectionFailed:
    """A one-line `ConnectionFailed` for `error`, naming the server and never the password."""
    params = parse_dsn(dsn)
    reason = one_line(error)
    for prefix in ("connection failed: ", "connection is bad: "):
        reason = reason.removeprefix(prefix)
    if not reason and isinstance(error, BaseException):
        reason = type(error).__name__
    return ConnectionFailed(
        f"cannot connect to PostgreSQL at {server_address(params)} ({display_dsn(dsn)}): "
        f"{mask_secrets(reason, dsn)}"
    )


@contextlib.contextmanager
def connect_errors(dsn: str) -> Iterator[None]:
    """Turn a driver's connect failure into `InvalidArgument` / `ConnectionFailed`."""
    parse_dsn(dsn)
    try:
        yield
    except psycopg.ProgrammingError as e:  # an option libpq rejects (bad value, unknown key)
        raise InvalidArgument(
            f"invalid DSN {display_dsn(dsn)!r}: {mask_secrets(one_line(e), dsn)}"
        ) from None
    except psycopg.OperationalError as e:
        raise connection_failed(dsn, e) from None


class TableSet(Protocol):
    """The tables of one component in one schema: what `schema_errors` recognises."""

    @property
    def schema_name(self) -> str: ...

    def table_names(self) -> tuple[str, ...]: ...


def _missing_table(tables: TableSet, error: psycopg.errors.UndefinedTable) -> str | None:
    """Which of `tables` the error is about, if any (a handler's own is not)."""
    message = error.diag.message_primary or str(error)
    schema = tables.schema_name
    for table in tables.table_names():
        # Not a prefix of a longer name: a handler's own "public.snapshot_x" is not ours.
        if re.search(rf"(?<![\w$]){re.escape(f'{schema}.{table}')}(?![\w$])", message):
            return table
    return None


@contextlib.contextmanager
def schema_errors(tables: TableSet, where: str | None = None) -> Iterator[None]:
    """Turn "relation does not exist" on one of `tables` into `SchemaNotInitialized`
    (the journal's pools pass the journal's; a component built on it passes its own)."""
    try:
        yield
    except psycopg.errors.UndefinedTable as e:
        error = schema_error(tables, e, where)
        if error is None:
            raise
        raise error from e


def schema_error(
    tables: TableSet, e: BaseException | None, where: str | None = None
) -> SchemaNotInitialized | None:
    """`schema_errors`' error for `e`, or None if `e` is not about one of `tables`."""
    if not isinstance(e, psycopg.errors.UndefinedTable):
        return None
    table = _missing_table(tables, e)
    if table is None:
        return None
    return SchemaNotInitialized(tables.schema_name, table, where)


TABLE_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"


def schema_missing(
    conn: AsyncConnection[Any] | Connection[Any], tables: Tables
) -> SchemaNotInitialized:
    """The error for a database where `TABLE_EXISTS` found no journal table."""
    return SchemaNotInitialized(
        tables.settings.schema, tables.settings.journal_table, describe(conn)
    )


def connect_timeout_of(dsn: str, default: int) -> dict[str, Any]:
    """`{"connect_timeout": default}`, or nothing if the DSN sets its own (which wins)."""
    return {} if "connect_timeout" in parse_dsn(dsn) else {"connect_timeout": default}


def pool_kwargs(
    settings: JournalSettings, name: str, application_name: str | None, dsn: str = ""
) -> dict[str, Any]:
    """The pool arguments both drivers' pools are built with (closed until `open_checked`);
    a `connect_timeout` in the DSN wins over the settings'."""
    kwargs: dict[str, Any] = {
        "autocommit": True,
        **connect_timeout_of(dsn, settings.connect_timeout_seconds),
    }
    if application_name is not None:
        kwargs["application_name"] = application_name
    return {
        "kwargs": kwargs,
        "min_size": settings.pool_min_size,
        "max_size": settings.pool_max_size,
        "open": False,
        "name": name,
    }


def pool_timed_out(dsn: str, name: str, min_size: int, timeout: int, e: Exception) -> Exception:
    """The `ConnectionFailed` for a pool that could not open its first connections."""
    return connection_failed(
        dsn,
        f"pool {name!r} could not open its {min_size} connection(s) "
        f"within {timeout} s ({e}); is max_connections reached?",
    )


@contextlib.contextmanager
def driver_errors() -> Iterator[None]:
    """psycopg errors escaping a public call as `JournalError`s, the original as `__cause__`.

    Used at the public API's edge only: inside, the runners and the fleet look at
    psycopg's own errors (a fence's SQLSTATE, a lock timeout), and an error raised
    by a handler's own SQL reaches the handler as psycopg raised it.
    """
    try:
        yield
    except JournalError:
        raise
    except psycopg.Error as e:
        raise journal_error(e) from e


def journal_error(e: psycopg.Error) -> JournalError:
    """The `JournalError` a psycopg error escapes a public call as (`driver_errors`)."""
    if isinstance(e, PoolClosed):  # an OperationalError, but nothing was lost: nothing was sent
        state = "not open yet" if "not open yet" in str(e) else "closed"
        return JournalClosed(
            f"the journal is {state}: nothing was sent to the database ({one_line(e)}); "
            "use it between `open()` (or `Journal.connect`) and `close()`"
        )
    if isinstance(e, PoolTimeout):
        return PoolExhausted(f"no pooled connection became free in time: {one_line(e)}")
    if isinstance(e, psycopg.errors.QueryCanceled):
        return QueryCancelled(f"the server cancelled the statement: {one_line(e)}")
    if isinstance(e, psycopg.errors.LockNotAvailable):  # an OperationalError, not a lost one
        return LockTimeout(
            f"a lock held by another transaction was not granted in time: {one_line(e)}; "
            "retry once that transaction has ended"
        )
    if isinstance(e, psycopg.OperationalError):
        return ConnectionLost(f"the connection to PostgreSQL was lost: {one_line(e)}")
    return DatabaseError(f"the database refused the call: {one_line(e)}")


P = ParamSpec("P")
R = TypeVar("R")


def translate_errors(function: Callable[P, R]) -> Callable[P, R]:
    """`driver_errors` around a public method (a coroutine function or a plain one)."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def translated_async(*args: P.args, **kwargs: P.kwargs) -> Any:
            with driver_errors():
                return await function(*args, **kwargs)

        return cast(Callable[P, R], translated_async)

    @functools.wraps(function)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        with driver_errors():
            return function(*args, **kwargs)

    return translated

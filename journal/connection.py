"""The driver boundary: connecting to PostgreSQL with typed, one-line errors.

Everything that opens a connection goes through `connect` (or a `JournalPool`),
so an unreachable server, a bad password or a malformed DSN surfaces as a
`ConnectionFailed` / `InvalidArgument` naming the host and port, never as a
psycopg traceback, and never with the password in it. `JournalPool` also turns
"relation does not exist" on one of the journal's own tables into
`SchemaNotInitialized`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from journal.dsn import display_dsn
from journal.errors import ConnectionFailed, InvalidArgument, SchemaNotInitialized
from journal.settings import JournalSettings
from journal.tables import Tables

MASK = "***"

# Where a password may sit in a DSN that cannot be parsed: `user:secret@` in a
# URL-like string, or `password=secret` / `password='se cret'` in key=value form.
_URL_SECRET = re.compile(r"(?<=:)([^:@/\s]+)(?=@)")
_KV_SECRET = re.compile(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


def _secrets(dsn: str) -> list[str]:
    """Every substring of `dsn` that may be a password (longest first)."""
    found = {m.group(1) for m in _URL_SECRET.finditer(dsn)}
    found |= {m.group(1) for m in _KV_SECRET.finditer(dsn)}
    with contextlib.suppress(psycopg.Error):
        password = conninfo_to_dict(dsn).get("password")
        if password:
            found.add(str(password))
    return sorted((s for s in found if s), key=len, reverse=True)


def mask_secrets(text: str, dsn: str) -> str:
    """`text` with every password-like part of `dsn` replaced by `***`."""
    for secret in _secrets(dsn):
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
    try:
        return conninfo_to_dict(dsn)
    except psycopg.Error as e:
        raise InvalidArgument(
            f"invalid DSN {mask_secrets(dsn, dsn)!r}: {mask_secrets(one_line(e), dsn)}"
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


async def connect(
    dsn: str, *, connect_timeout: int, autocommit: bool = True
) -> AsyncConnection[Any]:
    """One connection, or `ConnectionFailed` / `InvalidArgument` within `connect_timeout` s."""
    with connect_errors(dsn):
        return await psycopg.AsyncConnection.connect(
            dsn, autocommit=autocommit, connect_timeout=connect_timeout
        )


def connect_sync(dsn: str, *, connect_timeout: int, autocommit: bool = True) -> Connection[Any]:
    """`connect` for the synchronous driver."""
    with connect_errors(dsn):
        return psycopg.Connection.connect(
            dsn, autocommit=autocommit, connect_timeout=connect_timeout
        )


def open_sync(dsn: str, settings: JournalSettings) -> Connection[Any]:
    """One autocommit connection within the settings' `connect_timeout` (close it with
    `with`): for drivers without a pool, such as Spark executors."""
    return connect_sync(dsn, connect_timeout=settings.connect_timeout_seconds)


def _missing_table(tables: Tables, error: psycopg.errors.UndefinedTable) -> str | None:
    """Which of the journal's tables the error is about, if any (a handler's own is not)."""
    message = error.diag.message_primary or str(error)
    s = tables.settings
    for table in (
        s.journal_table,
        s.snapshot_table,
        s.offset_table,
        s.management_table,
        s.dead_letter_table,
        s.fleet_table,
        s.fleet_worker_table,
        s.lease_table,
    ):
        # Not a prefix of a longer name: a handler's own "public.snapshot_x" is not ours.
        if re.search(rf"(?<![\w$]){re.escape(f'{s.schema}.{table}')}(?![\w$])", message):
            return table
    return None


@contextlib.contextmanager
def schema_errors(tables: Tables, where: str | None = None) -> Iterator[None]:
    """Turn "relation does not exist" on one of the journal's tables into `SchemaNotInitialized`."""
    try:
        yield
    except psycopg.errors.UndefinedTable as e:
        table = _missing_table(tables, e)
        if table is None:
            raise
        raise SchemaNotInitialized(tables.settings.schema, table, where) from e


_TABLE_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"


def _schema_missing(
    conn: AsyncConnection[Any] | Connection[Any], tables: Tables
) -> SchemaNotInitialized:
    return SchemaNotInitialized(
        tables.settings.schema, tables.settings.journal_table, describe(conn)
    )


async def ensure_schema(conn: AsyncConnection[Any], tables: Tables) -> None:
    """`SchemaNotInitialized` unless the journal table exists (one catalog lookup)."""
    cur = await conn.execute(_TABLE_EXISTS, (tables.journal.as_string(conn),))
    row = await cur.fetchone()
    if not (row and row[0]):
        raise _schema_missing(conn, tables)


def ensure_schema_sync(conn: Connection[Any], tables: Tables) -> None:
    """`ensure_schema` for the synchronous driver."""
    row = conn.execute(_TABLE_EXISTS, (tables.journal.as_string(conn),)).fetchone()
    if not (row and row[0]):
        raise _schema_missing(conn, tables)


def _pool_kwargs(
    settings: JournalSettings, name: str, application_name: str | None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "connect_timeout": settings.connect_timeout_seconds,
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


def _pool_timed_out(dsn: str, name: str, min_size: int, timeout: int, e: Exception) -> Exception:
    return connection_failed(
        dsn,
        f"pool {name!r} could not open its {min_size} connection(s) "
        f"within {timeout} s ({e}); is max_connections reached?",
    )


class JournalPool(AsyncConnectionPool[AsyncConnection[Any]]):
    """A connection pool whose connections time out on connect and whose errors are typed."""

    def __init__(
        self, dsn: str, settings: JournalSettings, name: str, *, application_name: str | None = None
    ) -> None:
        """`application_name` names the server sessions (the read pools' mark them as readers)."""
        super().__init__(dsn, **_pool_kwargs(settings, name, application_name))
        self._dsn = dsn
        self._tables = Tables(settings)
        self._where = where_of(parse_dsn(dsn))
        self._open_timeout = settings.connect_timeout_seconds

    async def open_checked(self) -> None:
        """Open and wait for `min_size` connections, within the connect timeout."""
        try:
            await self.open(wait=True, timeout=self._open_timeout)
        except PoolTimeout as e:
            raise _pool_timed_out(
                self._dsn, self.name, self.min_size, self._open_timeout, e
            ) from None

    @contextlib.asynccontextmanager
    async def connection(
        self,
        timeout: float | None = None,  # noqa: ASYNC109  # the base class's signature
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection; an error on a missing journal table is `SchemaNotInitialized`.

        `getconn`/`putconn` rather than the base class's `connection()`: one
        context manager instead of three nested ones on every append and query.
        Our connections autocommit, and `putconn` rolls back whatever a failed
        block left open, which is all the base class's wrapper adds for them.
        """
        conn = await self.getconn(timeout)
        try:
            with schema_errors(self._tables, self._where):
                yield conn
        finally:
            await self.putconn(conn)


class SyncJournalPool(ConnectionPool[Connection[Any]]):
    """`JournalPool` for the synchronous driver."""

    def __init__(
        self, dsn: str, settings: JournalSettings, name: str, *, application_name: str | None = None
    ) -> None:
        """`application_name` names the server sessions (the read pools' mark them as readers)."""
        super().__init__(dsn, **_pool_kwargs(settings, name, application_name))
        self._dsn = dsn
        self._tables = Tables(settings)
        self._where = where_of(parse_dsn(dsn))
        self._open_timeout = settings.connect_timeout_seconds

    def open_checked(self) -> None:
        """Open and wait for `min_size` connections, within the connect timeout."""
        try:
            self.open(wait=True, timeout=self._open_timeout)
        except PoolTimeout as e:
            raise _pool_timed_out(
                self._dsn, self.name, self.min_size, self._open_timeout, e
            ) from None

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[Connection[Any]]:
        """A pooled connection; an error on a missing journal table is `SchemaNotInitialized`.

        `getconn`/`putconn` for the same reason as `JournalPool.connection`.
        """
        conn = self.getconn(timeout)
        try:
            with schema_errors(self._tables, self._where):
                yield conn
        finally:
            self.putconn(conn)

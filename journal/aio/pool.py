"""Connections, pools and schema checks of the async driver, with typed errors.

Every connection the journal opens comes from `connect` or a `JournalPool`, so
an unreachable server, a bad password or a malformed DSN surfaces as a
one-line `ConnectionFailed` / `InvalidArgument` (journal/connection.py builds
them), and a missing journal table as `SchemaNotInitialized`.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from journal.connection import (
    connect_errors,
    connect_timeout_of,
    parse_dsn,
    pool_kwargs,
    pool_timed_out,
    schema_error,
    where_of,
)
from journal.settings import JournalSettings
from journal.tables import Tables


async def connect(
    dsn: str,
    *,
    connect_timeout: int,
    autocommit: bool = True,
    application_name: str | None = None,
) -> AsyncConnection[Any]:
    """One connection, or `ConnectionFailed` / `InvalidArgument` within `connect_timeout` s."""
    extra: dict[str, Any] = (
        {} if application_name is None else {"application_name": application_name}
    )
    with connect_errors(dsn):
        extra.update(connect_timeout_of(dsn, connect_timeout))  # the DSN's own wins
        return await AsyncConnection.connect(dsn, autocommit=autocommit, **extra)


async def open_connection(
    dsn: str, settings: JournalSettings, *, application_name: str | None = None
) -> AsyncConnection[Any]:
    """One autocommit connection within the settings' `connect_timeout` (close it with
    `with`): for code without a pool, such as Spark executors. A connection that only
    reads the journal names itself `READER_APPLICATION`, so that live queries' horizon
    readings do not wait for its transactions."""
    return await connect(
        dsn, connect_timeout=settings.connect_timeout_seconds, application_name=application_name
    )


class JournalPool(AsyncConnectionPool[AsyncConnection[Any]]):
    """A connection pool whose connections time out on connect and whose errors are typed."""

    def __init__(
        self,
        dsn: str,
        settings: JournalSettings,
        name: str,
        *,
        application_name: str | None = None,
        reader: bool = False,
    ) -> None:
        """`application_name` names the server sessions (the read pools' mark them as readers);
        `reader` configures them for the journal's reads (`_configure_reader`)."""
        super().__init__(
            dsn,
            configure=_configure_reader if reader else None,
            **pool_kwargs(settings, name, application_name, dsn),
        )
        self._dsn = dsn
        self.tables = Tables(settings)
        self.where = where_of(parse_dsn(dsn))
        self._open_timeout = settings.connect_timeout_seconds

    async def open_checked(self) -> None:
        """Open and wait for `min_size` connections, within the connect timeout."""
        try:
            await self.open(wait=True, timeout=self._open_timeout)
        except PoolTimeout as e:
            raise pool_timed_out(
                self._dsn, self.name, self.min_size, self._open_timeout, e
            ) from None

    def connection(  # type: ignore[override]  # a context manager, as the base's
        self,
        timeout: float | None = None,  # the base class's signature
    ) -> _PooledConnection:
        """A pooled connection; an error on a missing journal table is `SchemaNotInitialized`.

        `getconn`/`putconn` in a small context manager class rather than the base
        class's `connection()` (three nested generator-based ones): this runs on
        every append and query, and each generator-based layer costs a few
        microseconds of CPU. Our connections autocommit, and `putconn` rolls back
        whatever a failed block left open, which is all the base class's wrapper
        adds for them.
        """
        return _PooledConnection(self, timeout)


async def _configure_reader(conn: AsyncConnection[Any]) -> None:
    """Set a new read connection's session time zone to UTC, and run its statements
    without parallel workers.

    For the read pool, whose sessions run only the journal's own queries:
    psycopg converts every `timestamptz` it reads into the session's time zone,
    and for a named zone (a server's default is often 'Etc/UTC') that
    conversion costs about 0.3 us a value, two per row of a slice query, while
    UTC costs nothing. The values are the same instants either way; they only
    arrive as UTC datetimes. The journal's statements compare and subtract
    timestamps only, which no time zone changes; a user's `EventFilter.where`,
    which runs here too, is evaluated in UTC (its docstring says so).

    Parallel workers: a catch-up chunk (about 8,000 rows) planned in parallel is
    a Gather Merge of two workers' sorts, which costs the server more CPU in all
    (worker start-up, rows passed through shared memory) to have the first row
    sooner; a stream that is not live already hides that wait (it starts the next
    chunk while it decodes this one), and the server's CPU is what every client of
    the database shares. On 2 cores, 200k events: 3.7 against 3.3 µs an event.
    """
    await conn.execute("SET TimeZone TO 'UTC'; SET max_parallel_workers_per_gather = 0")


class _PooledConnection:
    """`JournalPool.connection()`: one connection, taken on entry and returned on exit."""

    __slots__ = ("_conn", "_pool", "_timeout")

    def __init__(self, pool: JournalPool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._conn: AsyncConnection[Any] | None = None

    async def __aenter__(self) -> AsyncConnection[Any]:
        self._conn = await self._pool.getconn(self._timeout)
        return self._conn

    async def __aexit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._pool.putconn(conn)
        error = schema_error(self._pool.tables, e, self._pool.where)
        if error is not None:
            raise error from e

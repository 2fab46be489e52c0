"""The test database: schema names, dropping a schema, fast query settings, reading
rows directly on a fresh autocommit connection, and DSNs that carry a password.

Tests check what the library stored by asking PostgreSQL themselves, never
through the journal's own pools or read API.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg import conninfo, sql

from journal import QuerySettings

Row = tuple[Any, ...]


def fresh_schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def with_password(dsn: str) -> tuple[str, str, str]:
    """(the password, a URI DSN and a key=value DSN with it): the DSN's own password, or
    an invented one (a server that trusts the socket ignores it)."""
    params = conninfo.conninfo_to_dict(dsn)
    password = str(params.get("password") or f"pw-{uuid.uuid4().hex}")
    params["password"] = password
    key_value = conninfo.make_conninfo("", **params)
    user, db = quote(str(params.get("user", ""))), quote(str(params.get("dbname", "")))
    rest = urlencode(
        {k: v for k, v in params.items() if k not in ("user", "password", "dbname")}, safe="/"
    )
    return password, f"postgresql://{user}:{quote(password)}@/{db}?{rest}", key_value


def drop_test_schema(dsn: str, name: str) -> None:
    """Drop a test's schema even if something the test left open still holds a lock in it.

    A stream or transaction a test forgot to close would make `DROP SCHEMA`
    wait forever; its backends are terminated first, and the drop itself
    gives up after a few seconds rather than hang the suite.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '5s'")
        for _ in range(3):
            conn.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l "
                "JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND l.pid <> pg_backend_pid()",
                (name,),
            )
            try:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )
                return
            except psycopg.errors.LockNotAvailable:
                continue
        raise RuntimeError(f"could not drop test schema {name}: still locked")


def fast_query_settings(**overrides: object) -> QuerySettings:
    """Query settings scaled down so live tests finish in seconds."""
    values: dict[str, object] = {
        "refresh_interval": 0.5,
        "behind_current_time": 0.05,
        "heartbeat_interval": 0.5,
    }
    values.update(overrides)
    return QuerySettings(**values)  # type: ignore[arg-type]


async def fetch(
    pg_dsn: str, query: str | sql.SQL | sql.Composed, params: Sequence[Any] = ()
) -> list[Row]:
    """Run one query on a fresh autocommit connection and return all rows."""
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()

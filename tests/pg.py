"""Reading the database directly in tests, on a fresh autocommit connection.

Tests check what the library stored by asking PostgreSQL themselves, never
through the journal's own pools or read API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

Row = tuple[Any, ...]


async def fetch(
    pg_dsn: str, query: str | sql.SQL | sql.Composed, params: Sequence[Any] = ()
) -> list[Row]:
    """Run one query on a fresh autocommit connection and return all rows."""
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()

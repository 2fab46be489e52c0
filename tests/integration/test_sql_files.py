"""The schema as plain SQL (`sql/slicejournal.sql`, issue 31): a DBA applies it with
`psql` and gets a database this release accepts and `migrate` finds current.

The file is generated from the packages' migrations (`tools/schema_sql.py`, checked
fresh by `./dev lint`); this applies it, as `psql -f` would, to a new database.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from journal import Journal, JournalSettings
from journal.aio.migrate import migrate

SQL_FILE = Path(__file__).resolve().parents[2] / "sql" / "slicejournal.sql"


@pytest.mark.timeout(60)
async def test_the_sql_file_creates_a_schema_this_release_accepts(pg_dsn: str) -> None:
    name = f"sj_sqlfile_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(pg_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # No parameters: the simple protocol, several statements at once, as psql runs them.
            conn.execute(SQL_FILE.read_text(encoding="utf-8").encode("utf-8"))
        async with Journal.connect(dsn) as journal:  # checks every component's version
            await journal.append("Cart|sql-file", [{"item": "apple"}], expected_seq_nr=0)
            assert await journal.highest_seq_nr("Cart|sql-file") == 1
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            assert await migrate(conn, JournalSettings()) == []
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

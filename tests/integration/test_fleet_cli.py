"""The fleet commands end to end: `slicejournal worker | scale | status | pause | set-offset |
clear-offset` run as real subprocesses against the real PostgreSQL.

Bad input changes nothing and says what was wrong in one line; a live worker shows up in
`status` and on `/metrics`, releases its leases on SIGTERM and is then reported orphaned;
a failing handler is restarted under the same lease until it succeeds, each event applied
once; `clear-offset` on a live fleet makes the running instances start over.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from journal import Journal
from tests.support import ROOT, bank
from tests.support.pg import fetch

# The console script, so that `worker MODULE:ATTR` finds `tests` through the working
# directory as a user's application would (not through `python -m`'s sys.path[0]).
CLI = [str(Path(sys.executable).parent / "slicejournal")]
TTL = 2  # seconds: every worker here runs with --lease-ttl 2
BAD_DSN = "postgresql://u:pw@127.0.0.1:1/x"

# Factories for worker subprocesses, imported from a temporary directory on PYTHONPATH.
APP_MODULE = '''
"""Fleet test factories: a handler that fails its first calls, and one that only counts."""

from psycopg import sql

from journal import BacktrackingSettings
from projections import Projection, ProjectionSettings
from tests.support import ROOT, bank
from tests.support.pg import fast_query_settings

calls = 0


def _options():
    return {
        "settings": ProjectionSettings(
            group_after_envelopes=20, group_after_duration=0.1, management_poll_interval=0.5
        ),
        "query_settings": fast_query_settings(
            buffer_size=100, backtracking=BacktrackingSettings(window=20, behind_current_time=6)
        ),
    }


def flaky(journal, slice_range):
    """The bank projection, whose handler raises on its first 3 calls in this process."""
    inner = bank.make_grouped_handler(journal)

    async def handler(conn, envs):
        global calls
        calls += 1
        if calls <= 3:
            raise RuntimeError("boom")
        await inner(conn, envs)

    return Projection.grouped(journal, name="flaky", entity_type=bank.ENTITY,
                              slice_range=slice_range, handler=handler, **_options())


def seen(journal, slice_range):
    """Inserts every event into a table without a key: applying it again adds a row."""
    insert = sql.SQL("INSERT INTO {} (pid, seq_nr) VALUES (%s, %s)").format(
        sql.Identifier(journal.settings.schema, "seen")
    )

    async def handler(conn, envs):
        for env in envs:
            await conn.execute(insert, (env.persistence_id, env.seq_nr))

    return Projection.grouped(journal, name="seen", entity_type=bank.ENTITY,
                              slice_range=slice_range, handler=handler, **_options())
'''


# -- helpers ---------------------------------------------------------------------------------


def cli(
    args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


async def acli(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, args)


def output(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single `slicejournal: error: ...` line of a failed command (no traceback)."""
    assert result.returncode == 1, output(result)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, output(result)
    assert lines[0].startswith("slicejournal: error: "), output(result)
    return lines[0]


def usage_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, output(result)
    assert "Traceback" not in result.stderr, output(result)
    return result.stderr


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def where(pg_dsn: str, schema: str) -> list[str]:
    return ["--dsn", pg_dsn, "--schema", schema]


def status_owners(stdout: str) -> dict[str, str]:
    """range -> owner column of `status` output."""
    return {
        m.group(1): m.group(2)
        for line in stdout.splitlines()
        if (m := re.match(r"^(\d+-\d+)\s+(\S+)", line))
    }


class Worker:
    """A `slicejournal worker` subprocess; output kept in files for failure messages."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


StartWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start_worker(pg_dsn: str, schema: str, tmp_path: Path) -> AsyncIterator[StartWorker]:
    """`await start_worker(factory, *extra_args)` -> Worker; every one is killed afterwards."""
    started: list[Worker] = []
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "fleet_test_app.py").write_text(textwrap.dedent(APP_MODULE))
    python_path = os.pathsep.join(p for p in (str(app_dir), os.environ.get("PYTHONPATH")) if p)

    async def start(factory: str, *extra: str) -> Worker:
        log = tmp_path / f"worker-{len(started)}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *CLI,
                "worker",
                factory,
                *where(pg_dsn, schema),
                "--lease-ttl",
                str(TTL),
                *extra,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": python_path},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        worker = Worker(proc, log)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            if worker.alive:
                worker.proc.kill()
            await worker.proc.wait()


async def write_events(j: Journal, batches: int = 20) -> int:
    writers = bank.Writers(j, accounts=40, late_fraction=0)
    writers.start(writers=4, max_batches=batches)
    await writers.wait()
    return await bank.journal_count(j)


async def wait_for(
    condition: Callable[[], object], within: float, what: str, worker: Worker | None = None
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if worker is not None and not worker.alive:
            pytest.fail(f"worker exited ({worker.proc.returncode}) while waiting for {what}:\n"
                        + worker.text())  # fmt: skip
        if loop.time() >= deadline:
            extra = "" if worker is None else "\nworker output:\n" + worker.text()
            pytest.fail(f"not within {within:.0f} s: {what}{extra}")
        await asyncio.sleep(0.2)


async def lease_rows(pg_dsn: str, schema: str, name: str) -> list[tuple[object, ...]]:
    return await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT min_slice, max_slice, owner, restarts, last_error FROM {} "
            "WHERE projection_name = %s ORDER BY min_slice"
        ).format(sql.Identifier(schema, "projection_lease")),
        (name,),
    )


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


# -- 1. bad input: one line, a non-zero exit, nothing changed --------------------------------


@pytest.mark.timeout(90)
def test_bad_input_fails_with_one_line_and_changes_nothing(pg_dsn: str, schema: str) -> None:
    init = cli(["migrate", *where(pg_dsn, schema)])
    assert init.returncode == 0, output(init)
    fleet = sql.Identifier(schema, "projection_fleet")
    management = sql.Identifier(schema, "projection_management")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (projection_name, entity_type, instances, lease_ttl_ms) "
                "VALUES ('balances', 'Bank', 4, 3000)"
            ).format(fleet)
        )

    def stored() -> tuple[list[tuple[object, ...]], int]:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            fleet_rows = conn.execute(
                sql.SQL("SELECT projection_name, instances, updated_at FROM {}").format(fleet)
            ).fetchall()
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(management)).fetchone()
        assert row is not None
        return fleet_rows, int(row[0])

    before = stored()
    assert before[1] == 0
    at = where(pg_dsn, schema)

    # An unknown projection is named, for every command.
    line = one_error_line(cli(["scale", "nosuch", "2", "--no-wait", *at]))
    assert "nosuch" in line
    line = one_error_line(cli(["status", "nosuch", *at]))
    assert "nosuch" in line
    line = one_error_line(cli(["pause", "nosuch", *at]))
    assert "nosuch" in line

    # 3 does not divide 1024: refused before anything is written.
    line = one_error_line(cli(["scale", "balances", "3", "--no-wait", *at]))
    assert "divisor" in line and "3" in line

    # Usage errors (exit 2) name what was wrong.
    for bad in ("5-2", "abc"):
        err = usage_error(cli(["pause", "balances", "--range", bad, *at]))
        assert "slice range" in err and bad in err
    err = usage_error(cli(["set-offset", "balances", "2024-01-01T00:00:00", *at]))
    assert "time zone" in err

    assert stored() == before, "a refused command changed the fleet or management tables"

    # An unreachable server: one line, exit 1, the password never shown.
    for args in (["status", "balances"], ["scale", "balances", "2", "--no-wait"]):
        result = cli([*args, "--dsn", BAD_DSN, "--schema", schema], timeout=30)
        line = one_error_line(result)
        assert "127.0.0.1" in line
        assert "pw" not in result.stdout + result.stderr, output(result)

    # A factory that cannot be imported: one clear line, before any database work.
    line = one_error_line(cli(["worker", "nosuchmodule:x", *at]))
    assert "nosuchmodule" in line and "import" in line


# -- 2. a live worker: status, metrics, SIGTERM ----------------------------------------------


@pytest.mark.timeout(90)
async def test_a_live_worker_shows_in_status_and_metrics_and_releases_on_sigterm(
    pg_dsn: str, schema: str, journal: Journal, start_worker: StartWorker
) -> None:
    await bank.create_read_model(journal)
    total = await write_events(journal)
    assert total > 0
    port = free_port()
    worker = await start_worker(
        "tests.support.fleet:balances", "--worker-id", "worker-a", "--metrics-port", str(port)
    )

    async def all_applied() -> bool:
        _, _, distinct = await bank.projected(journal)
        return distinct == total

    await wait_for(all_applied, 45, f"all {total} events applied", worker)
    balances, applied, distinct = await bank.projected(journal)
    assert applied == distinct == total
    assert balances == await bank.expected_balances(journal)

    at = where(pg_dsn, schema)
    status = await acli(["status", "balances", *at])
    assert status.returncode == 0, output(status)
    assert status_owners(status.stdout) == {
        "0-255": "worker-a",
        "256-511": "worker-a",
        "512-767": "worker-a",
        "768-1023": "worker-a",
    }, output(status)

    text = await asyncio.to_thread(scrape, port)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "slicejournal_events_handled",
        "slicejournal_lease_held",
        "slicejournal_backlog_age_seconds",
        "slicejournal_instance_restarts",
    ):
        assert name in families, text
        labels = [{k: s.labels[k] for k in ("projection", "range")} for s in families[name].samples]
        assert {"projection": "balances", "range": "0-255"} in labels, text
        assert len(labels) == 4, text
    handled = families["slicejournal_events_handled"].samples
    assert sum(s.value for s in handled) == total, text
    assert all(s.value == 1 for s in families["slicejournal_lease_held"].samples), text
    assert all(s.value == 0 for s in families["slicejournal_instance_restarts"].samples), text

    # SIGTERM: batches finished, offsets saved, leases released, exit 0.
    worker.proc.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.wait_for(worker.proc.wait(), 15)
    except TimeoutError:
        pytest.fail("the worker did not exit within 15 s of SIGTERM:\n" + worker.text())
    assert code == 0, worker.text()
    rows = await lease_rows(pg_dsn, schema, "balances")
    assert len(rows) == 4
    assert [r[2] for r in rows] == [None] * 4, rows

    early = await acli(["status", "balances", *at])
    assert early.returncode in (0, 3), output(early)
    await asyncio.sleep(2 * TTL + 1)
    late = await acli(["status", "balances", *at])
    assert late.returncode == 3, output(late)
    assert "no owner" in late.stderr, output(late)
    assert "Traceback" not in late.stderr
    assert all(o.startswith("(none") for o in status_owners(late.stdout).values()), output(late)


# -- 3. supervision: a failing handler is restarted until it succeeds ------------------------


@pytest.mark.timeout(90)
async def test_a_failing_instance_is_restarted_and_applies_every_event_once(
    pg_dsn: str, schema: str, journal: Journal, start_worker: StartWorker
) -> None:
    await bank.create_read_model(journal)
    total = await write_events(journal, batches=10)
    worker = await start_worker(
        "fleet_test_app:flaky", "--instances", "1", "--worker-id", "worker-f"
    )

    async def all_applied() -> bool:
        _, _, distinct = await bank.projected(journal)
        return distinct == total

    # Three failures: restarts after 1, 2 and 4 s of backoff.
    await wait_for(all_applied, 45, f"all {total} events applied", worker)
    balances, applied, distinct = await bank.projected(journal)
    assert applied == distinct == total == await bank.journal_count(journal)
    assert balances == await bank.expected_balances(journal)
    assert worker.alive, worker.text()

    rows = await lease_rows(pg_dsn, schema, "flaky")
    assert len(rows) == 1, rows
    lo, hi, owner, restarts, last_error = rows[0]
    assert (lo, hi, owner) == (0, 1023, "worker-f"), rows
    assert restarts == 3, rows  # one restart per failed call
    assert last_error is not None and "boom" in str(last_error), rows

    status = await acli(["status", "flaky", *where(pg_dsn, schema)])
    assert status.returncode == 0, output(status)
    assert "boom" in status.stdout, output(status)
    assert status_owners(status.stdout) == {"0-1023": "worker-f"}, output(status)
    assert worker.alive, worker.text()


# -- 4. clear-offset on a live fleet ---------------------------------------------------------


@pytest.mark.timeout(90)
async def test_clear_offset_on_a_live_fleet_replays_every_event_once_more(
    pg_dsn: str, schema: str, journal: Journal, start_worker: StartWorker
) -> None:
    seen = sql.Identifier(schema, "seen")
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("CREATE TABLE {} (pid text NOT NULL, seq_nr bigint NOT NULL)").format(seen)
        )
    total = await write_events(journal, batches=10)
    worker = await start_worker(
        "fleet_test_app:seen", "--instances", "2", "--worker-id", "worker-s"
    )

    async def counts() -> tuple[int, int, int, int]:
        """(rows, distinct events, fewest and most rows of one event)"""
        rows = await fetch(
            pg_dsn,
            sql.SQL(
                "SELECT coalesce(sum(n), 0), count(*), coalesce(min(n), 0), coalesce(max(n), 0) "
                "FROM (SELECT count(*) AS n FROM {} GROUP BY pid, seq_nr) AS per_event"
            ).format(seen),
        )
        n, events, fewest, most = (int(v) for v in rows[0])
        return n, events, fewest, most

    async def rows_reach(n: int) -> bool:
        return (await counts())[0] >= n

    await wait_for(lambda: rows_reach(total), 45, f"{total} events seen", worker)
    await asyncio.sleep(1)  # nothing more may arrive
    assert await counts() == (total, total, 1, 1)

    cleared = await acli(["clear-offset", "seen", *where(pg_dsn, schema)])
    assert cleared.returncode == 0, output(cleared)
    assert "offsets cleared" in cleared.stdout, output(cleared)

    await wait_for(lambda: rows_reach(2 * total), 30, f"{total} events seen twice", worker)
    await asyncio.sleep(1.5)  # nothing more may arrive
    assert await counts() == (2 * total, total, 2, 2)
    assert worker.alive, worker.text()

    # The fleet took its ranges back after the revocation.
    status = await acli(["status", "seen", *where(pg_dsn, schema)])
    assert status.returncode == 0, output(status)
    assert status_owners(status.stdout) == {"0-511": "worker-s", "512-1023": "worker-s"}, output(
        status
    )

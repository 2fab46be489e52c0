"""Operating a fleet from the command line, against real worker processes: JSON logs with
each lifecycle line's fields, `status --json`, `status --watch` (bounded by --count,
stopped by SIGINT), `dead-letters --json`; and the CLI's failures — a bad factory, an
unimportable target, a busy metrics port, a bad number — as one line, never a
traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from journal import Journal
from projections.fleet.lease_sql import FleetSql
from projections.tables import ProjectionTables
from tests.support import ROOT
from tests.support.projections import eventually, journal_settings

CLI = [str(Path(sys.executable).parent / "slicejournal")]
ENTITY = "Parcel"
NAME = "parcels"

APP = '''
"""Operating test factories: `parcels` dead-letters an event {"poison": true} after one
retry and counts nothing; the others are broken on purpose."""

from datetime import timedelta

from projections import Projection, ProjectionSettings, RecoveryStrategy
from tests.support.pg import fast_query_settings

SETTINGS = ProjectionSettings(
    management_poll_interval=timedelta(milliseconds=300),
    group_after_duration=timedelta(milliseconds=50),
)


async def handle(conn, env):
    if env.event.get("poison"):
        raise ValueError("poisoned parcel")


def parcels(journal, slice_range):
    return Projection.exactly_once(
        journal, name="parcels", entity_type="Parcel", slice_range=slice_range,
        handler=handle, settings=SETTINGS, query_settings=fast_query_settings(),
        recovery=RecoveryStrategy.retry_and_skip(1, 0.05),
    )


def one_argument(journal):
    return parcels(journal, None)


def raises(journal, slice_range):
    raise RuntimeError("the factory is broken")
'''

BROKEN_MODULE = "RATIO = 1 / 0  # fails when imported\n"


@pytest.fixture
def app_env(tmp_path: Path) -> dict[str, str]:
    """The environment whose PYTHONPATH holds `ops_app` (the factories) and `ops_broken`."""
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "ops_app.py").write_text(textwrap.dedent(APP))
    (app_dir / "ops_broken.py").write_text(BROKEN_MODULE)
    path = os.pathsep.join(p for p in (str(app_dir), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def cli(
    args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env=env or dict(os.environ), check=False,
    )  # fmt: skip


def popen(args: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
    """`slicejournal ARGS` started in the background (output piped unless redirected)."""
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **options}
    return subprocess.Popen([*CLI, *args], cwd=ROOT, **options)


def output(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def one_line(result: subprocess.CompletedProcess[str], status: int) -> str:
    """The only line on stderr (usage lines aside, for exit 2); no traceback."""
    assert result.returncode == status, output(result)
    assert "Traceback" not in result.stderr, output(result)
    lines = [x for x in result.stderr.strip().splitlines() if x.strip()]
    if status == 2:  # argparse: the usage, then one error line
        lines = [x for x in lines if "error:" in x]
    assert len(lines) == 1, output(result)
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def worker_logs(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes started by the test; each is killed (if still running) after it."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every stderr line of a worker parsed as JSON (one that is not fails the test)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}\nall:\n{path.read_text()}")
    return records


@pytest.mark.timeout(120)
async def test_json_logs_status_json_watch_and_dead_letters_json(
    pg_dsn: str,
    schema: str,
    app_env: dict[str, str],
    tmp_path: Path,
    worker_logs: list[subprocess.Popen[bytes]],
) -> None:
    where = ["--dsn", pg_dsn, "--schema", schema]
    assert cli(["migrate", *where]).returncode == 0
    stderr = tmp_path / "worker.stderr"
    with stderr.open("wb") as err:
        # --log-format before the subcommand, --log-level after it: both take effect.
        worker = popen(
            ["--log-format", "json", "worker", "ops_app:parcels", *where, "--worker-id", "w1",
             "--lease-ttl", "2", "--instances", "2", "--log-level", "info"],
            env=app_env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    worker_logs.append(worker)

    async with Journal.connect(pg_dsn, journal_settings(schema)) as journal:

        def converged() -> bool:
            result = cli(["status", NAME, *where, "--json"])
            if result.returncode != 0:
                return False
            doc = json.loads(result.stdout)
            # Before the worker has registered its fleet, `status` shows the projection as
            # the tables know it so far (no fleet: the in-process document, no "converged").
            return bool(doc.get("converged")) and len(doc["ranges"]) == 2

        await eventually(lambda: asyncio.to_thread(converged), "two ranges running", 60)
        for i in range(20):
            events = [{"n": 1}, {"poison": True}] if i == 7 else [{"n": 1}, {"n": 2}]
            await journal.append(f"{ENTITY}|{i}", events, expected_seq_nr=0)

        def dead_letters() -> list[dict[str, Any]]:
            result = cli(["dead-letters", NAME, *where, "--json"])
            assert result.returncode == 0, output(result)
            letters: list[dict[str, Any]] = json.loads(result.stdout)
            return letters

        await eventually(lambda: asyncio.to_thread(dead_letters), "a dead letter", 60)
        [letter] = dead_letters()
        assert (letter["persistence_id"], letter["seq_nr"]) == (f"{ENTITY}|7", 2)
        assert "poisoned parcel" in letter["error"]

        def caught_up() -> dict[str, Any] | None:
            doc: dict[str, Any] = json.loads(cli(["status", NAME, *where, "--json"]).stdout)
            return doc if all(r["backlog_events"] == 0 for r in doc["ranges"]) else None

        await eventually(lambda: asyncio.to_thread(caught_up), "backlog 0", 60)
        doc = caught_up()
        assert doc is not None
        assert (doc["projection"], doc["entity_type"], doc["instances"]) == (NAME, ENTITY, 2)
        assert doc["workers"] == ["w1"] and doc["orphaned"] == []
        assert [r["range"] for r in doc["ranges"]] == ["0-511", "512-1023"]
        for r in doc["ranges"]:
            assert r["owner"] == "w1" and r["running"] is True and r["paused"] is False
            assert isinstance(r["epoch"], int) and r["backlog_age_seconds"] == 0.0

        # --watch, bounded: one JSON line per refresh, events/s from the second on; 40
        # events appended between the refreshes are all handled.
        watch = popen(
            ["status", NAME, *where, "--watch", "--json", "--interval", "3", "--count", "2"],
            text=True,
        )
        assert watch.stdout is not None
        first = await asyncio.to_thread(watch.stdout.readline)
        for i in range(20, 40):
            await journal.append(f"{ENTITY}|{i}", [{"n": 1}, {"n": 2}], expected_seq_nr=0)
        rest, errors = await asyncio.to_thread(watch.communicate, timeout=60)
        assert watch.returncode == 0, errors
        refreshes = [json.loads(x) for x in [first, *rest.splitlines()]]
        assert len(refreshes) == 2, rest
        assert all(r["events_per_second"] is None for r in refreshes[0]["ranges"])
        rates = [r["events_per_second"] for r in refreshes[1]["ranges"]]
        assert all(isinstance(x, float) for x in rates), refreshes[1]
        if all(r["backlog_events"] == 0 for r in refreshes[1]["ranges"]):
            assert sum(rates) > 0, refreshes[1]

        text = cli(["status", NAME, *where, "--watch", "--interval", "0.2", "--count", "2"])
        assert text.returncode == 0, output(text)
        assert text.stdout.count("events/s") == 2, text.stdout

    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 60) == 0
    records = json_lines(stderr)

    def having(event: str) -> list[dict[str, Any]]:
        return [r for r in records if r.get("event") == event]

    for event in ("worker_started", "worker_stopped"):
        [line] = having(event)
        assert (line["projection"], line["worker"]) == (NAME, "w1"), line
    for event in ("lease_claimed", "lease_released"):
        lines = having(event)
        assert sorted(r["range"] for r in lines) == ["0-511", "512-1023"], lines
        assert all(r["worker"] == "w1" and isinstance(r["epoch"], int) for r in lines), lines
    started = having("started")
    assert sorted(r["range"] for r in started) == ["0-511", "512-1023"], started
    assert all(r["projection"] == NAME and r["level"] == "info" for r in started)
    [retry] = having("retry")
    [dead] = having("dead_letter")
    for line in (retry, dead):
        assert line["projection"] == NAME and line["range"] in ("0-511", "512-1023"), line
        assert "poisoned parcel" in line["error"], line
    assert dead["level"] == "error" and dead["events"] == 1
    assert len(having("stopped")) == 2


@pytest.mark.timeout(60)
async def test_status_watch_stops_cleanly_on_sigint(
    pg_dsn: str, schema: str, app_env: dict[str, str]
) -> None:
    where = ["--dsn", pg_dsn, "--schema", schema]
    settings = journal_settings(schema)
    async with Journal.connect(pg_dsn, settings, create_schema=True) as journal:
        register = FleetSql(
            ProjectionTables(journal.tables)
        ).register  # a fleet row, as a worker's would be
        async with journal.pool.connection() as conn:
            await conn.execute(register, (NAME, ENTITY, 4, 2000))
    # SIGINT as a terminal delivers it, even where this suite was started in the
    # background by a shell without job control, which starts it ignored (and a
    # child inherits an ignored signal).
    watch = popen(
        ["status", NAME, *where, "--watch", "--interval", "0.2"],
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert watch.stdout is not None
        lines = [await asyncio.to_thread(watch.stdout.readline) for _ in range(3)]
        assert lines[0].startswith(f"projection {NAME}"), lines
        await asyncio.sleep(0.5)  # a few refreshes
        watch.send_signal(signal.SIGINT)
        _, err = await asyncio.to_thread(watch.communicate, timeout=20)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


# -- the CLI's failures: one line ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_bad_target_or_busy_port_is_one_line_and_exit_1(
    pg_dsn: str, schema: str, app_env: dict[str, str]
) -> None:
    where = ["--dsn", pg_dsn, "--schema", schema]
    assert cli(["migrate", *where]).returncode == 0

    def worker(target: str, *more: str) -> str:
        result = cli(["worker", target, *where, "--lease-ttl", "2", *more], app_env, 60)
        line = one_line(result, 1)
        assert line.startswith("slicejournal: error: "), output(result)
        return line

    assert "must take (journal, slice_range)" in worker("ops_app:one_argument")
    assert "(journal)" in worker("ops_app:one_argument")
    line = worker("ops_app:raises")
    assert "RuntimeError: the factory is broken" in line
    assert "cannot import 'no_such_module_at_all'" in worker("no_such_module_at_all:f")
    line = worker("ops_broken:f")
    assert "cannot import 'ops_broken': ZeroDivisionError" in line
    assert "has no attribute 'nothing'" in worker("ops_app:nothing")

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = worker("ops_app:parcels", "--metrics-port", str(port))
    assert f"cannot serve metrics on 127.0.0.1:{port}" in line, line
    assert "in use" in line, line


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["worker", "ops_app:parcels", "--lease-ttl", "-1"],
         "argument --lease-ttl: must be positive, got -1"),
        (["worker", "ops_app:parcels", "--lease-ttl", "nan"],
         "argument --lease-ttl: must be positive, got nan"),
        (["worker", "ops_app:parcels", "--instances", "0"],
         "argument --instances: must be between 1 and 1024, got 0"),
        (["worker", "ops_app:parcels", "--metrics-port", "70000"],
         "argument --metrics-port: must be between 0 and 65535, got 70000"),
        (["scale", "parcels", "8", "--timeout", "0"],
         "argument --timeout: must be positive, got 0"),
        (["scale", "parcels", "-2"], "argument instances: must be between 1 and 1024, got -2"),
        (["status", "parcels", "--watch", "--interval", "-3"],
         "argument --interval: must be positive, got -3"),
        (["status", "parcels", "--watch", "--count", "0"],
         "argument --count: must be between 1 and 1000000, got 0"),
    ],
)  # fmt: skip
def test_a_bad_number_is_one_usage_line(
    pg_dsn: str, schema: str, app_env: dict[str, str], args: list[str], message: str
) -> None:
    result = cli([*args, "--dsn", pg_dsn, "--schema", schema], app_env, 30)
    line = one_line(result, 2)
    assert line.endswith(message), output(result)
    assert "timedelta" not in result.stderr

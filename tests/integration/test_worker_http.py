"""A real `slicejournal worker` process serves /metrics, /healthz and /readyz over HTTP:
the backlog age of a caught-up, quiet projection stays 0 there (as in `status`), a handler
that blocks makes its range's age grow within seconds, `promtool check metrics` accepts
the exposition, and an in-process projection with the Prometheus exporter exposes the
same per-range series as the worker.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from journal import Journal, SliceRange, slice_for, slice_ranges
from journal.model import EventEnvelope
from journal.telemetry import use_telemetry
from projections import Projection, ProjectionManagement, ProjectionSettings
from projections.fleet.metrics import serve_http
from projections.telemetry_prometheus import PrometheusTelemetry
from tests.support import ROOT
from tests.support.projections import eventually

CLI = [str(Path(sys.executable).parent / "slicejournal")]
ENTITY = "Meter"
NAME = "meters"

APP = '''
"""A worker's factory: counts events; blocks (for good) on an event {"block": true}."""

import asyncio
from datetime import timedelta

from projections import Projection, ProjectionSettings
from tests.support.pg import fast_query_settings

SETTINGS = ProjectionSettings(
    management_poll_interval=timedelta(milliseconds=200),
    progress_interval=timedelta(milliseconds=300),
    group_after_duration=timedelta(milliseconds=50),
    backlog_sample_interval=timedelta(milliseconds=200),
)


async def handle(conn, env):
    if env.event.get("block"):
        await asyncio.Event().wait()


def meters(journal, slice_range):
    return Projection.exactly_once(
        journal, name="meters", entity_type="Meter", slice_range=slice_range,
        handler=handle, settings=SETTINGS, query_settings=fast_query_settings(),
    )
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def aget(url: str) -> tuple[int, str]:
    return await asyncio.to_thread(get, url)


def samples(text: str, family: str) -> dict[str, float]:
    """range -> value of one family's samples."""
    out = {}
    for f in text_string_to_metric_families(text):
        if f.name == family:
            for s in f.samples:
                if s.name in (family, f"{family}_total"):
                    out[s.labels["range"]] = s.value
    return out


def range_families(text: str) -> set[str]:
    return {
        f.name.removesuffix("_created")
        for f in text_string_to_metric_families(text)
        if any("range" in s.labels for s in f.samples)
    }


async def write(j: Journal, count: int, event: dict[str, Any] | None = None) -> int:
    for i in range(count):
        pid = f"{ENTITY}|m-{i}"
        seq = await j.highest_seq_nr(pid)
        await j.append(pid, [event or {"n": seq}], expected_seq_nr=seq)
    return count


class WorkerProcess:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path, port: int) -> None:
        self.proc, self.log, self.port = proc, log, port

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
async def worker(pg_dsn: str, schema: str, tmp_path: Path) -> AsyncIterator[WorkerProcess]:
    app = tmp_path / "app"
    app.mkdir()
    (app / "meters_app.py").write_text(textwrap.dedent(APP))
    path = os.pathsep.join(p for p in (str(app), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    port = free_port()
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *CLI, "worker", "meters_app:meters", "--dsn", pg_dsn, "--schema", schema,
            "--lease-ttl", "2", "--worker-id", "w-http", "--metrics-port", str(port),
            cwd=ROOT, env={**os.environ, "PYTHONPATH": path},
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    w = WorkerProcess(proc, log, port)
    try:
        yield w
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@pytest.mark.timeout(120)
async def test_a_worker_serves_health_and_truthful_metrics(
    journal: Journal, worker: WorkerProcess, tmp_path: Path
) -> None:
    j = journal
    total = await write(j, 40)

    async def ready() -> bool:
        assert worker.proc.returncode is None, worker.text()
        try:
            code, _ = await aget(worker.url("/readyz"))
        except OSError:
            return False
        return code == 200

    await eventually(ready, "the worker ready: connected, its 4 ranges running", 60)
    assert await aget(worker.url("/healthz")) == (200, "ok\n")
    assert (await aget(worker.url("/nothing")))[0] == 404

    async def caught_up() -> bool:
        _, text = await aget(worker.url("/metrics"))
        ages = samples(text, "slicejournal_backlog_age_seconds")
        handled = samples(text, "slicejournal_events_handled")
        return len(ages) == 4 and sum(handled.values()) == total and set(ages.values()) == {0}

    await eventually(caught_up, "all handled, backlog 0 on /metrics", 45)
    # Quiet and caught up: the age stays 0, in /metrics and in status, however long.
    mgmt = ProjectionManagement(j)
    for _ in range(6):
        await asyncio.sleep(0.5)
        _, text = await aget(worker.url("/metrics"))
        assert set(samples(text, "slicejournal_backlog_age_seconds").values()) == {0}, text
        assert set(samples(text, "slicejournal_backlog_events").values()) == {0}, text
        for status in await mgmt.status(NAME, ENTITY, ranges=4):
            assert status.backlog is not None and status.backlog.age_seconds == 0

    promtool = shutil.which("promtool")
    if promtool is not None:
        exposition = tmp_path / "metrics.txt"
        exposition.write_text(text)
        with exposition.open("rb") as source:
            check = await asyncio.to_thread(
                subprocess.run,
                [promtool, "check", "metrics"],
                stdin=source,
                capture_output=True,
                timeout=30,
            )
        assert check.returncode == 0, (check.stdout, check.stderr, text)

    # One event blocks its handler: that range's age grows, within seconds; the rest stay 0.
    pid = f"{ENTITY}|m-0"
    await j.append(pid, [{"block": True}], expected_seq_nr=await j.highest_seq_nr(pid))
    blocked_range = next(str(r) for r in slice_ranges(4) if slice_for(pid) in r)

    async def growing() -> bool:
        _, text = await aget(worker.url("/metrics"))
        return samples(text, "slicejournal_backlog_age_seconds").get(blocked_range, 0) >= 2

    await eventually(growing, "the blocked range's backlog age passing 2 s", 15)
    _, text = await aget(worker.url("/metrics"))
    ages = samples(text, "slicejournal_backlog_age_seconds")
    assert {r: a for r, a in ages.items() if r != blocked_range} == dict.fromkeys(
        set(ages) - {blocked_range}, 0.0
    ), ages
    assert samples(text, "slicejournal_backlog_events")[blocked_range] == 1
    [status] = await mgmt.status(NAME, ENTITY, ranges=[SliceRange.parse(blocked_range)])
    assert status.backlog is not None and status.backlog.age_seconds >= 2


async def _count(conn: Any, env: EventEnvelope) -> None:
    return None


@pytest.mark.timeout(120)
async def test_an_in_process_projection_exports_the_workers_series(
    journal: Journal, worker: WorkerProcess
) -> None:
    j = journal
    total = await write(j, 20)

    async def worker_caught_up() -> bool:
        try:
            _, text = await aget(worker.url("/metrics"))
        except OSError:
            return False
        return sum(samples(text, "slicejournal_events_handled").values()) == total

    await eventually(worker_caught_up, "the worker handled everything", 60)
    _, worker_text = await aget(worker.url("/metrics"))

    registry = CollectorRegistry()
    telemetry = PrometheusTelemetry(registry)
    telemetry.watch_pools(j.pool, j.read_pool)
    server = serve_http(0, registry=registry)
    use_telemetry(telemetry)
    try:
        p = Projection.exactly_once(
            j, name="copy", entity_type=ENTITY, slice_range=SliceRange(0, 1023), handler=_count,
            settings=ProjectionSettings(backlog_sample_interval=0.2, progress_interval=0.3),
        )  # fmt: skip
        task = asyncio.create_task(p.run())
        await j.append(f"{ENTITY}|other", [{"n": 0}], expected_seq_nr=0)
        total += 1
        url = f"http://127.0.0.1:{server.port}/metrics"

        async def caught_up() -> bool:
            _, text = await aget(url)
            handled = samples(text, "slicejournal_events_handled")
            ages = samples(text, "slicejournal_backlog_age_seconds")
            return handled.get("0-1023") == total and ages.get("0-1023") == 0

        await eventually(caught_up, "the in-process projection caught up on its /metrics")
        _, text = await aget(url)
        await p.stop()
        await asyncio.wait_for(task, 10)
    finally:
        use_telemetry(None)
        server.close()
    fleet_only = {
        "slicejournal_lease_held",
        "slicejournal_leases_claimed",
        "slicejournal_leases_lost",
        "slicejournal_instance_restarts",
    }
    assert range_families(text) == range_families(worker_text) - fleet_only
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"slicejournal_appends", "slicejournal_pool_connections"} <= names

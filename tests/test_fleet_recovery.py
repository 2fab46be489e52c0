"""Fleet workers survive the database: killed backends mid-batch, and a server restart.

Workers reconnect with backoff, keep or re-claim their ranges, and the read
model ends with every event applied exactly once (its `applied` table has no
key, so a second application would be a second row).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from journal import Journal, JournalSettings
from projections.fleet.control import FleetControl
from slicejournal.embedded import EmbeddedPostgres
from slicejournal.fleet_cli import worker_argv
from tests import bank, fleet_app
from tests.conftest import fast_query_settings

ROOT = Path(__file__).resolve().parent.parent
TTL = 2.0


def start_worker(dsn: str, schema: str, worker_id: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        worker_argv(
            "tests.fleet_app:balances",
            dsn=dsn,
            schema=schema,
            worker_id=worker_id,
            lease_ttl=TTL,
            log_level="info",
        ),
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def stop(procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=20))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            codes.append(None)
    return codes


async def exactly_once(journal: Journal) -> None:
    await bank.wait_until_projected(journal, within=90)
    balances, applied, distinct = await bank.projected(journal)
    total = await bank.journal_count(journal)
    assert (applied, distinct) == (total, total), "an event was applied twice or not at all"
    assert balances == await bank.expected_balances(journal)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_workers_survive_backends_killed_mid_batch(
    journal: Journal, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    await bank.create_read_model(journal, with_primary_key=False)
    procs = [start_worker(pg_dsn, schema, f"w{i}", tmp_path / f"w{i}.log") for i in (1, 2)]
    try:
        writers = bank.Writers(journal, 200, late_fraction=0.05, seed=3)
        writers.start(writers=4)
        killed = 0
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
            for _ in range(6):
                await asyncio.sleep(1.5)
                cur = await admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'slicejournal worker %%'"
                )
                killed += (await cur.fetchone() or (0,))[0]
        await writers.stop()
        assert killed > 0, "no worker connection was found to kill"
        await exactly_once(journal)
        status = await FleetControl(journal).wait_converged(fleet_app.NAME, timeout=60)
        assert {r.owner for r in status.ranges} <= {"w1", "w2"}
        assert all(p.poll() is None for p in procs), "a worker process died"
    finally:
        codes = stop(procs)
    assert codes == [0, 0], [(tmp_path / f"w{i}.log").read_text()[-2000:] for i in (1, 2)]


@pytest.fixture
def own_server() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A PostgreSQL of this test's own, so restarting it disturbs nobody else."""
    data_dir = tempfile.mkdtemp(prefix="slicejournal-restart-")
    server = EmbeddedPostgres(os.path.join(data_dir, "pgdata"))
    try:
        yield server, server.start()
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_workers_survive_a_database_restart_mid_catch_up(
    own_server: tuple[EmbeddedPostgres, str], tmp_path: Path
) -> None:
    server, dsn = own_server
    settings = JournalSettings(schema="fleet", pool_max_size=20, query=fast_query_settings())
    async with Journal.connect(dsn, settings, create_schema=True) as journal:
        await bank.create_read_model(journal, with_primary_key=False)
        writers = bank.Writers(journal, 300, late_fraction=0.0, seed=5)
        writers.start(writers=4, max_batches=600)  # a backlog the workers are still reading
        await writers.wait()
    procs = [start_worker(dsn, "fleet", f"w{i}", tmp_path / f"w{i}.log") for i in (1, 2)]
    try:
        await asyncio.sleep(3)  # claimed and catching up
        server.stop()
        await asyncio.sleep(2 * TTL)  # down longer than a lease lasts
        assert server.start() == dsn
        async with Journal.connect(dsn, settings) as journal:
            writers = bank.Writers(journal, 300, late_fraction=0.0, seed=6)
            writers.seq = {pid: await journal.highest_seq_nr(pid) for pid in writers.pids}
            writers.start(writers=4, max_batches=50)
            await writers.wait()
            await exactly_once(journal)
            status = await FleetControl(journal).wait_converged(fleet_app.NAME, timeout=60)
            assert {r.owner for r in status.ranges} <= {"w1", "w2"}
        assert all(p.poll() is None for p in procs), "a worker process died"
    finally:
        codes = stop(procs)
    assert codes == [0, 0], [(tmp_path / f"w{i}.log").read_text()[-2000:] for i in (1, 2)]

"""Fleet workers survive the database: killed backends mid-batch, and a server restart.

Workers reconnect with backoff, keep or re-claim their ranges, and the read
model ends with every event applied exactly once (its `applied` table has no
key, so a second application would be a second row).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from journal import Journal, JournalSettings
from projections.aio.fleet_control import FleetControl
from slicejournal.embedded import EmbeddedPostgres
from tests.support import bank
from tests.support.fleet import NAME, TTL, Fleet
from tests.support.pg import fast_query_settings


async def fleet_recovered(journal: Journal, fleet: Fleet) -> None:
    """Every event applied exactly once, every range owned by one of the workers again,
    and no worker process died."""
    await bank.assert_applied_exactly_once(journal)
    status = await FleetControl(journal).wait_converged(NAME, timeout=60)
    assert {r.owner for r in status.ranges} <= set(fleet.procs)
    assert fleet.alive() == list(fleet.procs), "a worker process died"


def stopped_cleanly(fleet: Fleet) -> None:
    codes = fleet.stop_all()
    assert all(code == 0 for code in codes.values()), {w: fleet.log(w)[-2000:] for w in codes}


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_workers_survive_backends_killed_mid_batch(
    journal: Journal, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    await bank.create_read_model(journal, with_primary_key=False)
    fleet = Fleet(pg_dsn, schema, tmp_path)
    try:
        fleet.start("w1")
        fleet.start("w2")
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
        await fleet_recovered(journal, fleet)
        stopped_cleanly(fleet)
    finally:
        fleet.kill_all()


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
    fleet = Fleet(dsn, "fleet", tmp_path)
    try:
        fleet.start("w1")
        fleet.start("w2")
        await asyncio.sleep(3)  # claimed and catching up
        server.stop()
        await asyncio.sleep(2 * TTL)  # down longer than a lease lasts
        assert server.start() == dsn
        async with Journal.connect(dsn, settings) as journal:
            writers = bank.Writers(journal, 300, late_fraction=0.0, seed=6)
            writers.seq = {pid: await journal.highest_seq_nr(pid) for pid in writers.pids}
            writers.start(writers=4, max_batches=50)
            await writers.wait()
            await fleet_recovered(journal, fleet)
        stopped_cleanly(fleet)
    finally:
        fleet.kill_all()

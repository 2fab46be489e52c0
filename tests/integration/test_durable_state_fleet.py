"""A fleet over durable state (issue #31): `slicejournal worker` processes running a
grouped exactly-once projection over `changes_by_slices`, while writers race with
optimistic revisions and hold upserts open; rescaled 4 -> 8 -> 2 through the CLI and
one worker SIGKILLed. At the end the read model holds every id's latest revision and
no revision was applied twice (a primary key on (id, revision) would have failed the
batch)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from journal import DurableStateStore, Journal
from projections import FleetControl, FleetStatus
from tests.integration.test_durable_state_projections import (
    ENTITY,
    Writers,
    applied_rows,
    create_read_model,
    read_model,
    stored_states,
)
from tests.integration.test_fleet import cli
from tests.support.fleet import Fleet
from tests.support.long_transactions import horizon_settings
from tests.support.projections import eventually

NAME = "carts"


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_durable_state_fleet_rescaled_and_killed_applies_each_revision_once(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    async with Journal.connect(
        pg_dsn, horizon_settings(schema, max_hold=4), create_schema=True
    ) as j:
        await create_read_model(pg_dsn, schema)
        writers = Writers(DurableStateStore(j), pg_dsn, [f"{ENTITY}|{i}" for i in range(40)])
        control = FleetControl(j)
        fleet = Fleet(pg_dsn, schema, tmp_path, target="tests.support.fleet:carts")

        async def converge(without: str | None = None) -> FleetStatus:
            for _ in range(300):
                status = await control.wait_converged(NAME, timeout=60, interval=0.2)
                if without not in [r.owner for r in status.ranges]:
                    return status
                await asyncio.sleep(0.2)
            raise AssertionError(f"not converged without {without}: {status}")

        async def scale(n: int) -> None:
            code, out = await cli("scale", NAME, str(n), "--timeout", "60",
                                  dsn=pg_dsn, schema=schema)  # fmt: skip
            assert code == 0 and f"converged on {n} ranges" in out, out

        try:
            for worker_id in ("w1", "w2", "w3"):
                fleet.start(worker_id)
            tasks = [asyncio.create_task(writers.run(seed)) for seed in range(4)]
            try:
                await converge()
                await asyncio.sleep(2)
                await scale(8)
                await asyncio.sleep(2)
                await scale(2)
                victim = (await control.status(NAME)).ranges[0].owner
                assert victim is not None
                fleet.signal(victim, signal.SIGKILL)
                await converge(without=victim)
                await asyncio.sleep(2)
            finally:
                writers.stop.set()
                await asyncio.gather(*tasks)
            final = await stored_states(j)

            async def caught_up() -> bool:
                return await read_model(pg_dsn, schema) == final

            await eventually(caught_up, "the read model holds every id's latest revision", 90)
            applied = await applied_rows(pg_dsn, schema)
            assert len(applied) == len(set(applied))
            assert writers.refused > 0 and writers.held > 0
            codes = fleet.stop_all()
            assert codes[victim] == -signal.SIGKILL
            assert all(code == 0 for w, code in codes.items() if w != victim), codes
        finally:
            fleet.kill_all()

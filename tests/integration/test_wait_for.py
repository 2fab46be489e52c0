"""Read your writes: `ProjectionManagement.wait_for` on a real PostgreSQL (issue 30).

A writer appends, waits for the projection, then reads the read model: the
row must be there, whether the projection runs in this process or in a fleet
of `slicejournal worker` processes. `wait_for` is woken by the projection's
commit (a NOTIFY), so it returns long before its re-check interval; it raises
the typed `WaitTimeout` naming what is pending when nothing handles the
events, and checks its input before any I/O.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from psycopg import sql

from journal import InvalidArgument, InvalidPersistenceId, Journal, SliceRange, SyncJournal
from projections import Projection, ProjectionManagement, SyncProjectionManagement, WaitTimeout
from projections.aio.fleet_control import FleetControl
from tests.support import bank
from tests.support.fleet import NAME, Fleet
from tests.support.pg import fetch
from tests.support.projections import FAST, journal_settings

EVENT = {"amount": 1}


async def applied(j: Journal, pid: str) -> set[int]:
    rows = await fetch(
        j.dsn,
        sql.SQL("SELECT seq_nr FROM {} WHERE pid = %s").format(bank.table(j, "applied")),
        (pid,),
    )
    return {int(s) for (s,) in rows}


@pytest.mark.timeout(120)
async def test_after_wait_for_the_read_model_has_the_events(pg_dsn: str, schema: str) -> None:
    async with Journal.connect(pg_dsn, journal_settings(schema), create_schema=True) as j:
        await bank.create_read_model(j)
        projection = Projection.exactly_once(
            j, name="balances", entity_type=bank.ENTITY, slice_range=SliceRange.FULL,
            handler=bank.make_handler(j), settings=FAST,
        )  # fmt: skip
        management = ProjectionManagement(j)
        task = asyncio.create_task(projection.run())
        try:
            latencies = []
            for i in range(20):
                pid = bank.account(i)
                envelopes = await j.append(pid, [EVENT, EVENT], expected_seq_nr=0)
                began = time.monotonic()
                await management.wait_for("balances", envelopes, timeout=10)
                latencies.append(time.monotonic() - began)
                assert await applied(j, pid) == {1, 2}
            # Woken by the commit's notification, not by the 1 s re-check.
            assert sorted(latencies)[len(latencies) // 2] < 0.5, latencies
            # (pid, seq_nr) pairs work too, and already handled events return at once.
            await management.wait_for("balances", [(bank.account(0), 2)], timeout=1)
            await management.wait_for("balances", [], timeout=1)
        finally:
            await projection.stop()
            await task

        # Nothing runs now: the new event is not handled, and the error says which.
        late = await j.append(bank.account(0), [EVENT], expected_seq_nr=2)
        began = time.monotonic()
        with pytest.raises(WaitTimeout) as caught:
            await management.wait_for("balances", late, timeout=0.5)
        assert 0.5 <= time.monotonic() - began < 3
        assert caught.value.pending == [(bank.account(0), 3)]
        assert bank.account(0) in str(caught.value)
        # Another projection name has handled nothing.
        with pytest.raises(WaitTimeout):
            await management.wait_for("other", [(bank.account(1), 1)], timeout=0.2)


@pytest.mark.timeout(60)
async def test_wait_for_checks_its_input_first(journal: Journal) -> None:
    management = ProjectionManagement(journal)
    for events, timeout in (
        ([("", 1)], 1.0),
        ([("Bank|a", -1)], 1.0),
        ([("Bank|a", "1")], 1.0),
        (["Bank|a"], 1.0),
        ("Bank|a", 1.0),
        ([("Bank|a", 1)], 0),
        ([("Bank|a", 1)], True),
    ):
        with pytest.raises((InvalidArgument, InvalidPersistenceId)):
            await management.wait_for("balances", events, timeout=timeout)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_wait_for_a_fleet_of_worker_processes(
    journal: Journal, pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    await bank.create_read_model(journal)
    fleet = Fleet(pg_dsn, schema, tmp_path)
    try:
        fleet.start("w1")
        fleet.start("w2")
        control = FleetControl(journal)
        await control.wait_converged(NAME, timeout=60, interval=0.2)
        management = ProjectionManagement(journal)
        for i in range(10):
            pid = bank.account(i)
            envelopes = await journal.append(pid, [EVENT], expected_seq_nr=0)
            await management.wait_for(NAME, envelopes, timeout=30)
            assert await applied(journal, pid) == {1}
        # The sync flavour, from a plain thread, over the same fleet.
        pid = bank.account(100)
        envelopes = await journal.append(pid, [EVENT, EVENT, EVENT], expected_seq_nr=0)

        def sync_wait() -> None:
            with SyncJournal.connect(pg_dsn, journal_settings(schema)) as sj:
                SyncProjectionManagement(sj).wait_for(NAME, envelopes, timeout=30)

        await asyncio.to_thread(sync_wait)
        assert await applied(journal, pid) == {1, 2, 3}
    finally:
        fleet.kill_all()

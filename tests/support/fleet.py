"""The projection the fleet tests run in `slicejournal worker` subprocesses, and the
processes that run it.

`tests.support.fleet:balances` is the factory `(journal, slice_range) -> Projection`:
the bank read model's grouped exactly-once handler, whose `applied(pid, seq_nr)`
primary key (unless the test created the read model without one) makes any
event applied twice an error the test sees. `worker_processes` starts it in
workers of one schema, by worker id, with the tests' lease TTL.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from journal import BacktrackingSettings, Journal, SliceRange
from projections import Projection, ProjectionSettings
from projections.fleet.lease_sql import FleetSql
from projections.tables import ProjectionTables
from slicejournal.examples.worker_processes import WorkerProcesses
from tests.support import ROOT, bank
from tests.support.pg import fast_query_settings

NAME = "balances"
TARGET = "tests.support.fleet:balances"
TTL = 2.0


def balances(journal: Journal, slice_range: SliceRange) -> Projection:
    return Projection.grouped(
        journal,
        name=NAME,
        entity_type=bank.ENTITY,
        slice_range=slice_range,
        handler=bank.make_grouped_handler(journal),
        settings=ProjectionSettings(
            group_after_envelopes=20, group_after_duration=0.1, management_poll_interval=0.5
        ),
        # Late commits in the tests stay open up to 5 s: backtrack behind that.
        query_settings=fast_query_settings(
            buffer_size=100, backtracking=BacktrackingSettings(window=20, behind_current_time=6)
        ),
    )


def carts(journal: Journal, slice_range: SliceRange) -> Projection:
    """A grouped exactly-once projection over durable state (`Cart` ids): the read model
    of `tests.integration.test_durable_state_projections`, whose `state_applied`
    primary key makes a revision applied twice an error."""
    from tests.integration.test_durable_state_projections import grouped_handler

    return Projection.grouped_changes(
        journal,
        name="carts",
        entity_type="Cart",
        slice_range=slice_range,
        handler=grouped_handler(journal.settings.schema),
        settings=ProjectionSettings(
            group_after_envelopes=20, group_after_duration=0.1, management_poll_interval=0.5
        ),
        query_settings=fast_query_settings(buffer_size=100),
    )


class Fleet(WorkerProcesses):
    """Workers running `balances` (or `target`) on `schema`, logs in `logs`; `stop_all`
    waits 20 s."""

    def __init__(self, dsn: str, schema: str, logs: Path, target: str = TARGET) -> None:
        super().__init__(
            target,
            dsn=dsn,
            schema=schema,
            lease_ttl=TTL,
            logs=logs,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    def stop_all(self, within: float = 20.0) -> dict[str, int | None]:
        return super().stop_all(within)


async def claim(journal: Journal, r: SliceRange, owner: str, name: str = "balances") -> int:
    """Claim (or take over) projection `name`'s lease on `r` the way a worker does;
    returns its epoch."""
    statements = FleetSql(ProjectionTables(journal.tables))
    connect = psycopg.AsyncConnection.connect(journal.dsn, autocommit=True)
    async with await connect as conn, conn.transaction():
        # FOR UPDATE: waits for a fenced transaction holding the row FOR KEY SHARE.
        await conn.execute(statements.lock_overlapping, (name, r.max_slice, r.min_slice))
        params = statements.claim_params(name, r, owner, 3_600_000)
        cur = await conn.execute(statements.claim, params)
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])

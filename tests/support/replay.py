"""A projection whose handler fails on chosen ids, for the dead-letter replay tests.

`replayed:projection` is the factory `(journal, slice_range) -> Projection` that
`slicejournal worker` processes run (`TARGET`); in-process tests use it too. The
handler inserts `(pid, seq_nr)` into `replay_applied` (primary key: an event
applied twice fails its transaction) and fails while the id is listed in
`replay_broken`: the test "fixes the bug" by deleting that row, in any process.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, sql

from journal import EventEnvelope, Journal, SliceRange
from projections import Projection, ProjectionSettings, RecoveryStrategy

NAME = "replayed"
ENTITY = "Letter"
TARGET = "tests.support.replay:projection"


def table(journal: Journal, name: str) -> sql.Identifier:
    return sql.Identifier(journal.settings.schema, name)


async def create_tables(journal: Journal) -> None:
    async with journal.pool.connection() as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (pid text, seq_nr bigint, PRIMARY KEY (pid, seq_nr)); "
                "CREATE TABLE {} (pid text PRIMARY KEY)"
            ).format(table(journal, "replay_applied"), table(journal, "replay_broken"))
        )


def projection(journal: Journal, slice_range: SliceRange) -> Projection:
    broken = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE pid = %s)").format(
        table(journal, "replay_broken")
    )
    insert = sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table(journal, "replay_applied"))

    async def handler(conn: AsyncConnection[Any], env: EventEnvelope) -> None:
        cur = await conn.execute(broken, (env.persistence_id,))
        if (await cur.fetchone() or (False,))[0]:
            raise RuntimeError(f"bug on {env.persistence_id}")
        await conn.execute(insert, (env.persistence_id, env.seq_nr))

    return Projection.exactly_once(
        journal,
        name=NAME,
        entity_type=ENTITY,
        slice_range=slice_range,
        handler=handler,
        settings=ProjectionSettings(management_poll_interval=0.2),
        recovery=RecoveryStrategy.retry_and_skip(1),
    )

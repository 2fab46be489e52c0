"""A projection in its own process, for the SIGKILL test.

Usage: `python -m tests.support.projection_worker DSN SCHEMA` (from the project root).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from journal import BacktrackingSettings, Journal, JournalSettings, SliceRange
from projections import Projection, ProjectionSettings
from tests.support import bank
from tests.support.pg import fast_query_settings


async def main(dsn: str, schema: str) -> None:
    settings = JournalSettings(
        schema=schema,
        query=fast_query_settings(
            buffer_size=100, backtracking=BacktrackingSettings(window=20, behind_current_time=6)
        ),
    )
    async with Journal.connect(dsn, settings) as j:
        p = Projection.grouped(
            j,
            name="balances",
            entity_type=bank.ENTITY,
            slice_range=SliceRange(0, 1023),
            handler=bank.make_grouped_handler(j),
            settings=ProjectionSettings(group_after_envelopes=20, group_after_duration=0.1),
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(p.stop()))
        await p.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))

"""`slicejournal spark-demo`: the bank workload projected on a local Apache Spark.

The same aggregates and read model as `slicejournal demo`, run the way a data
team would: a backfill of the balances projection on Spark (`availableNow`,
exactly once, one transaction per partition), a rebuild of the read model on
Spark swapped in atomically, then a handoff to the in-process runner, which
continues from the offsets Spark stored while new events are written. At the
end the read model is checked against the aggregates and a replay of the
journal (`applied` has no key: an event applied twice would be a second row).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

from journal.errors import JournalError
from journal.settings import JournalSettings
from journal.slices import SliceRange
from slicejournal.demo import PROJECTION, _wait_projected, balances_projection, demo_journal
from slicejournal.examples.bank import (
    APPLIED_TABLE,
    BALANCES_TABLE,
    ENTITY_TYPE,
    BalancesReadModel,
    BankWorkload,
    bank_serializers,
)


async def run_spark_demo(
    dsn: str | None, settings: JournalSettings, args: argparse.Namespace
) -> int:
    from projections.spark import local_session, project, rebuild

    async with demo_journal(dsn, settings) as (journal, model):
        bank = BankWorkload(journal, args.accounts)
        backfill = args.events // 2
        started = time.perf_counter()
        await bank.write(backfill, args.writers, seed=1)
        print(f"write    {backfill} events, {len(bank.expected)} accounts, {args.writers} writers "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip

        started = time.perf_counter()
        spark = await asyncio.to_thread(local_session, "slicejournal-spark-demo")
        print(f"spark    local[2] session, PySpark {spark.version}, "
              f"started in {time.perf_counter() - started:.1f} s")  # fmt: skip
        common: dict[str, Any] = {
            "dsn": journal.dsn,
            "name": PROJECTION,
            "entity_type": ENTITY_TYPE,
            "settings": settings,
            "serializers": bank_serializers,
        }
        try:
            started = time.perf_counter()
            query = await asyncio.to_thread(
                project, spark, handler=model.handle_sync, trigger={"availableNow": True},
                checkpoint_location=tempfile.mkdtemp(prefix="slicejournal-spark-"), **common,
            )  # fmt: skip
            await asyncio.to_thread(query.awaitTermination)
            if query.exception() is not None:
                raise JournalError(f"the Spark projection failed: {query.exception()}")
            async with journal.pool.connection() as conn:
                _, on_spark = await model.applied(conn)
            spent = time.perf_counter() - started
            print(f"project  {on_spark} events exactly once on Spark (availableNow, 4 partitions, "
                  f"one transaction each) in {spent:.1f} s")  # fmt: skip

            started = time.perf_counter()
            tables = [f"{settings.schema}.{t}" for t in (BALANCES_TABLE, APPLIED_TABLE)]
            result = await asyncio.to_thread(
                rebuild, spark, handler=BalancesReadModel(None).handle_sync, read_models=tables,
                **common,
            )  # fmt: skip
            spent = time.perf_counter() - started
            print(f"rebuild  {result.events} events into a staging copy on Spark, swapped in "
                  f"atomically with the offsets in {spent:.1f} s")  # fmt: skip
        finally:
            await asyncio.to_thread(spark.stop)

        live = balances_projection(journal, SliceRange.FULL)
        task = asyncio.create_task(live.run())
        more = args.events - backfill
        await bank.write(more, args.writers, seed=1000)
        rows, distinct = await _wait_projected(journal, model, args.events)
        await live.stop()
        await task
        print(f"handoff  the in-process runner continued from Spark's offsets while {more} more "
              f"events were written: {live.stats.accepted} applied, "
              f"{live.stats.duplicates} re-read and dropped")  # fmt: skip

        checked = await bank.verify(journal, model)
        missing, mismatches = checked.missing, checked.mismatches
        twice = rows - distinct
        print(f"verify   events written={args.events} projected={distinct} "
              f"applied twice={twice} missing={missing} mismatches={mismatches}")  # fmt: skip
        ok = (
            mismatches == 0
            and missing == 0
            and rows == distinct == args.events == checked.replay_events
        )
        print("OK" if ok else "FAILED")
        return 0 if ok else 1

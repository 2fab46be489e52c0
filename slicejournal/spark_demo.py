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
import random
import tempfile
import time
from typing import Any

import psycopg

from journal.aggregate import AggregateRepository
from journal.dsn import display_dsn
from journal.errors import JournalError
from journal.journal import Journal
from journal.settings import JournalSettings
from journal.slices import PersistenceId, SliceRange
from slicejournal.demo import (
    APPLIED_TABLE,
    ENTITY_TYPE,
    PROJECTION,
    READ_MODEL_TABLE,
    Account,
    BalancesReadModel,
    _replay,
    _wait_projected,
    balances_projection,
    bank_serializers,
    decide,
    evolve,
    split_evenly,
)
from slicejournal.demo_schema import claim_demo_schema


async def _write(
    repo: AggregateRepository[Account, Any], pids: list[str], expected: dict[str, int],
    count: int, writers: int, seed: int,
) -> None:  # fmt: skip
    async def writer(rng: random.Random, n: int) -> None:
        for _ in range(n):
            pid = rng.choice(pids)
            loaded = await repo.update(pid, decide(rng))
            expected[pid] = loaded.state.balance

    shares = split_evenly(count, writers)
    await asyncio.gather(*(writer(random.Random(seed + i), n) for i, n in enumerate(shares)))


async def run_spark_demo(
    dsn: str | None, settings: JournalSettings, args: argparse.Namespace
) -> int:
    from projections.spark import local_session, project, rebuild

    async with Journal.connect(
        dsn, settings, serializers=bank_serializers(), create_schema=False, check_schema=False
    ) as journal:
        print(f"journal  PostgreSQL at {display_dsn(journal.dsn)}, schema {settings.schema!r}")
        async with await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True) as conn:
            await claim_demo_schema(conn, settings, (READ_MODEL_TABLE, APPLIED_TABLE))
        await journal.create_schema()
        model = BalancesReadModel(settings.schema)
        async with journal.pool.connection() as conn:
            await model.create(conn)
        repo: AggregateRepository[Account, Any] = AggregateRepository(
            journal, initial=Account, evolve=evolve, snapshot_every=20
        )
        pids = [PersistenceId.of(ENTITY_TYPE, f"acc-{i}").id for i in range(args.accounts)]
        expected: dict[str, int] = {}
        backfill = args.events // 2
        started = time.perf_counter()
        await _write(repo, pids, expected, backfill, args.writers, seed=1)
        print(f"write    {backfill} events, {len(expected)} accounts, {args.writers} writers "
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
            tables = [f"{settings.schema}.{t}" for t in (READ_MODEL_TABLE, APPLIED_TABLE)]
            result = await asyncio.to_thread(
                rebuild, spark, handler=BalancesReadModel(None).handle_sync, tables=tables,
                **common,
            )  # fmt: skip
            spent = time.perf_counter() - started
            print(f"rebuild  {result.events} events into a staging copy on Spark, swapped in "
                  f"atomically with the offsets in {spent:.1f} s")  # fmt: skip
        finally:
            await asyncio.to_thread(spark.stop)

        live = balances_projection(journal, SliceRange(0, 1023))
        task = asyncio.create_task(live.run())
        more = args.events - backfill
        await _write(repo, pids, expected, more, args.writers, seed=1000)
        rows, distinct = await _wait_projected(journal, model, args.events)
        await live.stop()
        await task
        print(f"handoff  the in-process runner continued from Spark's offsets while {more} more "
              f"events were written: {live.stats.accepted} applied, "
              f"{live.stats.duplicates} re-read and dropped")  # fmt: skip

        async with journal.pool.connection() as conn:
            balances = await model.balances(conn)
            missing = await model.missing(conn, journal.tables.journal)
        replayed, replay_events, _ = await _replay(journal)
        mismatches = sum(
            1
            for pid, balance in expected.items()
            if balances.get(pid) != balance or replayed.get(pid) != balance
        )
        twice = rows - distinct
        print(f"verify   events written={args.events} projected={distinct} "
              f"applied twice={twice} missing={missing} mismatches={mismatches}")  # fmt: skip
        ok = mismatches == 0 and missing == 0 and rows == distinct == args.events == replay_events
        print("OK" if ok else "FAILED")
        return 0 if ok else 1

"""Sharing one journal with a JVM service that uses Pekko Persistence R2DBC (Postgres dialect).

Rows are written with the statements Pekko's `JournalDao` issues, and our
rows are read with the statements Pekko's `QueryDao` issues, so a change to
either side's column usage shows up here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from journal import (
    ConcurrencyError,
    EventEnvelope,
    Journal,
    JournalSettings,
    SerializerRegistry,
    slice_for,
)
from slicejournal.examples.bank import Deposited, Withdrawn
from tests.support.pekko import JACKSON_JSON, PekkoEvent, pekko_write
from tests.support.pg import fetch

DEPOSITED = "com.example.bank.Deposited"
WITHDRAWN = "com.example.bank.Withdrawn"


def bank_registry() -> SerializerRegistry:
    registry = SerializerRegistry()
    registry.register(Deposited, DEPOSITED)
    registry.register(Withdrawn, WITHDRAWN)
    return registry


@pytest.fixture
async def bank(pg_dsn: str, schema: str) -> AsyncIterator[Journal]:
    settings = JournalSettings(schema=schema)
    async with Journal.connect(
        pg_dsn, settings, serializers=bank_registry(), create_schema=True
    ) as j:
        yield j


# Pekko's QueryDao.selectEventsSql (eventsByPersistenceId).
PEKKO_SELECT_EVENTS = """
SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp,
  statement_timestamp() AS read_db_timestamp, event_ser_id, event_ser_manifest, event_payload,
  writer, adapter_manifest, meta_ser_id, meta_ser_manifest, meta_payload
FROM {journal}
WHERE persistence_id = %s AND seq_nr >= %s AND seq_nr <= %s
AND deleted = false
ORDER BY seq_nr
LIMIT %s
"""

# Pekko's QueryDao.eventsBySlicesRangeSql for the Postgres dialect (not backtracking).
PEKKO_SELECT_BY_SLICES = """
SELECT slice, persistence_id, seq_nr, db_timestamp, statement_timestamp() AS read_db_timestamp,
  event_ser_id, event_ser_manifest, event_payload, meta_ser_id, meta_ser_manifest, meta_payload
FROM {journal}
WHERE entity_type = %s
AND slice in ({slices})
AND db_timestamp >= %s AND db_timestamp <= %s
AND deleted = false
ORDER BY db_timestamp, seq_nr
LIMIT %s
"""


async def by_pid(journal: Journal, pid: str) -> list[EventEnvelope]:
    return [env async for env in journal.current_events_by_persistence_id(pid)]


async def test_events_written_by_pekko_are_read_by_journal(
    bank: Journal, pg_dsn: str, schema: str
) -> None:
    acc1, acc2 = "BankAccount|acc-1", "BankAccount|acc-2"
    await pekko_write(
        pg_dsn,
        schema,
        acc1,
        1,
        [
            PekkoEvent(DEPOSITED, '{"amount":10}', tags=["bank", "eu"]),
            PekkoEvent(WITHDRAWN, '{"amount":3}'),
            PekkoEvent(DEPOSITED, '{"amount":5}'),
        ],
    )
    await pekko_write(
        pg_dsn,
        schema,
        acc2,
        1,
        [PekkoEvent(DEPOSITED, '{"amount":100}', meta=(JACKSON_JSON, "", b'{"by":"jvm"}'))],
    )
    await pekko_write(pg_dsn, schema, acc1, 4, [PekkoEvent(WITHDRAWN, '{"amount":1}')])

    envs = await by_pid(bank, acc1)
    assert [(e.seq_nr, e.event) for e in envs] == [
        (1, Deposited(10)),
        (2, Withdrawn(3)),
        (3, Deposited(5)),
        (4, Withdrawn(1)),
    ]
    assert {(e.entity_type, e.slice, e.writer) for e in envs} == {
        ("BankAccount", slice_for(acc1), "2f0e6c1a-pekko-writer-uuid")
    }
    assert [e.serializer_manifest for e in envs] == [DEPOSITED, WITHDRAWN, DEPOSITED, WITHDRAWN]
    assert envs[0].tags == ("bank", "eu") and envs[1].tags == ()
    # Pekko's batch: each event 1 µs after the previous one, all from one transaction
    stamps = [e.db_timestamp for e in envs]
    assert stamps[1] - stamps[0] == timedelta(microseconds=1)
    assert stamps[2] - stamps[1] == timedelta(microseconds=1)
    assert stamps[3] > stamps[2]

    (acc2_env,) = await by_pid(bank, acc2)
    assert acc2_env.event == Deposited(100)
    assert acc2_env.metadata == {"by": "jvm"}

    sliced = [e async for e in bank.current_events_by_slices("BankAccount", 0, 1023)]
    assert sorted((e.persistence_id, e.seq_nr) for e in sliced) == [
        (acc1, 1),
        (acc1, 2),
        (acc1, 3),
        (acc1, 4),
        (acc2, 1),
    ]
    order = [(e.db_timestamp, e.seq_nr) for e in sliced]
    assert order == sorted(order)
    assert {e.persistence_id: e.event for e in sliced if e.seq_nr == 1} == {
        acc1: Deposited(10),
        acc2: Deposited(100),
    }
    lo = hi = slice_for(acc2)
    only_acc2 = [
        e.persistence_id async for e in bank.current_events_by_slices("BankAccount", lo, hi)
    ]
    assert acc2 in only_acc2 and (acc1 in only_acc2) == (slice_for(acc1) == lo)

    assert await bank.highest_seq_nr(acc1) == 4
    assert [pid async for pid in bank.current_persistence_ids("BankAccount")] == [acc1, acc2]


async def test_journal_continues_a_stream_started_by_pekko(
    bank: Journal, pg_dsn: str, schema: str
) -> None:
    pid = "BankAccount|mixed"
    await pekko_write(
        pg_dsn,
        schema,
        pid,
        1,
        [PekkoEvent(DEPOSITED, '{"amount":10}'), PekkoEvent(DEPOSITED, '{"amount":20}')],
    )
    with pytest.raises(ConcurrencyError):
        await bank.append(pid, [Withdrawn(5)], expected_seq_nr=1)
    (ours,) = await bank.append(pid, [Withdrawn(5)], expected_seq_nr=2)
    assert ours.seq_nr == 3
    # and Pekko continues after us, keeping db_timestamps increasing
    await pekko_write(pg_dsn, schema, pid, 4, [PekkoEvent(DEPOSITED, '{"amount":1}')])
    envs = await by_pid(bank, pid)
    assert [e.event for e in envs] == [Deposited(10), Deposited(20), Withdrawn(5), Deposited(1)]
    stamps = [e.db_timestamp for e in envs]
    assert stamps == sorted(stamps) and len(set(stamps)) == 4


async def test_events_appended_by_journal_read_the_way_pekko_reads_them(
    bank: Journal, pg_dsn: str, schema: str
) -> None:
    pid = "BankAccount|py-1"
    appended = await bank.append(pid, [Deposited(7), Withdrawn(2)], expected_seq_nr=0)
    await bank.append(pid, [Deposited(1)], expected_seq_nr=2, tags=["py"])
    journal = sql.Identifier(schema, "event_journal")

    rows = await fetch(
        pg_dsn, sql.SQL(PEKKO_SELECT_EVENTS).format(journal=journal), (pid, 1, 2**63 - 1, 1000)
    )
    assert [r[3] for r in rows] == [1, 2, 3]
    for row, manifest, payload in zip(
        rows,
        [DEPOSITED, WITHDRAWN, DEPOSITED],
        [b'{"amount":7}', b'{"amount":2}', b'{"amount":1}'],
        strict=True,
    ):
        (
            slice_,
            entity_type,
            persistence_id,
            _seq_nr,
            db_timestamp,
            _read_ts,
            ser_id,
            ser_manifest,
            event_payload,
            writer,
            adapter_manifest,
            meta_ser_id,
            meta_ser_manifest,
            meta_payload,
        ) = row
        assert slice_ == slice_for(pid)
        assert (entity_type, persistence_id) == ("BankAccount", pid)
        assert (ser_id, ser_manifest, bytes(event_payload)) == (JACKSON_JSON, manifest, payload)
        assert writer == bank.settings.writer_id
        assert adapter_manifest in (None, "")  # Pekko writes "" and never reads it back
        assert (meta_ser_id, meta_ser_manifest, meta_payload) == (None, None, None)
        assert db_timestamp.tzinfo is not None
    assert rows[0][4] == appended[0].db_timestamp

    # columns Pekko's journal replay and event adapters rely on
    extra = await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT seq_nr, deleted, tags FROM {} WHERE persistence_id = %s ORDER BY seq_nr"
        ).format(journal),
        (pid,),
    )
    assert extra == [(1, False, None), (2, False, None), (3, False, ["py"])]

    # eventsBySlices as Pekko issues it (slice IN list, to-timestamp bound)
    s = slice_for(pid)
    now = await bank.database_time()
    sliced = await fetch(
        pg_dsn,
        sql.SQL(PEKKO_SELECT_BY_SLICES).format(
            journal=journal, slices=sql.SQL(", ").join(sql.Literal(x) for x in range(s, s + 1))
        ),
        ("BankAccount", appended[0].db_timestamp - timedelta(seconds=1), now, 1000),
    )
    assert [(r[1], r[2], r[6]) for r in sliced] == [
        (pid, 1, DEPOSITED),
        (pid, 2, WITHDRAWN),
        (pid, 3, DEPOSITED),
    ]


async def test_pekko_delete_markers_are_respected(bank: Journal, pg_dsn: str, schema: str) -> None:
    pid = "BankAccount|del"
    await pekko_write(
        pg_dsn,
        schema,
        pid,
        1,
        [PekkoEvent(DEPOSITED, f'{{"amount":{n}}}') for n in (1, 2, 3)],
    )
    journal = sql.Identifier(schema, "event_journal")
    # Pekko's deleteMessagesTo(pid, 2): delete the events, then insert a marker row.
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await conn.execute(
            sql.SQL("DELETE FROM {} WHERE persistence_id = %s AND seq_nr <= %s").format(journal),
            (pid, 2),
        )
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
                "writer, adapter_manifest, event_ser_id, event_ser_manifest, event_payload, "
                "deleted) VALUES (%s, %s, %s, %s, transaction_timestamp(), %s, %s, %s, %s, %s, %s)"
            ).format(journal),
            (slice_for(pid), "BankAccount", pid, 2, "", "", 0, "", b"", True),
        )
        await conn.commit()
    assert [e.event for e in await by_pid(bank, pid)] == [Deposited(3)]
    assert await bank.highest_seq_nr(pid) == 3
    sliced = [e.seq_nr async for e in bank.current_events_by_slices("BankAccount", 0, 1023)]
    assert sliced == [3]

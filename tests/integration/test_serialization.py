"""Event serialization through a real journal: nested events round trip, and old
versions are upcast by a newer journal while an older one refuses newer rows."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from psycopg import sql

from journal import (
    DeserializationError,
    Journal,
    JournalSettings,
    slice_for,
)
from tests.support.pg import fetch
from tests.support.serialization import (
    ORDER,
    Channel,
    Currency,
    Customer,
    Money,
    OrderPlaced,
    OrderPlacedV1,
    OrderPlacedV2,
    Paid,
    Priority,
    a_payment,
    full_registry,
    v1_registry,
    v2_registry,
    v3_registry,
)

# -- through a real journal -----------------------------------------------------------


async def test_nested_event_round_trips_through_the_journal(
    pg_dsn: str, settings: JournalSettings
) -> None:
    pid = f"Payment|{uuid.uuid4()}"
    events = [a_payment(i) for i in range(3)]
    async with Journal.connect(
        pg_dsn, settings, serializers=full_registry(), create_schema=True
    ) as writer:
        await writer.append(pid, events, expected_seq_nr=0)

    # a second journal, with its own registry, reads what the first one wrote
    async with Journal.connect(pg_dsn, settings, serializers=full_registry()) as reader:
        by_pid = [e async for e in reader.current_events_by_persistence_id(pid)]
        s = slice_for(pid)
        by_slices = [e async for e in reader.current_events_by_slices("Payment", s, s)]
    for read in (by_pid, by_slices):
        assert [e.event for e in read] == events
        assert [e.seq_nr for e in read] == [1, 2, 3]
        for e in read:
            assert type(e.event) is Paid and type(e.event.money) is Money
            assert type(e.event.payment_id) is uuid.UUID
            assert e.event.at.utcoffset() == timedelta(hours=5, minutes=30)
            assert type(e.event.priority) is Priority and type(e.event.channel) is Channel
        assert [str(e.event.money.amount) for e in read] == ["0.50", "1.50", "2.50"]

    rows = await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT event_ser_id, event_ser_manifest, convert_from(event_payload, 'UTF8') "
            "FROM {} WHERE persistence_id = %s ORDER BY seq_nr"
        ).format(sql.Identifier(settings.schema, "event_journal")),
        (pid,),
    )
    assert [(r[0], r[1]) for r in rows] == [(31, "test.Paid")] * 3
    first = json.loads(rows[0][2])
    assert first == {
        "payment_id": "00000000-0000-0000-0000-000000000001",
        "money": {"amount": "0.50", "currency": "EUR"},
        "at": "2024-05-06T07:08:09.123456+05:30",
        "priority": 2,
        "channel": "shop",
    }


async def test_events_of_an_old_version_are_upcast_by_a_newer_journal(
    pg_dsn: str, settings: JournalSettings
) -> None:
    pid = f"Order|{uuid.uuid4()}"
    async with Journal.connect(
        pg_dsn, settings, serializers=v1_registry(), create_schema=True
    ) as old:
        await old.append(
            pid, [OrderPlacedV1(1250, "ann"), OrderPlacedV1(5, "bo")], expected_seq_nr=0
        )
    async with Journal.connect(pg_dsn, settings, serializers=v2_registry()) as middle:
        await middle.append(pid, [OrderPlacedV2(Decimal("3.333"), "cy")], expected_seq_nr=2)

    expected = [
        OrderPlaced(Money(Decimal("12.50"), Currency.EUR), Customer("ann", False)),
        OrderPlaced(Money(Decimal("0.05"), Currency.EUR), Customer("bo", False)),
        OrderPlaced(Money(Decimal("3.333"), Currency.EUR), Customer("cy", False)),
    ]
    newest = OrderPlaced(Money(Decimal("1"), Currency.USD), Customer("di", True))
    async with Journal.connect(pg_dsn, settings, serializers=v3_registry()) as new:
        by_pid = [e.event async for e in new.current_events_by_persistence_id(pid)]
        s = slice_for(pid)
        by_slices = [e.event async for e in new.current_events_by_slices("Order", s, s)]
        await new.append(pid, [newest], expected_seq_nr=3)
        assert [e.event async for e in new.current_events_by_persistence_id(pid, 4)] == [newest]
    assert by_pid == expected and by_slices == expected
    assert all(type(e) is OrderPlaced and type(e.total) is Money for e in by_pid)

    rows = await fetch(
        pg_dsn,
        sql.SQL(
            "SELECT event_ser_manifest FROM {} WHERE persistence_id = %s ORDER BY seq_nr"
        ).format(sql.Identifier(settings.schema, "event_journal")),
        (pid,),
    )
    assert [r[0] for r in rows] == [ORDER, ORDER, ORDER + "#2", ORDER + "#3"]

    # a service still on version 1 refuses the newer rows instead of misreading them
    async with Journal.connect(pg_dsn, settings, serializers=v1_registry()) as old:
        assert [e.event async for e in old.current_events_by_persistence_id(pid, 1, 2)] == [
            OrderPlacedV1(1250, "ann"),
            OrderPlacedV1(5, "bo"),
        ]
        newer = [e async for e in old.current_events_by_persistence_id(pid, 3)]
    error = newer[0].error
    assert error is not None and (error.persistence_id, error.seq_nr) == (pid, 3)
    assert "newer than version 1" in str(error)
    with pytest.raises(DeserializationError):
        newer[0].decoded_event()

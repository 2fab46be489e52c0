"""The serialization tests' event classes and registries (module level, so their
annotations resolve), shared by the pure tests and those through a real journal."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import attrs

from journal import (
    SerializerRegistry,
)

# -- event classes (module level, so their annotations resolve) -----------------


class Currency(enum.Enum):
    EUR = "EUR"
    USD = "USD"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Channel(enum.StrEnum):
    WEB = "web"
    SHOP = "shop"


@attrs.frozen
class Money:
    amount: Decimal
    currency: Currency


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int
    price: Money  # attrs inside a dataclass


@attrs.frozen
class Paid:
    """The user's report: a nested attrs class came back as a dict."""

    payment_id: uuid.UUID
    money: Money
    at: datetime
    priority: Priority
    channel: Channel


@attrs.frozen
class Invoice:
    lines: tuple[Line, ...]  # dataclasses inside an attrs class
    issued: date
    due: datetime  # naive on purpose
    total: Money
    discount: Money | None
    pair: tuple[int, str]
    notes: list[str]
    by_line: dict[int, Money]
    by_name: dict[str, list[Decimal]]
    reference: int | str
    tags: frozenset[str]
    checksum: bytes


@dataclasses.dataclass
class Receipt:
    invoice: Invoice  # the attrs class nested in a dataclass
    printed_at: datetime | None = None


@attrs.frozen
class Deposited:
    amount: int


@dataclasses.dataclass
class Renamed:
    title: str
    count: int = 0


def registry(*classes: tuple[type, str]) -> SerializerRegistry:
    r = SerializerRegistry()
    for cls, name in classes:
        r.register(cls, name)
    return r


def full_registry() -> SerializerRegistry:
    return registry(
        (Paid, "test.Paid"),
        (Invoice, "test.Invoice"),
        (Receipt, "test.Receipt"),
        (Deposited, "test.Deposited"),
        (Money, "test.Money"),
    )


def round_trip(value: Any, writer: SerializerRegistry | None = None) -> Any:
    """Encode with one registry and decode the bytes with a fresh one."""
    stored = (writer or full_registry()).serialize(value)
    return full_registry().deserialize(stored.serializer_id, stored.manifest, stored.payload)


def an_invoice() -> Invoice:
    eur = Currency.EUR
    return Invoice(
        lines=(
            Line("apple", 3, Money(Decimal("0.35"), eur)),
            Line("pear", 1, Money(Decimal("1.10"), eur)),
        ),
        issued=date(2024, 2, 29),
        due=datetime(2024, 3, 31, 23, 59, 59, 999999),
        total=Money(Decimal("2.15"), eur),
        discount=Money(Decimal("-0.05"), Currency.USD),
        pair=(7, "seven"),
        notes=["first", "second"],
        by_line={1: Money(Decimal("1.05"), eur), 2: Money(Decimal("1.10"), eur)},
        by_name={"apple": [Decimal("0.35"), Decimal("0.350")]},
        reference=42,
        tags=frozenset({"a", "b"}),
        checksum=b"\x00\xff\x10binary",
    )


def a_payment(i: int = 0) -> Paid:
    return Paid(
        payment_id=uuid.UUID(int=i + 1),
        money=Money(Decimal(f"{i}.50"), Currency.EUR),
        at=datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        priority=Priority.HIGH,
        channel=Channel.SHOP,
    )


# -- versions and upcasting ---------------------------------------------------------

ORDER = "shop.OrderPlaced"


@attrs.frozen
class OrderPlacedV1:
    """Version 1: the total in cents, the customer a bare name."""

    total_cents: int
    customer: str


@attrs.frozen
class OrderPlacedV2:
    """Version 2: the total as a decimal amount."""

    total: Decimal
    customer: str


@attrs.frozen
class Customer:
    name: str
    vip: bool


@attrs.frozen
class OrderPlaced:
    """Version 3 (current): money with a currency, the customer an object."""

    total: Money
    customer: Customer


def v1_to_v2(doc: dict[str, Any]) -> dict[str, Any]:
    cents = doc.pop("total_cents")
    return {**doc, "total": str(Decimal(cents).scaleb(-2))}


def v2_to_v3(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "total": {"amount": doc["total"], "currency": "EUR"},
        "customer": {"name": doc["customer"], "vip": False},
    }


def v1_registry() -> SerializerRegistry:
    return registry((OrderPlacedV1, ORDER))


def v2_registry() -> SerializerRegistry:
    r = SerializerRegistry()
    r.register(OrderPlacedV2, ORDER, version=2, upcasters={1: v1_to_v2})
    return r


def v3_registry(**kwargs: Any) -> SerializerRegistry:
    r = SerializerRegistry()
    r.register(OrderPlaced, ORDER, version=3, upcasters={1: v1_to_v2, 2: v2_to_v3}, **kwargs)
    return r

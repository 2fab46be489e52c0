"""Event serialization: exact round trips, strict reads, versions and upcasting.

The pure tests encode with one registry and decode the bytes (the only thing a
journal stores) with another, so nothing is compared with an object the
decoder could have kept. The tests through a real Journal, reading the stored
rows back through its queries and through psycopg, are in
tests/integration/test_serialization.py.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import (
    DeserializationError,
    SerializationError,
    SerializerRegistry,
)
from journal.rows import rows_to_envelopes
from journal.serialization import JSON_SERIALIZER_ID, JsonSerializer, orjson_exact
from tests.support.serialization import (
    ORDER,
    Channel,
    Currency,
    Customer,
    Deposited,
    Invoice,
    Line,
    Money,
    OrderPlaced,
    OrderPlacedV1,
    OrderPlacedV2,
    Paid,
    Priority,
    Receipt,
    Renamed,
    a_payment,
    an_invoice,
    full_registry,
    registry,
    round_trip,
    v1_registry,
    v1_to_v2,
    v2_registry,
    v2_to_v3,
    v3_registry,
)

# -- pure round trips -----------------------------------------------------------


def test_nested_attrs_class_comes_back_as_its_class() -> None:
    paid = a_payment(12)
    back = round_trip(paid)
    assert back == paid
    assert type(back) is Paid and type(back.money) is Money
    assert type(back.money.currency) is Currency
    assert type(back.payment_id) is uuid.UUID and type(back.at) is datetime


def test_every_supported_type_round_trips_to_its_exact_type() -> None:
    invoice = an_invoice()
    back = round_trip(invoice)
    assert back == invoice
    assert [type(line) for line in back.lines] == [Line, Line]
    assert type(back.lines) is tuple and type(back.pair) is tuple
    assert type(back.lines[0].price) is Money and type(back.discount) is Money
    assert type(back.issued) is date and type(back.due) is datetime
    assert set(back.by_line) == {1, 2} and all(type(k) is int for k in back.by_line)
    assert all(type(v) is Money for v in back.by_line.values())
    assert type(back.tags) is frozenset and type(back.checksum) is bytes
    assert back.reference == 42 and type(back.reference) is int
    # Decimal equality ignores trailing zeros; the stored form must not
    assert [str(d) for d in back.by_name["apple"]] == ["0.35", "0.350"]

    with_str_reference = attrs.evolve(invoice, reference="INV-7", discount=None)
    again = round_trip(with_str_reference)
    assert again.reference == "INV-7" and again.discount is None


def test_attrs_inside_dataclass_inside_attrs() -> None:
    receipt = Receipt(an_invoice(), datetime(2024, 4, 1, 8, 0, tzinfo=UTC))
    back = round_trip(receipt)
    assert back == receipt
    assert type(back) is Receipt and type(back.invoice) is Invoice
    assert type(back.invoice.lines[1]) is Line and type(back.invoice.lines[1].price) is Money
    assert round_trip(Receipt(an_invoice())).printed_at is None


@pytest.mark.parametrize(
    "value",
    [
        Decimal("0.1"),
        Decimal("1.10"),
        Decimal("-0.000"),
        Decimal("12345678901234567890.123456789012345678901234567890"),
        Decimal("1E+3"),
        Decimal("NaN"),
    ],
    ids=str,
)
def test_decimal_is_stored_as_an_exact_string(value: Decimal) -> None:
    money = Money(value, Currency.EUR)
    stored = full_registry().serialize(money)
    assert json.loads(stored.payload)["amount"] == str(value)
    back = round_trip(money)
    assert str(back.amount) == str(value) and back.amount.as_tuple() == value.as_tuple()


@pytest.mark.parametrize(
    "at",
    [
        datetime(2024, 1, 1, 0, 0, tzinfo=UTC),
        datetime(2024, 6, 30, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-7))),
        datetime(2024, 3, 10, 12, 0, 0, 1, tzinfo=timezone(timedelta(hours=5, minutes=45))),
        datetime(2024, 7, 1, 9, 30, tzinfo=ZoneInfo("Europe/Berlin")),
    ],
    ids=str,
)
def test_aware_datetimes_keep_their_instant_and_offset(at: datetime) -> None:
    paid = attrs.evolve(a_payment(), at=at)
    stored = full_registry().serialize(paid)
    assert json.loads(stored.payload)["at"] == at.isoformat()
    back = round_trip(paid).at
    assert back == at and back.tzinfo is not None
    assert back.utcoffset() == at.utcoffset()
    assert back.replace(tzinfo=None) == at.replace(tzinfo=None)


def test_naive_datetime_stays_naive_and_unchanged() -> None:
    naive = datetime(2024, 12, 31, 23, 59, 59, 500)
    back = round_trip(attrs.evolve(an_invoice(), due=naive)).due
    assert back == naive and back.tzinfo is None


def test_enums_are_stored_by_value() -> None:
    stored = json.loads(full_registry().serialize(a_payment()).payload)
    assert (stored["money"]["currency"], stored["priority"], stored["channel"]) == (
        "EUR",
        2,
        "shop",
    )
    back = round_trip(a_payment())
    assert back.priority is Priority.HIGH and back.channel is Channel.SHOP
    assert back.money.currency is Currency.EUR


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -3, 2.5, "text", "", [], [1, "a", None], {}, {"a": {"b": [1.5, False]}}],
    ids=repr,
)
def test_plain_json_values_keep_the_empty_manifest(value: Any) -> None:
    stored = full_registry().serialize(value)
    assert (stored.serializer_id, stored.manifest) == (JSON_SERIALIZER_ID, "")
    back = round_trip(value)
    assert back == value and type(back) is type(value)


def test_wire_format_of_simple_classes_is_unchanged() -> None:
    """Rows written by the old `attrs.asdict`/`dataclasses.asdict` encoder still decode."""
    r = registry((Deposited, "bank.Deposited"), (Renamed, "test.Renamed"))
    stored = r.serialize(Deposited(25))
    assert (stored.manifest, stored.payload) == ("bank.Deposited", b'{"amount":25}')
    stored = r.serialize(Renamed("x", 2))
    assert (stored.manifest, stored.payload) == ("test.Renamed", b'{"title":"x","count":2}')
    assert r.deserialize(31, "bank.Deposited", b'{"amount": 40}') == Deposited(40)
    # unknown fields are ignored (tolerant reader), defaults fill missing optional ones
    assert r.deserialize(31, "test.Renamed", b'{"title":"t","gone":1}') == Renamed("t", 0)


def test_memoryview_payload_decodes() -> None:
    stored = full_registry().serialize(a_payment(3))
    back = full_registry().deserialize(31, stored.manifest, memoryview(stored.payload))  # type: ignore[arg-type]
    assert back == a_payment(3)


# -- strict reads and clear errors ------------------------------------------------


def paid_json(**changes: Any) -> bytes:
    doc = json.loads(full_registry().serialize(a_payment()).payload)
    for key, value in changes.items():
        if value is ...:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (paid_json(money=...), ["required field missing", "$.money"]),
        (paid_json(priority="2"), ["expected an integer, got str '2'", "$.priority"]),
        (paid_json(priority=2.9), ["expected an integer, got float 2.9", "$.priority"]),
        (paid_json(priority=7), ["$.priority", "Priority"]),
        (paid_json(channel=5), ["expected a string, got int 5", "$.channel"]),
        (paid_json(at="yesterday"), ["ISO 8601 datetime", "'yesterday'", "$.at"]),
        (paid_json(payment_id="not-a-uuid"), ["expected a UUID", "$.payment_id"]),
        (
            paid_json(money={"amount": 0.1, "currency": "EUR"}),
            ["decimal as a string, got float 0.1", "$.money.amount"],
        ),
        (
            paid_json(money={"amount": "1", "currency": "GBP"}),
            ["Currency", "$.money.currency"],
        ),
        (b"[1, 2]", ["expected a JSON object, got list"]),
        (b"{not json", ["not UTF-8 JSON"]),
        (b"\xff\xfe", ["not UTF-8 JSON"]),
    ],
    ids=[
        "missing",
        "str-for-int",
        "float-for-int",
        "bad-int-enum",
        "int-for-str",
        "bad-datetime",
        "bad-uuid",
        "float-decimal",
        "bad-enum",
        "not-object",
        "bad-json",
        "bad-utf8",
    ],
)
def test_structuring_failure_names_manifest_field_and_row(
    payload: bytes, expected: list[str]
) -> None:
    with pytest.raises(DeserializationError) as info:
        full_registry().deserialize(31, "test.Paid", payload, persistence_id="Pay|1", seq_nr=9)
    message = str(info.value)
    assert "'test.Paid'" in message
    assert (info.value.persistence_id, info.value.seq_nr) == ("Pay|1", 9)
    assert "seq_nr 9" in message
    for part in expected:
        assert part in message


def test_structuring_failure_in_a_nested_list_names_the_path() -> None:
    doc = json.loads(full_registry().serialize(an_invoice()).payload)
    doc["lines"][1]["quantity"] = "many"
    with pytest.raises(DeserializationError, match=r"\$\.lines\[1\]\.quantity"):
        full_registry().deserialize(31, "test.Invoice", json.dumps(doc).encode())
    doc = json.loads(full_registry().serialize(an_invoice()).payload)
    doc["by_line"] = {"one": doc["by_line"]["1"]}
    with pytest.raises(DeserializationError, match="by_line"):
        full_registry().deserialize(31, "test.Invoice", json.dumps(doc).encode())


def test_unknown_manifest_is_refused() -> None:
    with pytest.raises(
        DeserializationError, match=re.escape("unknown JSON manifest 'test.Nobody'")
    ):
        full_registry().deserialize(31, "test.Nobody", b"{}")
    with pytest.raises(
        DeserializationError, match=re.escape("unknown JSON manifest 'test.Nobody#2'")
    ):
        full_registry().deserialize(31, "test.Nobody#2", b"{}")
    with pytest.raises(
        DeserializationError, match=re.escape("unknown JSON manifest 'test.Paid#x'")
    ):
        full_registry().deserialize(31, "test.Paid#x", b"{}")


@attrs.frozen
class Measured:
    value: float


@attrs.frozen
class Holder:
    thing: Any


class Opaque:
    """Not attrs, not a dataclass, no hook: cattrs cannot read it."""


@attrs.frozen
class HoldsOpaque:
    thing: Opaque


def test_encoding_failure_names_the_type() -> None:
    r = registry((Measured, "test.Measured"), (Holder, "test.Holder"))
    with pytest.raises(SerializationError, match="Measured"):
        r.serialize(Measured(float("nan")))
    with pytest.raises(SerializationError, match="Holder"):
        r.serialize(Holder(object()))
    assert r.serialize(Measured(1.5)).payload == b'{"value":1.5}'


def test_field_type_without_a_hook_is_rejected_at_register() -> None:
    r = SerializerRegistry()
    with pytest.raises(SerializationError, match=r"HoldsOpaque.*Opaque"):
        r.register(HoldsOpaque, "test.HoldsOpaque")
    # hooks added to the serializer's converter before registering make it readable
    r.json.converter.register_unstructure_hook(Opaque, lambda _: "opaque")
    r.json.converter.register_structure_hook(Opaque, lambda _, __: Opaque())
    r.register(HoldsOpaque, "test.HoldsOpaque")
    stored = r.serialize(HoldsOpaque(Opaque()))
    assert stored.payload == b'{"thing":"opaque"}'
    assert type(r.deserialize(31, stored.manifest, stored.payload).thing) is Opaque


def test_register_rejects_bad_classes_and_names() -> None:
    r = SerializerRegistry()
    with pytest.raises(SerializationError, match="neither an attrs class nor a dataclass"):
        r.register(int, "test.int")
    with pytest.raises(SerializationError, match="must not contain '#'"):
        r.register(Deposited, "test.Deposited#2")
    with pytest.raises(SerializationError, match="must not contain '#'"):
        r.register(Deposited, "test.Deposited", aliases=("old#1",))
    for bad in (0, -1, True, 1.0):
        with pytest.raises(SerializationError, match="version"):
            r.register(Deposited, "test.Deposited", version=bad)  # type: ignore[arg-type]
    r.register(Deposited, "test.Deposited")
    with pytest.raises(SerializationError, match="already registered for Deposited"):
        r.register(Renamed, "test.Deposited")
    with pytest.raises(SerializationError, match="already registered for Deposited"):
        r.register(Renamed, "test.Renamed", aliases=("test.Deposited",))
    with pytest.raises(SerializationError, match="no serializer"):
        r.serialize(Renamed("x"))  # the failed registrations left nothing behind


def test_version_is_in_the_manifest_only_from_version_2() -> None:
    assert v1_registry().serialize(OrderPlacedV1(1250, "ann")).manifest == ORDER
    assert v2_registry().serialize(OrderPlacedV2(Decimal("12.50"), "ann")).manifest == ORDER + "#2"
    current = OrderPlaced(Money(Decimal("3.00"), Currency.USD), Customer("bo", True))
    stored = v3_registry().serialize(current)
    assert stored.manifest == ORDER + "#3"
    assert v3_registry().deserialize(31, stored.manifest, stored.payload) == current


def test_old_versions_are_upcast_to_the_current_class() -> None:
    old = v1_registry().serialize(OrderPlacedV1(1250, "ann"))
    middle = v2_registry().serialize(OrderPlacedV2(Decimal("7.5"), "bo"))
    reader = v3_registry()
    assert reader.deserialize(31, old.manifest, old.payload) == OrderPlaced(
        Money(Decimal("12.50"), Currency.EUR), Customer("ann", False)
    )
    assert str(reader.deserialize(31, old.manifest, old.payload).total.amount) == "12.50"
    assert reader.deserialize(31, middle.manifest, middle.payload) == OrderPlaced(
        Money(Decimal("7.5"), Currency.EUR), Customer("bo", False)
    )
    # version 2 reads version 1 too, and Pekko's explicit `#1` is version 1
    assert v2_registry().deserialize(31, old.manifest, old.payload) == OrderPlacedV2(
        Decimal("12.50"), "ann"
    )
    assert reader.deserialize(31, ORDER + "#1", old.payload).customer == Customer("ann", False)


def test_upcasters_run_once_each_in_order_from_the_stored_version() -> None:
    calls: list[str] = []

    def first(doc: dict[str, Any]) -> dict[str, Any]:
        calls.append("1->2")
        return v1_to_v2(doc)

    def second(doc: dict[str, Any]) -> dict[str, Any]:
        calls.append("2->3")
        return v2_to_v3(doc)

    r = SerializerRegistry()
    r.register(OrderPlaced, ORDER, version=3, upcasters={2: second, 1: first})
    r.deserialize(31, ORDER, b'{"total_cents":1,"customer":"c"}')
    assert calls == ["1->2", "2->3"]
    calls.clear()
    r.deserialize(31, ORDER + "#2", b'{"total":"1","customer":"c"}')
    assert calls == ["2->3"]
    calls.clear()
    r.deserialize(
        31,
        ORDER + "#3",
        r.serialize(OrderPlaced(Money(Decimal(1), Currency.EUR), Customer("c", True))).payload,
    )
    assert calls == []


@pytest.mark.parametrize(
    ("version", "upcasters", "match"),
    [
        (3, {1: v1_to_v2}, r"no upcaster for version\(s\) 2"),
        (3, {2: v2_to_v3}, r"no upcaster for version\(s\) 1"),
        (4, {}, r"no upcaster for version\(s\) 1, 2, 3"),
        (3, {1: v1_to_v2, 2: v2_to_v3, 3: v2_to_v3}, "upcaster key 3 .* out of range"),
        (1, {1: v1_to_v2}, "upcaster key 1 .* out of range"),
        (3, {0: v1_to_v2, 1: v1_to_v2, 2: v2_to_v3}, "upcaster key 0"),
        (2, {1: "not a function"}, "not callable"),
    ],
)
def test_incomplete_upcaster_chain_is_rejected_at_register(
    version: int, upcasters: dict[int, Any], match: str
) -> None:
    r = SerializerRegistry()
    with pytest.raises(SerializationError, match=match):
        r.register(OrderPlaced, ORDER, version=version, upcasters=upcasters)
    with pytest.raises(SerializationError, match="no serializer"):
        r.serialize(OrderPlaced(Money(Decimal(1), Currency.EUR), Customer("c", True)))


def test_payload_newer_than_the_registered_version_is_refused() -> None:
    stored = v3_registry().serialize(
        OrderPlaced(Money(Decimal("1"), Currency.EUR), Customer("c", True))
    )
    for old_reader, registered in ((v1_registry(), 1), (v2_registry(), 2)):
        with pytest.raises(DeserializationError) as info:
            old_reader.deserialize(
                31, stored.manifest, stored.payload, persistence_id="O|1", seq_nr=4
            )
        message = str(info.value)
        assert f"'{ORDER}#3'" in message
        assert f"version 3 of '{ORDER}'" in message
        assert f"newer than version {registered}" in message
        assert info.value.seq_nr == 4


def test_failing_upcaster_names_manifest_and_version() -> None:
    def broken(doc: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("price")

    r = SerializerRegistry()
    r.register(OrderPlaced, ORDER, version=3, upcasters={1: broken, 2: v2_to_v3})
    with pytest.raises(DeserializationError) as info:
        r.deserialize(
            31, ORDER, b'{"total_cents":1,"customer":"c"}', persistence_id="O|2", seq_nr=1
        )
    message = str(info.value)
    assert f"upcaster 1->2 of '{ORDER}'" in message
    assert f"manifest '{ORDER}'" in message and "stored at version 1" in message
    assert "KeyError" in message and "price" in message
    assert (info.value.persistence_id, info.value.seq_nr) == ("O|2", 1)

    def returns_nothing(doc: dict[str, Any]) -> Any:
        return None

    r = SerializerRegistry()
    r.register(OrderPlaced, ORDER, version=3, upcasters={1: v1_to_v2, 2: returns_nothing})
    with pytest.raises(DeserializationError, match="returned NoneType, not a dict"):
        r.deserialize(31, ORDER, b'{"total_cents":1,"customer":"c"}')


def test_upcast_payload_that_does_not_fit_names_the_upcast() -> None:
    r = SerializerRegistry()
    r.register(OrderPlaced, ORDER, version=2, upcasters={1: lambda d: d})
    with pytest.raises(DeserializationError) as info:
        r.deserialize(31, ORDER, b'{"total_cents":1,"customer":"c"}')
    message = str(info.value)
    assert "upcast from version 1 to 2" in message and "$.total" in message


def test_aliases_read_old_names_and_writes_use_the_new_one() -> None:
    old_name = "shop.OrderCreated"
    old = registry((OrderPlacedV1, old_name)).serialize(OrderPlacedV1(99, "cy"))
    assert old.manifest == old_name
    reader = v3_registry(aliases=(old_name, "legacy.Order"))
    assert reader.deserialize(31, old.manifest, old.payload) == OrderPlaced(
        Money(Decimal("0.99"), Currency.EUR), Customer("cy", False)
    )
    # aliases share the version numbering
    assert reader.deserialize(31, "legacy.Order#2", b'{"total":"5","customer":"d"}').total == Money(
        Decimal("5"), Currency.EUR
    )
    current = OrderPlaced(Money(Decimal("2"), Currency.EUR), Customer("cy", True))
    assert reader.serialize(current).manifest == ORDER + "#3"
    with pytest.raises(DeserializationError, match="newer than version 3"):
        reader.deserialize(31, old_name + "#4", b"{}")


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: beyond 64 bits too
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),  # lone surrogates included
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_payloads_decode_exactly_as_the_standard_library_reads_them(value: Any) -> None:
    """The fast decoder must never change a value: long integers stay exact, NaN and
    lone surrogates (which orjson rejects) still decode, as with `json.loads`."""
    data = json.dumps(value).encode("utf-8")
    decoded = JsonSerializer().from_bytes(data, "")
    assert json.dumps(decoded) == json.dumps(json.loads(data))


_encodable = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too: orjson refuses those
    | st.floats(allow_nan=True, allow_infinity=True)  # orjson writes NaN as null
    | st.text(),  # lone surrogates: orjson refuses them
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(), inner, max_size=4)
        # keys that are not str (the standard library writes them as text; orjson refuses)
        | st.dictionaries(st.integers() | st.booleans() | st.none(), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_encodable)
def test_payloads_encode_to_what_the_standard_library_writes_or_refuses(value: Any) -> None:
    """The fast encoder must write the same JSON value as `json.dumps` (compact, no NaN)
    and refuse exactly what it refuses."""
    standard = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
    try:
        expected = standard.encode(value)
    except ValueError:  # NaN or an infinity
        with pytest.raises(SerializationError, match="Out of range float"):
            JsonSerializer().to_bytes(value)
        return
    assert json.loads(JsonSerializer().to_bytes(value)) == json.loads(expected)


def test_values_the_standard_library_cannot_write_are_refused_alike() -> None:
    """Subclasses, dates, sets and dataclasses take the standard library's path: its
    result, or its error."""

    class Text(str):
        pass

    json_serializer = JsonSerializer()
    assert json_serializer.to_bytes({"t": Text("x")}) == b'{"t":"x"}'
    assert json_serializer.to_bytes({"n": 2**70}) == b'{"n":1180591620717411303424}'
    assert json_serializer.to_bytes({"s": "\ud800"}) == b'{"s":"\\ud800"}'
    assert json_serializer.to_bytes({"s": "d\u00e9j\u00e0"}) == '{"s":"déjà"}'.encode()
    for bad in ({"d": date(2024, 1, 1)}, {"s": {1, 2}}, {"b": b"x"}, {"x": float("nan")}):
        with pytest.raises(SerializationError, match="cannot encode dict as JSON"):
            json_serializer.to_bytes(bad)


def test_a_uuid_and_an_enum_in_a_plain_event_are_written_as_text_and_value() -> None:
    class Colour(enum.Enum):
        RED = "red"

    key = uuid.UUID(int=1)
    written = JsonSerializer().to_bytes({"id": key, "colour": Colour.RED, "n": [Colour.RED]})
    assert json.loads(written) == {"id": str(key), "colour": "red", "n": ["red"]}


def _journal_row(seq_nr: int, payload: bytes) -> tuple[Any, ...]:
    ts = datetime(2024, 5, 1, tzinfo=UTC)
    return ("A|1", "A", 7, seq_nr, ts, "w", None, 31, "", None, None, None, payload, ts)


@settings(max_examples=200, deadline=None)
@given(st.lists(_json_values, min_size=1, max_size=8))
def test_a_batch_of_rows_decodes_each_payload_exactly_as_the_standard_library(
    values: list[Any],
) -> None:
    """The row decoder checks a batch at once and hands its plain JSON to orjson: one long
    integer anywhere in the batch sends it back to the exact path, and nothing else
    changes a value (a run of digits split across two payloads is not a long one)."""
    payloads = [json.dumps(v).encode("utf-8") for v in values]
    rows = [(_journal_row(i + 1, p), None) for i, p in enumerate(payloads)]
    envelopes = rows_to_envelopes(rows, SerializerRegistry(), source="query")
    assert [json.dumps(e.event) for e in envelopes] == [json.dumps(json.loads(p)) for p in payloads]


def test_a_long_integer_in_a_batch_is_found_wherever_it_is() -> None:
    long_one = b'{"n": %d}' % (2**70)
    assert orjson_exact([b'{"n": 1}', b"1234567890", b"123456789"])
    assert not orjson_exact([b'{"n": 1}', long_one])
    assert not orjson_exact([long_one, b'{"n": 1}'])
    rows = [(_journal_row(1, b'{"n": 1}'), None), (_journal_row(2, long_one), None)]
    envelopes = rows_to_envelopes(rows, SerializerRegistry(), source="query")
    assert envelopes[1].event == {"n": 2**70}


class _Odd:
    """A type only the serializer below handles."""


class _OddSerializer:
    """A user serializer whose `to_bytes` returns whatever it was built with."""

    id = 4242

    def __init__(self, result: object) -> None:
        self.result = result

    def manifest(self, value: Any) -> str:
        return "odd"

    def to_bytes(self, value: Any) -> Any:
        return self.result

    def from_bytes(self, data: bytes, manifest: str) -> Any:
        return data


@pytest.mark.parametrize("result", [12345, "text", None, [1, 2]])
def test_a_serializer_that_returns_no_bytes_is_refused_naming_it(result: object) -> None:
    registry = SerializerRegistry()
    registry.add(_OddSerializer(result), for_types=(_Odd,))
    with pytest.raises(SerializationError, match=r"_OddSerializer \(id 4242\) returned .* bytes"):
        registry.serialize(_Odd())


class _Frozen(bytes):
    """A subclass of bytes, as some libraries return."""


@pytest.mark.parametrize(
    "result", [bytearray(b"\x00ab"), memoryview(b"\x00ab"), _Frozen(b"\x00ab")]
)
def test_a_serializers_bytes_like_result_is_taken_as_bytes(result: object) -> None:
    registry = SerializerRegistry()
    registry.add(_OddSerializer(result), for_types=(_Odd,))
    payload = registry.serialize(_Odd())
    assert type(payload.payload) is bytes and payload.payload == b"\x00ab"

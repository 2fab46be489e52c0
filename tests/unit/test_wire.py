"""The binary parameters of statements run through libpq (`journal/wire.py`)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from journal.wire import (
    BYTEA,
    BYTEA_ARRAY,
    INT4,
    INT4_ARRAY,
    INT4_OID,
    INT8,
    INT8_ARRAY,
    INT8_OID,
    TEXT,
    TEXT_ARRAY,
    TEXT_ARRAY_OID,
    TEXT_OID,
    WireStatement,
    timestamptz,
)


def statement() -> WireStatement:
    return WireStatement.of(
        "SELECT $1, $2, $3, $4, $5",
        ("n", "big", "s", "b", "tags"),
        {"n": INT4, "big": INT8, "s": TEXT, "b": BYTEA, "tags": TEXT_ARRAY},
        (),
    )


def decode_text_array(data: bytes) -> list[str]:
    ndim, nulls, oid, length, lower = struct.unpack_from(">iiiii", data)
    assert (ndim, nulls, oid, lower) == (1, 0, TEXT_OID, 1)
    items, at = [], 20
    for _ in range(length):
        (size,) = struct.unpack_from(">i", data, at)
        items.append(data[at + 4 : at + 4 + size].decode("utf-8"))
        at += 4 + size
    assert at == len(data)
    return items


def test_each_value_is_written_in_its_types_binary_format() -> None:
    encoded = statement().encode([-7, 2**63 - 1, 'é"{,}', b"\x00\xff", ["a b", "c"]])
    assert encoded is not None
    assert encoded[0] == struct.pack(">i", -7)
    assert encoded[1] == struct.pack(">q", 2**63 - 1)
    assert encoded[2] == 'é"{,}'.encode()
    assert encoded[3] == b"\x00\xff"
    assert decode_text_array(encoded[4] or b"") == ["a b", "c"]


def test_none_is_null() -> None:
    assert statement().encode([None] * 5) == [None] * 5


@given(st.lists(st.text(min_size=1), max_size=5))
def test_text_arrays_round_trip(tags: list[str]) -> None:
    encoded = statement().encode([1, 1, "", b"", tags])
    assert encoded is not None
    assert decode_text_array(encoded[4] or b"") == tags


def test_a_value_that_does_not_fit_its_type_makes_the_caller_fall_back() -> None:
    fits = [1, 1, "s", b"b", []]
    assert statement().encode(fits) is not None
    misfits = [(0, 2**31), (1, 2**63), (0, 1.5), (2, "\ud800"), (2, b"bytes"), (3, 5), (4, [1])]
    for at, misfit in misfits:
        values = list(fits)
        values[at] = misfit
        assert statement().encode(values) is None, (at, misfit)


def test_the_statement_is_named_by_its_text_and_typed() -> None:
    a, b = statement(), statement()
    assert a.name == b.name and a.name.startswith(b"slicejournal_")
    other = WireStatement.of("SELECT $1", ("s",), {"s": TEXT}, ())
    assert other.name != a.name
    # the same text with other parameter types is another prepared statement
    assert WireStatement.of("SELECT $1", ("s",), {"s": BYTEA}, ()).name != other.name
    assert a.oids == (23, 20, 25, 17, TEXT_ARRAY_OID)


@given(st.integers(min_value=-(2**62), max_value=2**62))
def test_timestamptz_is_microseconds_since_2000_in_utc(micros: int) -> None:
    try:
        expected = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    except OverflowError:
        return
    decoded = timestamptz(struct.pack(">q", micros))
    assert decoded == expected and decoded.tzinfo is UTC
    berlin = ZoneInfo("Europe/Berlin")
    try:
        in_berlin = timestamptz(struct.pack(">q", micros), berlin)
    except OverflowError:
        return
    assert in_berlin == expected and in_berlin.tzinfo is berlin


def decode_array(data: bytes, element_oid: int, size: int | None) -> list[object]:
    """A one-dimensional binary array: ints of `size` bytes, or bytes (size None)."""
    ndim, nulls, oid, length, lower = struct.unpack_from(">iiiii", data)
    assert (ndim, oid, lower) == (1, element_oid, 1)
    items: list[object] = []
    at = 20
    for _ in range(length):
        (width,) = struct.unpack_from(">i", data, at)
        at += 4
        if width == -1:
            items.append(None)
            continue
        value = data[at : at + width]
        if size is not None:
            assert width == size
            items.append(int.from_bytes(value, "big", signed=True))
        else:
            items.append(value)
        at += width
    assert at == len(data)
    assert nulls == (None in items)
    return items


@given(st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), max_size=40))
def test_int4_arrays_round_trip_with_nulls(values: list[int | None]) -> None:
    assert decode_array(INT4_ARRAY.encode(values), INT4_OID, 4) == values


@given(st.lists(st.none() | st.integers(-(2**63), 2**63 - 1), max_size=40))
def test_int8_arrays_round_trip_with_nulls(values: list[int | None]) -> None:
    assert decode_array(INT8_ARRAY.encode(values), INT8_OID, 8) == values


@given(st.lists(st.none() | st.binary(max_size=20), max_size=10))
def test_bytea_arrays_round_trip_with_nulls(values: list[bytes | None]) -> None:
    assert decode_array(BYTEA_ARRAY.encode(values), 17, None) == values


def test_an_int_outside_its_array_type_makes_the_caller_fall_back() -> None:
    wire = WireStatement.of("SELECT $1", ("a",), {"a": INT4_ARRAY}, ())
    assert wire.encode([[1, 2**31]]) is None
    assert wire.encode([[1, None, 2**31]]) is None
    assert wire.encode(["12"]) is None  # a str is not an array

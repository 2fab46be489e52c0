"""A statement in PostgreSQL's wire terms: a name, parameter types and binary values.

Why: an append is one short statement, and through psycopg's cursor about half
of the client's CPU for it goes to the cursor's own bookkeeping (a cursor and an
adapters map per call, the query's dumping, the prepared-statement manager's
lookup), not to libpq. Measured on 2 cores: a one-parameter `SELECT` through an
`AsyncRawCursor` costs 91-110 µs of client CPU, the same prepared statement sent
with libpq's own calls 48-49 µs. The append's statements are few and fixed, and
their parameters are a handful of known types, so this module describes each
once: its name for the session's prepared statements, the type of each
parameter, and how each value is written in the binary format. The driver
(`journal/aio/prepared.py`) prepares it once per connection and runs it.

A value that does not fit its type (an int beyond the type's range, a str that
is not valid UTF-8) makes `encode` return None; the caller then runs the
statement through psycopg as before, which reports the problem as it always did.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Final

import attrs
from psycopg import pq, sql

from journal.tables import rendered

# Type OIDs (pg_type), fixed since PostgreSQL 7.
INT4_OID: Final = 23
INT8_OID: Final = 20
TEXT_OID: Final = 25
BYTEA_OID: Final = 17
TEXT_ARRAY_OID: Final = 1009
INT4_ARRAY_OID: Final = 1007
INT8_ARRAY_OID: Final = 1016
BYTEA_ARRAY_OID: Final = 1001

_INT4: Final = struct.Struct(">i")
_INT8: Final = struct.Struct(">q")
_ARRAY_HEADER: Final = struct.Struct(">iiiii")  # ndim, has nulls, element type, length, lower bound
_LENGTH: Final = _INT4
_NULL: Final = _LENGTH.pack(-1)  # an array element's length when it is NULL


def _text(value: str) -> bytes:
    # A binary `text` value is its bytes in the client encoding (`prepared.py` runs a
    # statement this way only on a UTF8 session); the server rejects NUL and bad UTF-8.
    return value.encode("utf-8")


def _bytea(value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):  # `bytes(5)` is 5 zero bytes
        raise TypeError(f"not bytes: {type(value).__name__}")
    return bytes(value)


def _array(element_oid: int, encode: Callable[[Any], bytes]) -> Callable[[Sequence[Any]], bytes]:
    """The encoder of a one-dimensional array of `element_oid` in the binary array format,
    its elements written by `encode` (a None element is NULL)."""
    pack_length = _LENGTH.pack

    def encode_array(value: Sequence[Any]) -> bytes:
        if isinstance(value, str | bytes):  # a sequence, but not of elements
            raise TypeError(f"not an array: {type(value).__name__}")
        parts = [b""]
        add = parts.append
        nulls = 0
        for item in value:
            if item is None:
                nulls = 1
                add(_NULL)
            else:
                data = encode(item)
                add(pack_length(len(data)))
                add(data)
        parts[0] = _ARRAY_HEADER.pack(1, nulls, element_oid, len(value), 1)
        return b"".join(parts)

    return encode_array


# Arrays of up to this many fixed-size elements are packed in one `Struct.pack`; up to
# `_CACHED_ARRAY_LENGTH` (a group's usual sizes) with the `Struct` kept.
_PACKED_ARRAY_LENGTH: Final = 1024
_CACHED_ARRAY_LENGTH: Final = 64


def _fixed_array(element_oid: int, code: str) -> Callable[[Sequence[Any]], bytes]:
    """The encoder of a one-dimensional array of a fixed-size type (`code`: its `struct`
    format letter): without NULLs, header, lengths and values in one `pack` (a group's
    arrays are most of what it costs the client beyond its statement)."""
    size = struct.calcsize(">" + code)
    pack_one = struct.Struct(">" + code).pack
    one_by_one = _array(element_oid, pack_one)
    formats: dict[int, Callable[..., bytes]] = {}

    def encode_array(value: Sequence[Any]) -> bytes:
        count = len(value)
        if count > _PACKED_ARRAY_LENGTH or None in value or isinstance(value, str | bytes):
            return one_by_one(value)
        pack = formats.get(count)
        if pack is None:
            pack = struct.Struct(">5i" + ("i" + code) * count).pack
            if count <= _CACHED_ARRAY_LENGTH:
                formats[count] = pack
        values: list[Any] = [1, 0, element_oid, count, 1]
        for item in value:
            values.append(size)
            values.append(item)
        return pack(*values)

    return encode_array


def _unpack_int(format: struct.Struct) -> Callable[[bytes, tzinfo], int]:
    def decode(data: bytes, zone: tzinfo) -> int:
        value: int = format.unpack(data)[0]
        return value

    return decode


_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)


def timestamptz(data: bytes, zone: tzinfo = UTC) -> datetime:
    """A binary `timestamptz` (microseconds since 2000-01-01 UTC) in the time zone
    `zone`: psycopg reads one in its session's (`ConnectionInfo.timezone`)."""
    utc = _PG_EPOCH + timedelta(microseconds=_INT8.unpack(data)[0])
    return utc if zone is UTC else utc.astimezone(zone)


def _unwritable(value: Any) -> bytes:
    raise NotImplementedError("this type is read, never written, through the wire path")


def _unreadable(data: bytes, zone: tzinfo) -> Any:
    raise NotImplementedError("this type is written, never read, through the wire path")


@attrs.frozen
class WireType:
    """A type: its OID, and how a Python value is written in (`encode`) and read from
    (`decode`) the binary format."""

    oid: int
    encode: Callable[[Any], bytes]
    # The value from its bytes and the session's time zone (which only timestamps use).
    decode: Callable[[bytes, tzinfo], Any] = _unreadable


INT4: Final = WireType(INT4_OID, _INT4.pack, _unpack_int(_INT4))
INT8: Final = WireType(INT8_OID, _INT8.pack, _unpack_int(_INT8))
TEXT: Final = WireType(TEXT_OID, _text)
BYTEA: Final = WireType(BYTEA_OID, _bytea)
TEXT_ARRAY: Final = WireType(TEXT_ARRAY_OID, _array(TEXT_OID, _text))
INT4_ARRAY: Final = WireType(INT4_ARRAY_OID, _fixed_array(INT4_OID, "i"))
INT8_ARRAY: Final = WireType(INT8_ARRAY_OID, _fixed_array(INT8_OID, "q"))
BYTEA_ARRAY: Final = WireType(BYTEA_ARRAY_OID, _array(BYTEA_OID, _bytea))
TIMESTAMPTZ: Final = WireType(1184, _unwritable, timestamptz)

# Errors a value that does not fit its type raises while being encoded.
_MISFITS: Final = (struct.error, UnicodeEncodeError, TypeError, AttributeError, ValueError)


@attrs.frozen
class WireStatement:
    """A statement with numbered placeholders (`$1`), its parameters' types, the types of
    the result's leading columns that are read, and the name it is prepared under
    (derived from its text, so equal statements share it)."""

    name: bytes
    text: bytes
    oids: tuple[int, ...]
    encoders: tuple[Callable[[Any], bytes], ...]
    formats: tuple[pq.Format, ...]  # every parameter's: binary
    decoders: tuple[Callable[[bytes, tzinfo], Any], ...]

    @classmethod
    def of(
        cls,
        text: str,
        names: Sequence[str],
        types: Mapping[str, WireType],
        returns: Sequence[WireType],
    ) -> WireStatement:
        """The statement `text` whose parameters `names` (in order) have these `types`, and
        whose result's first columns are of the types `returns`. Its name is a hash of the
        text and the parameter types: what the server prepares under it."""
        wire = [types[name] for name in names]
        signature = f"{text}\x00{','.join(str(w.oid) for w in wire)}"
        digest = hashlib.sha1(signature.encode("utf-8"), usedforsecurity=False).hexdigest()[:24]
        return cls(
            name=f"slicejournal_{digest}".encode("ascii"),
            text=text.encode("utf-8"),
            oids=tuple(w.oid for w in wire),
            encoders=tuple(w.encode for w in wire),
            formats=(pq.Format.BINARY,) * len(wire),
            decoders=tuple(r.decode for r in returns),
        )

    def encode(self, values: Sequence[Any]) -> list[bytes | None] | None:
        """Each value in the binary format (None stays NULL); None if one does not fit."""
        try:
            return [
                None if value is None else encode(value)
                for encode, value in zip(self.encoders, values, strict=True)
            ]
        except _MISFITS:
            return None

    def first_row(self, result: pq.abc.PGresult, zone: tzinfo) -> tuple[Any, ...] | None:
        """The leading columns of the result's first row (binary), timestamps in the
        session's time zone `zone`, as psycopg reads them; None without a row."""
        return None if result.ntuples == 0 else self._row(result, 0, zone)

    def rows(self, result: pq.abc.PGresult, zone: tzinfo) -> list[tuple[Any, ...]]:
        """The leading columns of every row of the result, as `first_row` reads one."""
        return [self._row(result, row, zone) for row in range(result.ntuples)]

    def _row(self, result: pq.abc.PGresult, row: int, zone: tzinfo) -> tuple[Any, ...]:
        values = (result.get_value(row, i) for i in range(len(self.decoders)))
        return tuple(
            None if data is None else decode(data, zone)
            for decode, data in zip(self.decoders, values, strict=True)
        )


_NAMED: Final = re.compile(r"%\((\w+)\)b")


@attrs.frozen
class Positional:
    """A statement written with `%(name)b` placeholders, as PostgreSQL numbers them
    (`$1`, `$2`, ...; a name used twice is one number): run it with a raw cursor
    and `values`, or, where its parameters' types are given, as `wire` through libpq
    (`journal/aio/prepared.py`)."""

    text: str
    names: tuple[str, ...]
    wire: WireStatement | None = None

    @classmethod
    def of(
        cls,
        statement: sql.Composable,
        types: Mapping[str, WireType] | None = None,
        returns: Sequence[WireType] = (),
    ) -> Positional:
        """The statement, with a `wire` form if `types` (by placeholder name) are given;
        `returns`: the types of its result's first columns, those `first_row` reads."""
        text = rendered(statement)
        names = tuple(dict.fromkeys(_NAMED.findall(text)))
        numbers = {name: f"${i}" for i, name in enumerate(names, start=1)}
        numbered = _NAMED.sub(lambda m: numbers[m.group(1)], text)
        wire = None if types is None else WireStatement.of(numbered, names, types, returns)
        return cls(numbered, names, wire)

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        """The parameters in the statement's order."""
        return [params[name] for name in self.names]

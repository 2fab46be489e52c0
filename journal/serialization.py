"""Turning events, snapshots and metadata into bytes and back.

Each stored payload carries a serializer id and a manifest, as in Pekko, so a
reader can pick the right decoder without guessing and a JVM service sharing
the journal can do the same. Serializing happens in the caller's task, before
any transaction opens, so a value that cannot be serialized never leaves a
half-written batch behind.

JSON payloads of registered classes
-----------------------------------
A registered attrs class or dataclass is written as one flat JSON object of its
fields (attribute names as keys, in definition order), converted by one
`cattrs.Converter` per `JsonSerializer`. Nested attrs classes and dataclasses
become nested objects and come back as their classes; `datetime` is ISO 8601
(with its UTC offset when it has one, without when it is naive, so it comes back
as written), `date` ISO 8601, `UUID` its canonical string, `Decimal` a string
(exact: `Decimal("1.10")` comes back as `Decimal("1.10")`), `bytes` standard
base64, enums their value, tuples and sets JSON arrays, dicts JSON objects
(`int` keys are read back as ints). Reading is strict about types (a string
where an int is declared is an error, not a silent `int("5")`) and tolerant of
unknown fields, which are ignored, as Pekko's Jackson setup does.

Manifests and versions
----------------------
The manifest is the registered name, exactly as before versions existed, while
a class is at version 1. From version 2 on it is `name#N` (`N` a decimal
integer, no padding): this is the manifest Pekko's `JacksonSerializer` writes
for a class with a `JacksonMigration`, and it reads it back by splitting at the
last `#`, so a JVM service reading the same journal understands it, and rows
written at version 1 keep their plain name. On read, `name` and `name#1` are
version 1. A payload stored at version k below the registered version n is run
through upcasters k, k+1, ..., n-1 (each turns the decoded JSON object of one
version into the next) and then structured into the registered class; a
payload newer than the registered version is refused, never guessed at.
Aliases (old names of a renamed event) share the name's version numbering.
Names may not contain `#`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from collections.abc import Set as AbstractSet
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Final, Protocol, TypeAlias, Union, get_args, get_origin, runtime_checkable
from uuid import UUID

import attrs
import cattrs
import orjson
from cattrs.cols import is_mapping, mapping_structure_factory
from cattrs.strategies import configure_union_passthrough
from cattrs.v import format_exception

from journal.errors import DeserializationError, SerializationError
from journal.model import SerializedPayload

# One encoder for all events: json.dumps with options builds a new one per call.
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# orjson writes what `_ENCODER` accepts 10-15x faster (3-6 us an event here). What it
# would write differently goes to `_ENCODER` instead: subclasses of str, int, dict and
# list (`OrderedDict`, a named tuple), dates and dataclasses reach `_refuse`, and
# orjson rejects integers beyond 64 bits, keys that are not str and lone surrogates.
_ORJSON_OPTIONS: Final = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
# A run of 19 digits may be an integer beyond 64 bits, which orjson reads as a
# float; the standard library keeps it exact.
_LONG_NUMBER: Final = re.compile(rb"\d{19}")
_DIGITS: Final = b"0123456789"
# The range of the `*_ser_id` columns (INTEGER).
_MIN_INT4: Final = -(2**31)
_MAX_INT4: Final = 2**31 - 1


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


def _dumps(fields: Any) -> bytes:
    """Compact JSON, as `_ENCODER` writes it or raises for it (UTF-8 where it escapes
    non-ASCII text: the same JSON value).

    orjson writes NaN and infinities as `null`, which `_ENCODER` refuses: output
    holding a `null` is written again by `_ENCODER`, which raises for them. orjson
    also writes UUIDs (as their text) and enum members (as their value), which the
    standard library cannot."""
    try:
        data = orjson.dumps(fields, default=_refuse, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError included
        pass
    else:
        if b"null" not in data:
            return data
    return _ENCODER.encode(fields).encode("utf-8")


def _loads(data: bytes) -> Any:
    """Parse JSON exactly as `json.loads` does, with orjson's speed where that is safe.

    Decoding runs once per event of every catch-up, and orjson parses a small
    payload about eight times faster. Where the two could differ (integers too
    long for 64 bits, NaN, lone surrogates, which orjson rejects), the standard
    library decides.
    """
    if type(data) is not bytes:  # bytearray, memoryview
        data = bytes(data)
    # Fewer than 19 digits in all cannot make a run of 19: counting them is a
    # quarter of the regex search's cost on a typical event.
    if len(data) - len(data.translate(None, _DIGITS)) < 19 or _LONG_NUMBER.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(bytes(data).decode("utf-8"))


# Every digit read as '9', everything else as ' ': a run of 19 digits is then a substring.
_DIGIT_RUNS: Final = bytes(0x39 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN: Final = b"9" * 19


def orjson_exact(payloads: list[bytes]) -> bool:
    """Whether orjson reads every one of these JSON payloads exactly as `json.loads` does,
    as far as numbers go: no payload holds a run of 19 digits (an integer that may be
    beyond 64 bits, which orjson reads as a float).

    `_loads` checks each payload by itself; this checks a batch with one pass over
    its bytes, a quarter of the cost per payload, so that a row decoder can call
    `orjson.loads` straight away (its errors still go to `json.loads`). A space
    between payloads keeps a run from spanning two of them.
    """
    return _LONG_RUN not in b" ".join(payloads).translate(_DIGIT_RUNS)


def is_plain_json(decode: Callable[[bytes], Any] | None) -> bool:
    """Whether `SerializerRegistry.decoder` returned the plain-JSON decoder (`_loads`),
    which `orjson.loads` may stand in for on payloads `orjson_exact` accepted."""
    return decode is _loads


BYTES_SERIALIZER_ID: Final = 4  # Pekko's ByteArraySerializer
JSON_SERIALIZER_ID: Final = 31  # the id Pekko gives its Jackson JSON serializer

_MAX_DECODERS: Final = 1024  # (serializer id, manifest) pairs SerializerRegistry.decoder keeps
_MAX_PROBLEMS: Final = 8  # structuring problems listed in one DeserializationError

Upcaster: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns the decoded JSON object of version n of an event into its version n+1 shape."""


@runtime_checkable
class Serializer(Protocol):
    """Encodes values to bytes under a stable id; the manifest says which type to rebuild."""

    @property
    def id(self) -> int:
        """Stored in `*_ser_id`; must never change for data already written."""
        ...

    def manifest(self, value: Any) -> str:
        """A stable name for the value's type (stored in `*_ser_manifest`)."""
        ...

    def to_bytes(self, value: Any) -> bytes:
        """Encode the value as `bytes` (a `bytearray` or `memoryview` is copied; any
        other type is refused with `SerializationError` before anything is written)."""
        ...

    def from_bytes(self, data: bytes, manifest: str) -> Any:
        """Decode bytes written by `to_bytes` for a value with this manifest."""
        ...


class BytesSerializer:
    """Passes `bytes` through unchanged."""

    id = BYTES_SERIALIZER_ID

    def manifest(self, value: Any) -> str:
        """Always the empty manifest: bytes need no type to be rebuilt."""
        return ""

    def to_bytes(self, value: Any) -> bytes:
        """The value's bytes, unchanged."""
        return bytes(value)

    def from_bytes(self, data: bytes, manifest: str) -> Any:
        """The stored bytes, unchanged."""
        return bytes(data)


@attrs.frozen
class _Registration:
    cls: type
    name: str
    version: int
    manifest: str  # what the writer stores: `name` at version 1, else `name#version`
    upcasters: tuple[Upcaster, ...]  # upcasters[n - 1] turns version n into n + 1
    unstructure: Callable[[Any], Any]
    structure: Callable[[Any, Any], Any]


class JsonSerializer:
    """JSON for plain values and for registered attrs classes / dataclasses.

    Plain JSON values (dict, list, str, int, float, bool, None) get the empty
    manifest; inside them a `uuid.UUID` is written as its text and an enum member
    as its value, and NaN or an infinity is refused. A class must be registered
    under a stable name, which becomes its manifest, so renaming or moving the
    Python class does not orphan old events.
    See the module docstring for the supported field types and the manifest format.
    """

    id = JSON_SERIALIZER_ID

    def __init__(self) -> None:
        self._converter = _make_converter()
        self._by_type: dict[type, _Registration] = {}
        self._by_name: dict[str, _Registration] = {}  # names and aliases
        # Every manifest a registration can read, precomputed (`name`, `name#1` ...
        # `name#version`, the same for each alias), so decoding a row is one dict
        # lookup and never parses the manifest; only unknown manifests are parsed.
        self._readers: dict[str, tuple[_Registration, int]] = {}

    @property
    def converter(self) -> cattrs.Converter:
        """The cattrs converter; add hooks for your own field types before `register`."""
        return self._converter

    def register(
        self,
        cls: type,
        name: str | None = None,
        *,
        version: int = 1,
        upcasters: Mapping[int, Upcaster] | None = None,
        aliases: Iterable[str] = (),
    ) -> None:
        """Register an attrs class or dataclass under a stable manifest name.

        `version` is the version of the event's shape that `cls` has; from 2 on
        it is written into the manifest as `name#version`. `upcasters[n]` turns a
        version-n payload (the decoded JSON object) into the version-(n+1) shape
        and must exist for every n in 1..version-1. `aliases` are older names
        whose events are still read into `cls`; events are written under `name`.
        Raises `SerializationError` for a bad class, name, version or upcaster
        chain, or a name already taken by another class.
        """
        if not (attrs.has(cls) or dataclasses.is_dataclass(cls)):
            raise SerializationError(
                f"{cls.__qualname__} is neither an attrs class nor a dataclass"
            )
        name = name or f"{cls.__module__}.{cls.__qualname__}"
        names = list(dict.fromkeys((name, *aliases)))
        for n in names:
            if not isinstance(n, str) or not n:
                raise SerializationError(f"manifest name {n!r} must be a non-empty string")
            if "#" in n:
                raise SerializationError(
                    f"manifest name {n!r} must not contain '#': it separates the version"
                )
            existing = self._by_name.get(n)
            if existing is not None and existing.cls is not cls:
                raise SerializationError(
                    f"manifest {n!r} is already registered for {existing.cls.__qualname__}"
                )
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise SerializationError(
                f"version of {cls.__qualname__} ({name!r}) must be an int >= 1, got {version!r}"
            )
        chain = _upcaster_chain(cls, name, version, upcasters or {})
        try:
            unstructure = self._converter.get_unstructure_hook(cls)
            structure = self._converter.get_structure_hook(cls)
        except Exception as e:
            raise SerializationError(
                f"cannot build a JSON converter for {cls.__qualname__} ({name!r}): "
                f"{type(e).__name__}: {e}"
            ) from e
        reg = _Registration(
            cls=cls,
            name=name,
            version=version,
            manifest=name if version == 1 else f"{name}#{version}",
            upcasters=chain,
            unstructure=unstructure,
            structure=structure,
        )
        self._by_type[cls] = reg
        for n in names:
            previous = self._by_name.get(n)
            if previous is not None:
                for v in range(1, previous.version + 1):
                    self._readers.pop(f"{n}#{v}", None)
            self._by_name[n] = reg
            self._readers[n] = (reg, 1)
            for v in range(1, version + 1):
                self._readers[f"{n}#{v}"] = (reg, v)

    def handles(self, value: Any) -> bool:
        """Whether `value` is a registered class instance or a plain JSON value."""
        return type(value) in self._by_type or _is_plain_json(value)

    def manifest(self, value: Any) -> str:
        """`name` (`name#version` from version 2) for a registered class, else `""`."""
        reg = self._by_type.get(type(value))
        return "" if reg is None else reg.manifest

    def to_bytes(self, value: Any) -> bytes:
        """Compact UTF-8 JSON; raises `SerializationError` naming the value's type."""
        reg = self._by_type.get(type(value))
        try:
            fields = value if reg is None else reg.unstructure(value)
            return _dumps(fields)
        except Exception as e:
            raise SerializationError(
                f"cannot encode {type(value).__qualname__} as JSON: {type(e).__name__}: {e}"
            ) from e

    def from_bytes(self, data: bytes, manifest: str) -> Any:
        """Decode a payload, upcasting it first if it was stored at an older version.

        Raises `DeserializationError` naming the manifest for invalid JSON, an
        unknown manifest, a version newer than the registered one, a failing
        upcaster, or fields that do not fit the class.
        """
        try:
            decoded = _loads(data)
        except ValueError as e:
            raise DeserializationError(
                f"payload with manifest {manifest!r} is not UTF-8 JSON: {e}"
            ) from e
        if not manifest:
            return decoded
        entry = self._readers.get(manifest)
        if entry is None:
            entry = self._resolve_unlisted(manifest)
        reg, stored = entry
        if stored < reg.version:
            decoded = _upcast(reg, manifest, stored, decoded)
        upcast = f" (upcast from version {stored} to {reg.version})" if stored < reg.version else ""
        if not isinstance(decoded, dict):
            raise DeserializationError(
                f"cannot read manifest {manifest!r} as {reg.cls.__qualname__}{upcast}: "
                f"expected a JSON object, got {type(decoded).__name__}"
            )
        try:
            return reg.structure(decoded, reg.cls)
        except Exception as e:
            found = cattrs.transform_error(e, format_exception=_format_exception)
            problems = "; ".join(found[:_MAX_PROBLEMS])
            if len(found) > _MAX_PROBLEMS:
                problems += f"; and {len(found) - _MAX_PROBLEMS} more"
            raise DeserializationError(
                f"cannot read manifest {manifest!r} as {reg.cls.__qualname__}{upcast}: {problems}"
            ) from e

    def _resolve_unlisted(self, manifest: str) -> tuple[_Registration, int]:
        """The slow path for a manifest not precomputed: a newer version, `#03`, or unknown."""
        name, sep, suffix = manifest.rpartition("#")
        reg = self._by_name.get(name) if sep else None
        if reg is None or not (suffix.isascii() and suffix.isdigit()):
            raise DeserializationError(f"unknown JSON manifest {manifest!r}")
        stored = int(suffix)
        if stored > reg.version:
            raise DeserializationError(
                f"manifest {manifest!r} is version {stored} of {name!r}, newer than version "
                f"{reg.version} registered here for {reg.cls.__qualname__}; deploy the newer "
                "event class (and its upcasters) before reading these events"
            )
        if stored < 1:
            raise DeserializationError(
                f"manifest {manifest!r} names version {stored} of {name!r}; versions start at 1"
            )
        return reg, stored


def _upcaster_chain(
    cls: type, name: str, version: int, upcasters: Mapping[int, Upcaster]
) -> tuple[Upcaster, ...]:
    """Validate that upcasters cover 1..version-1 exactly; return them in order."""
    for n, fn in upcasters.items():
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < version:
            raise SerializationError(
                f"upcaster key {n!r} for {cls.__qualname__} ({name!r}) is out of range: at "
                f"version {version}, upcasters[n] must exist for n in 1..{version - 1} "
                "(upcasters[n] turns a version-n payload into version n+1)"
            )
        if not callable(fn):
            raise SerializationError(
                f"upcaster {n} for {cls.__qualname__} ({name!r}) is not callable: {fn!r}"
            )
    missing = [n for n in range(1, version) if n not in upcasters]
    if missing:
        raise SerializationError(
            f"{cls.__qualname__} is registered as version {version} of {name!r} but has no "
            f"upcaster for version(s) {', '.join(map(str, missing))}: upcasters[n] must exist "
            f"for every n in 1..{version - 1} (it turns a version-n payload into version n+1)"
        )
    return tuple(upcasters[n] for n in range(1, version))


def _upcast(reg: _Registration, manifest: str, stored: int, decoded: Any) -> dict[str, Any]:
    """Run a payload stored at version `stored` through the upcasters up to `reg.version`."""
    for n in range(stored, reg.version):
        if not isinstance(decoded, dict):
            raise DeserializationError(
                f"cannot upcast manifest {manifest!r} (stored at version {stored}) from version "
                f"{n}: expected a JSON object, got {type(decoded).__name__}"
            )
        try:
            decoded = reg.upcasters[n - 1](decoded)
        except Exception as e:
            raise DeserializationError(
                f"upcaster {n}->{n + 1} of {reg.name!r} failed on manifest {manifest!r} "
                f"(stored at version {stored}): {type(e).__name__}: {e}"
            ) from e
    if not isinstance(decoded, dict):
        raise DeserializationError(
            f"upcaster {reg.version - 1}->{reg.version} of {reg.name!r} returned "
            f"{type(decoded).__name__}, not a dict, for manifest {manifest!r}"
        )
    return decoded


def _is_plain_json(value: Any) -> bool:
    return value is None or isinstance(value, dict | list | str | int | float | bool)


# -- the converter --------------------------------------------------------------


class _WrongValue(ValueError):
    """A strict structure hook's complaint; its message is shown as it is."""


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, _WrongValue):
        return str(exc)
    return format_exception(exc, type_)


def _got(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _structure_int(value: Any, cl: Any) -> Any:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _WrongValue(f"expected an integer, got {_got(value)}")
    return value if cl is int else cl(value)  # cl may be an IntEnum


def _structure_float(value: Any, cl: Any) -> Any:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _WrongValue(f"expected a number, got {_got(value)}")
    return float(value) if cl is float else cl(value)


def _structure_str(value: Any, cl: Any) -> Any:
    if not isinstance(value, str):
        raise _WrongValue(f"expected a string, got {_got(value)}")
    return value if cl is str else cl(value)  # cl may be a StrEnum


def _structure_bool(value: Any, cl: Any) -> bool:
    if not isinstance(value, bool):
        raise _WrongValue(f"expected true or false, got {_got(value)}")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _WrongValue(f"expected {what} as a string, got {_got(value)}")
    return value


def _structure_datetime(value: Any, cl: Any) -> datetime:
    text = _string(value, "an ISO 8601 datetime")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise _WrongValue(f"expected an ISO 8601 datetime, got {_got(value)}") from None


def _structure_date(value: Any, cl: Any) -> date:
    text = _string(value, "an ISO 8601 date")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise _WrongValue(f"expected an ISO 8601 date, got {_got(value)}") from None


def _structure_uuid(value: Any, cl: Any) -> UUID:
    text = _string(value, "a UUID")
    try:
        return UUID(text)
    except ValueError:
        raise _WrongValue(f"expected a UUID, got {_got(value)}") from None


def _structure_decimal(value: Any, cl: Any) -> Decimal:
    # A JSON number would have gone through float and lost digits: only strings
    # (what this serializer writes) and integers are exact.
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    text = _string(value, "a decimal")
    try:
        return Decimal(text)
    except InvalidOperation:
        raise _WrongValue(f"expected a decimal string, got {_got(value)}") from None


def _unstructure_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _structure_bytes(value: Any, cl: Any) -> bytes:
    text = _string(value, "base64 bytes")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise _WrongValue(f"expected base64 bytes, got {_got(value)}") from None


def _is_int_keyed_mapping(t: Any) -> bool:
    if not is_mapping(t):
        return False
    args = get_args(t)
    key = args[0] if args else None
    return isinstance(key, type) and issubclass(key, int) and key is not bool


def _int_keyed_mapping_hook(t: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """JSON object keys are strings: turn them back into the declared int keys."""
    origin = get_origin(t) or t
    structure_to = dict if origin in (Mapping, MutableMapping) else origin
    inner = mapping_structure_factory(t, converter, structure_to, detailed_validation=True)

    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, dict):
            value = {
                (_structure_int_key(k) if isinstance(k, str) else k): v for k, v in value.items()
            }
        return inner(value, t)

    return structure


def _structure_int_key(key: str) -> int:
    if _INT_KEY.fullmatch(key) is None:
        raise _WrongValue(f"expected an integer key, got {key!r}")
    return int(key)


_INT_KEY: Final = re.compile(r"-?[0-9]+")


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(
        unstruct_collection_overrides={AbstractSet: list}, detailed_validation=True
    )
    for cl, fn in (
        (int, _structure_int),
        (float, _structure_float),
        (str, _structure_str),
        (bool, _structure_bool),
        (datetime, _structure_datetime),
        (date, _structure_date),
        (UUID, _structure_uuid),
        (Decimal, _structure_decimal),
        (bytes, _structure_bytes),
    ):
        converter.register_structure_hook(cl, fn)
    converter.register_unstructure_hook(datetime, datetime.isoformat)
    converter.register_unstructure_hook(date, date.isoformat)
    converter.register_unstructure_hook(UUID, str)
    converter.register_unstructure_hook(Decimal, str)
    converter.register_unstructure_hook(bytes, _unstructure_bytes)
    converter.register_structure_hook_factory(_is_int_keyed_mapping, _int_keyed_mapping_hook)
    configure_union_passthrough(Union[str, bool, int, float, None], converter)  # noqa: UP007
    return converter


def _payload_bytes(payload: object, serializer: Serializer, value: Any, what: str) -> bytes:
    """A user serializer's `to_bytes` result as `bytes` (a subclass of bytes, a
    `bytearray` or a `memoryview` is copied); anything else is refused before it reaches
    a statement, whose outcome would then depend on the path it took (stored as text,
    a database error, or a bare `TypeError` for an append waiting for a group)."""
    if isinstance(payload, bytes | bytearray | memoryview):
        try:
            return bytes(payload)
        except ValueError as e:  # a released memoryview
            raise SerializationError(
                f"serializer {type(serializer).__qualname__} (id {serializer.id}) returned "
                f"an unreadable buffer for {what} of type {type(value).__qualname__}: {e}"
            ) from e
    raise SerializationError(
        f"serializer {type(serializer).__qualname__} (id {serializer.id}) returned "
        f"{type(payload).__qualname__} from to_bytes for {what} of type "
        f"{type(value).__qualname__}; it must return bytes"
    )


class SerializerRegistry:
    """Chooses a serializer for each value and finds it again by id on read.

    The defaults cover JSON values, registered attrs classes/dataclasses and
    `bytes`; `add(serializer, for_types=...)` plugs in others (protobuf, msgpack).
    """

    def __init__(self) -> None:
        self.json = JsonSerializer()
        self._bytes = BytesSerializer()
        self._by_id: dict[int, Serializer] = {}
        self._by_type: dict[type, Serializer] = {}
        self._decoders: dict[tuple[int, str], Callable[[bytes], Any]] = {}
        self.add(self.json)
        self.add(self._bytes, for_types=(bytes, bytearray, memoryview))

    def add(self, serializer: Serializer, *, for_types: tuple[type, ...] = ()) -> None:
        """Make `serializer` readable by its id, and the writer for `for_types`."""
        if (
            isinstance(serializer.id, bool)
            or not isinstance(serializer.id, int)
            or not _MIN_INT4 <= serializer.id <= _MAX_INT4
        ):
            raise SerializationError(
                f"serializer id {serializer.id!r} is not an int in PostgreSQL's integer range "
                f"({_MIN_INT4} .. {_MAX_INT4}): it is stored in an INTEGER column"
            )
        existing = self._by_id.get(serializer.id)
        if existing is not None and existing is not serializer:
            raise SerializationError(f"serializer id {serializer.id} is already taken")
        self._by_id[serializer.id] = serializer
        self._decoders.clear()
        for t in for_types:
            self._by_type[t] = serializer

    def register(
        self,
        cls: type,
        name: str | None = None,
        *,
        version: int = 1,
        upcasters: Mapping[int, Upcaster] | None = None,
        aliases: Iterable[str] = (),
    ) -> None:
        """Register an attrs class or dataclass for JSON under a stable manifest name.

        See `JsonSerializer.register` for `version`, `upcasters` and `aliases`.
        """
        self.json.register(cls, name, version=version, upcasters=upcasters, aliases=aliases)

    def serialize(self, value: Any, *, what: str = "event") -> SerializedPayload:
        """Encode `value`, raising `SerializationError` that names the value's type."""
        serializer = self._by_type.get(type(value))
        if serializer is None:
            if not self.json.handles(value):
                raise SerializationError(
                    f"no serializer for {what} of type {type(value).__qualname__}; register it "
                    "with SerializerRegistry.register (attrs/dataclass) or add a Serializer"
                )
            serializer = self.json
        try:
            payload = serializer.to_bytes(value)
        except SerializationError:
            raise
        except Exception as e:  # a user serializer may raise anything
            raise SerializationError(
                f"cannot serialize {what} of type {type(value).__qualname__}: {e}"
            ) from e
        if type(payload) is not bytes:
            payload = _payload_bytes(payload, serializer, value, what)
        return SerializedPayload(serializer.id, serializer.manifest(value), payload)

    def decoder(self, serializer_id: int, manifest: str) -> Callable[[bytes], Any] | None:
        """A one-argument decoder of payloads with this serializer id and manifest, or
        None for an unknown id; it raises whatever the serializer raises.

        For the row decoder's hot path, which calls `deserialize` only when this
        fails, to raise the `DeserializationError` naming the event. Plain JSON
        (the empty manifest) is decoded without a call through the serializer.
        """
        key = (serializer_id, manifest)
        decode = self._decoders.get(key)
        if decode is not None:
            return decode
        serializer = self._by_id.get(serializer_id)
        if serializer is None:
            return None
        if serializer is self.json and not manifest:
            decode = _loads
        else:
            from_bytes = serializer.from_bytes

            def decode(data: bytes) -> Any:
                return from_bytes(data, manifest)

        if len(self._decoders) < _MAX_DECODERS:  # manifests come from the rows
            self._decoders[key] = decode
        return decode

    def deserialize(
        self,
        serializer_id: int,
        manifest: str,
        payload: bytes,
        *,
        persistence_id: str | None = None,
        seq_nr: int | None = None,
    ) -> Any:
        """Decode a stored payload; failures name the persistence id and seq_nr."""
        serializer = self._by_id.get(serializer_id)
        if serializer is None:
            raise DeserializationError(
                f"unknown serializer id {serializer_id} (manifest {manifest!r})",
                persistence_id=persistence_id,
                seq_nr=seq_nr,
            )
        try:
            return serializer.from_bytes(payload, manifest)
        except DeserializationError as e:
            raise DeserializationError(str(e), persistence_id=persistence_id, seq_nr=seq_nr) from e
        except Exception as e:
            raise DeserializationError(
                f"cannot decode payload with serializer {serializer_id}, manifest "
                f"{manifest!r}: {e}",
                persistence_id=persistence_id,
                seq_nr=seq_nr,
            ) from e

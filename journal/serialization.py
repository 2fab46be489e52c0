"""Turning events, snapshots and metadata into bytes and back.

Each stored payload carries a serializer id and a manifest, as in Pekko, so a
reader can pick the right decoder without guessing and a JVM service sharing
the journal can do the same. Serializing happens in the caller's task, before
any transaction opens, so a value that cannot be serialized never leaves a
half-written batch behind.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Final, Protocol, runtime_checkable

import attrs

from journal.errors import DeserializationError, SerializationError
from journal.model import SerializedPayload

# One encoder for all events: json.dumps with options builds a new one per call.
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

BYTES_SERIALIZER_ID: Final = 4  # Pekko's ByteArraySerializer
JSON_SERIALIZER_ID: Final = 31  # the id Pekko gives its Jackson JSON serializer


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
        """Encode the value."""
        ...

    def from_bytes(self, data: bytes, manifest: str) -> Any:
        """Decode bytes written by `to_bytes` for a value with this manifest."""
        ...


class BytesSerializer:
    """Passes `bytes` through unchanged."""

    id = BYTES_SERIALIZER_ID

    def manifest(self, value: Any) -> str:
        return ""

    def to_bytes(self, value: Any) -> bytes:
        return bytes(value)

    def from_bytes(self, data: bytes, manifest: str) -> Any:
        return bytes(data)


class JsonSerializer:
    """JSON for plain values and for registered attrs classes / dataclasses.

    Plain JSON values (dict, list, str, int, float, bool, None) get the empty
    manifest. A class must be registered under a stable name, which becomes its
    manifest, so renaming or moving the Python class does not orphan old events.
    """

    id = JSON_SERIALIZER_ID

    def __init__(self) -> None:
        self._by_type: dict[type, str] = {}
        self._by_name: dict[str, type] = {}

    def register(self, cls: type, name: str | None = None) -> None:
        """Register an attrs class or dataclass under a stable manifest name."""
        if not (attrs.has(cls) or dataclasses.is_dataclass(cls)):
            raise SerializationError(
                f"{cls.__qualname__} is neither an attrs class nor a dataclass"
            )
        name = name or f"{cls.__module__}.{cls.__qualname__}"
        if not name:
            raise SerializationError("manifest name must not be empty")
        existing = self._by_name.get(name)
        if existing is not None and existing is not cls:
            raise SerializationError(
                f"manifest {name!r} is already registered for {existing.__qualname__}"
            )
        self._by_type[cls] = name
        self._by_name[name] = cls

    def handles(self, value: Any) -> bool:
        return type(value) in self._by_type or _is_plain_json(value)

    def manifest(self, value: Any) -> str:
        return self._by_type.get(type(value), "")

    def to_bytes(self, value: Any) -> bytes:
        cls = type(value)
        if cls in self._by_type:
            fields = attrs.asdict(value) if attrs.has(cls) else dataclasses.asdict(value)
        else:
            fields = value
        try:
            return _ENCODER.encode(fields).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise SerializationError(f"cannot encode {cls.__qualname__} as JSON: {e}") from e

    def from_bytes(self, data: bytes, manifest: str) -> Any:
        decoded = json.loads(bytes(data).decode("utf-8"))
        if not manifest:
            return decoded
        cls = self._by_name.get(manifest)
        if cls is None:
            raise DeserializationError(f"unknown JSON manifest {manifest!r}")
        return cls(**decoded)


def _is_plain_json(value: Any) -> bool:
    return value is None or isinstance(value, dict | list | str | int | float | bool)


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
        self.add(self.json)
        self.add(self._bytes, for_types=(bytes, bytearray, memoryview))

    def add(self, serializer: Serializer, *, for_types: tuple[type, ...] = ()) -> None:
        """Make `serializer` readable by its id, and the writer for `for_types`."""
        existing = self._by_id.get(serializer.id)
        if existing is not None and existing is not serializer:
            raise SerializationError(f"serializer id {serializer.id} is already taken")
        self._by_id[serializer.id] = serializer
        for t in for_types:
            self._by_type[t] = serializer

    def register(self, cls: type, name: str | None = None) -> None:
        """Register an attrs class or dataclass for JSON under a stable manifest name."""
        self.json.register(cls, name)

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
        return SerializedPayload(serializer.id, serializer.manifest(value), payload)

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

"""Immutable value types that cross the journal's API.

They are plain frozen attrs classes so they can be hashed, compared, logged and
handed between the async runtime, worker processes and tests without anyone
mutating what another part is still reading.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

import attrs

from journal.errors import DeserializationError

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _freeze_seen(value: Mapping[str, int] | None) -> Mapping[str, int]:
    # A read-only view is taken as it is: the slice query builds a fresh one per
    # row on its hot path, and copying it again would cost a dict per event.
    if isinstance(value, MappingProxyType):
        return value
    return MappingProxyType(dict(value or {}))


def _slot_setter(cls: type, *, check: tuple[str, ...] = ()) -> Any:
    """A function that builds an instance of the frozen, slotted attrs class `cls`
    from all its fields, positionally, in definition order.

    For the hot paths only (the slice query makes an offset and an envelope per
    event): it stores each value through the field's slot descriptor, as the
    `__init__` attrs generates does through `object.__setattr__`, without that
    method's attribute lookup per field (about a third of the cost of building
    an envelope). The class must have no converters or validators, except on
    the fields in `check`, whose values the caller guarantees to be converted
    already; the values are taken as given.
    """
    fields = attrs.fields(cls)
    for f in fields:
        if (f.converter is not None or f.validator is not None) and f.name not in check:
            raise TypeError(f"{cls.__qualname__}.{f.name} needs its converter or validator")
    names = [f.name for f in fields]
    setters = {f"_set_{n}": getattr(cls, n).__set__ for n in names}
    body = "".join(f"    _set_{n}(self, {n})\n" for n in names)
    source = (
        f"def build({', '.join(names)}, *, _new=_new, _cls=_cls, "
        f"{', '.join(f'{k}={k}' for k in setters)}):\n"
        f"    self = _new(_cls)\n{body}    return self\n"
    )
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls, **setters}
    exec(source, namespace)  # generated from the class's own field names
    return namespace["build"]


class _Marker:
    """A falsy stand-in for an event an envelope does not hold, unique by name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return self.name  # unpickles as the module's own instance


# The payload was not read (backtracking rows); `Journal.load_envelope` reads it.
NOT_LOADED: Final = _Marker("NOT_LOADED")
# The payload could not be decoded; the envelope's `error` says why.
UNDECODABLE: Final = _Marker("UNDECODABLE")
# `Journal.delete_all`'s tombstone row: event_ser_id 0 with this manifest, deleted, no payload.
TOMBSTONE_MANIFEST: Final = "slicejournal.tombstone"
TOMBSTONE_SER_ID: Final = 0
# An event the stream's `EventFilter` left out: only its key and offset were read.
FILTERED: Final = _Marker("FILTERED")
# What a filtered query selects instead of such a row's serializer id and manifest.
FILTERED_MANIFEST: Final = "slicejournal.filtered"
FILTERED_SER_ID: Final = TOMBSTONE_SER_ID  # the row decoder tells them by manifest


@attrs.frozen
class TimestampOffset:
    """Where a slice query is: a database timestamp plus the events already seen *at* it.

    `seen` maps persistence id to the highest seq_nr emitted at exactly
    `timestamp`, so restarting from this offset neither repeats those events nor
    skips others that share the timestamp. `read_timestamp` is the database time
    at which the row was read (used for lag figures).
    """

    timestamp: datetime
    read_timestamp: datetime = EPOCH
    seen: Mapping[str, int] = attrs.field(factory=dict, converter=_freeze_seen, hash=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # `seen` is a read-only view, which pickle cannot copy; offsets travel to
        # worker processes and Spark executors, so they pickle as plain values.
        return (TimestampOffset, (self.timestamp, self.read_timestamp, dict(self.seen)))

    @classmethod
    def zero(cls) -> TimestampOffset:
        """The offset before every event."""
        return cls(EPOCH, EPOCH, {})


# TimestampOffset(timestamp, read_timestamp, seen) for a `seen` that is already a
# read-only view (the converter would take it as it is), without the converter call.
new_offset: Callable[[datetime, datetime, MappingProxyType[str, int]], TimestampOffset] = (
    _slot_setter(TimestampOffset, check=("seen",))
)


@attrs.frozen
class SerializedPayload:
    """Bytes plus what is needed to turn them back into an object."""

    serializer_id: int
    manifest: str
    payload: bytes


@attrs.frozen
class EventEnvelope:
    """One event as read from the journal, with where it sits in it.

    `event` is `NOT_LOADED` for envelopes from backtracking queries (which skip
    the payload); `Journal.load_envelope` fetches it. It is `UNDECODABLE` when
    the payload or metadata could not be decoded (say, a serializer id a JVM
    service wrote that is not registered here): `error` then holds the
    `DeserializationError`, naming the event, so a stream goes on and the
    reader decides; projections hand it to their recovery strategy, and
    `decoded_event()` raises it. `source` tells which kind
    of query produced the envelope: "query", "backtracking", "persistence_id",
    "append" or, for idle progress markers, "heartbeat". `deleted` marks the
    tombstone `Journal.delete_all` leaves: the id was erased, `event` is None.
    `event` is `FILTERED` for an event a stream's `EventFilter` left out (see
    `filtered`).
    """

    persistence_id: str
    entity_type: str
    slice: int
    seq_nr: int
    db_timestamp: datetime
    event: Any
    serializer_id: int | None = None
    serializer_manifest: str = ""
    tags: tuple[str, ...] = ()
    metadata: Any = None
    writer: str = ""
    offset: TimestampOffset | None = None
    source: str = "query"
    error: DeserializationError | None = None
    deleted: bool = False

    def decoded_event(self) -> Any:
        """The event, or raise the `DeserializationError` that kept it from being decoded."""
        if self.error is not None:
            raise self.error
        return self.event

    @property
    def event_loaded(self) -> bool:
        """False for backtracking envelopes whose payload has not been read."""
        return self.event is not NOT_LOADED

    @property
    def filtered(self) -> bool:
        """True for an event the stream's `EventFilter` left out (`event` is `FILTERED`):
        delivered, key and offset only, to consumers that track every seq_nr
        (`filtered_envelopes=True`; projections record it, handlers never see it)."""
        return self.event is FILTERED

    @property
    def is_heartbeat(self) -> bool:
        """True for the idle progress markers a slice query emits when asked to."""
        return self.source == "heartbeat"


# EventEnvelope(...) with every field given positionally, in order: the row decoder's.
new_envelope: Callable[
    [str, str, int, int, datetime, Any, int | None, str, tuple[str, ...], Any, str,
     TimestampOffset | None, str, DeserializationError | None, bool],
    EventEnvelope,
] = _slot_setter(EventEnvelope)  # fmt: skip


def heartbeat_envelope(entity_type: str, min_slice: int, offset: TimestampOffset) -> EventEnvelope:
    """An idle progress marker: everything of the range before `offset` was delivered."""
    return EventEnvelope(
        persistence_id="",
        entity_type=entity_type,
        slice=min_slice,
        seq_nr=0,
        db_timestamp=offset.timestamp,
        event=None,
        offset=offset,
        source="heartbeat",
    )


@attrs.frozen
class Snapshot:
    """The latest saved state of one persistence id."""

    persistence_id: str
    seq_nr: int
    db_timestamp: datetime
    write_timestamp: datetime
    state: Any
    tags: tuple[str, ...] = ()
    metadata: Any = None

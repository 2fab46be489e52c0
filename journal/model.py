"""Immutable value types that cross the journal's API.

They are plain frozen attrs classes so they can be hashed, compared, logged and
handed between the async runtime, worker processes and tests without anyone
mutating what another part is still reading.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, ClassVar, Final, NamedTuple

import attrs

from journal.errors import DeserializationError

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _freeze_seen(value: Mapping[str, int] | None) -> Mapping[str, int]:
    # A read-only view is taken as it is: copying it again would cost a dict.
    if isinstance(value, MappingProxyType):
        return value
    return MappingProxyType(dict(value or {}))


class _Unordered:
    """Keeps a tuple-backed value from being ordered as a tuple.

    The offset and the envelope are tuples underneath for speed (see
    `TimestampOffset`), but comparing two of them field by field means nothing
    (and would fail on `seen`); `<` raises `TypeError` as for any unordered value.
    """

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return NotImplemented

    def __le__(self, other: object) -> bool:
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        return NotImplemented

    def __ge__(self, other: object) -> bool:
        return NotImplemented


def _attrs_compatible(cls: Any, defaults: Mapping[str, Any]) -> None:
    """Give a tuple-backed value (a `NamedTuple` subclass) the `__attrs_attrs__` that
    `attrs.evolve`, `attrs.asdict` and `attrs.fields` read, so code written when it
    was an attrs class keeps working. (Its `repr`, pickling and `_replace` are the
    named tuple's own.)"""
    spec = attrs.make_class(
        cls.__name__,
        {
            name: attrs.field(default=defaults[name]) if name in defaults else attrs.field()
            for name in cls._fields
        },
        frozen=True,
    )
    cls.__attrs_attrs__ = attrs.fields(spec)


class _OwnOffset:
    """The `offset` of a tuple-backed value a slice query built, built when read.

    Most rows of a slice query carry everything their offset holds: their
    timestamp, the read time and their own id at their seq_nr as `seen` (the only
    id seen at that timestamp). Building it for each of them (an offset and its
    `seen` view: about 0.3 us an event) was most of what a catch-up spent beyond
    its rows, and few readers look at every envelope's offset; so the query leaves
    the read time in the offset's place and `offset` builds the offset from the
    value's own fields each time it is read. What a reader of the value uses sees
    the offset: attribute access, equality and hashing, iteration, unpacking,
    indexing and `in`, `_replace`, `_asdict`, `attrs`, pickling and `repr`. Only
    tuple arithmetic (`+`, `*`) and %-formatting with the value as the tuple of
    arguments see the read time: it is a value with named fields, not a sequence.
    The positions of the id (0), the seq_nr or revision (3) and the timestamp (4)
    are the same in both values; `_OFFSET_AT` is where the offset is.
    """

    __slots__ = ()
    _OFFSET_AT: ClassVar[int]

    @property
    def offset(self) -> TimestampOffset | None:
        """Where a slice query is after this value: resume from it to go on right after
        it (None for values no slice query produced). Built when read, for most values
        a slice query delivers: equal each time, not the same object."""
        offset = _item(self, self._OFFSET_AT)
        if type(offset) is datetime:  # the read time: the row's own offset
            pid, _, _, seq_nr, timestamp = _item(self, _HEAD)
            return own_offset(timestamp, offset, pid, seq_nr)
        return offset  # type: ignore[no-any-return]

    def _offset_timestamp(self) -> datetime | None:
        """`offset.timestamp` without building the offset (None without an offset)."""
        offset = _item(self, self._OFFSET_AT)
        if type(offset) is datetime:
            return _item(self, 4)  # type: ignore[no-any-return]
        return None if offset is None else offset.timestamp

    def _unbuilt(self) -> bool:
        return type(_item(self, self._OFFSET_AT)) is datetime

    def _items(self) -> tuple[Any, ...]:
        """The fields as a plain tuple, the offset built."""
        items = _item(self, _ALL)  # a slice of a tuple is a plain tuple
        if type(items[self._OFFSET_AT]) is not datetime:
            return items  # type: ignore[no-any-return]
        fields = list(items)
        fields[self._OFFSET_AT] = self.offset
        return tuple(fields)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items()) if self._unbuilt() else _iter(self)

    def __getitem__(self, index: Any) -> Any:
        return self._items()[index] if self._unbuilt() else _item(self, index)

    def __contains__(self, value: object) -> bool:
        return value in self._items()

    def count(self, value: Any) -> int:
        return self._items().count(value)

    def index(self, value: Any, *bounds: Any) -> int:
        return self._items().index(value, *bounds)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _OwnOffset):
            if not self._unbuilt() and not other._unbuilt():
                return _tuple_eq(self, other)  # type: ignore[no-any-return]
            return self._items() == other._items()
        if isinstance(other, tuple):
            return self._items() == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self._items()) if self._unbuilt() else _tuple_hash(self)

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={value!r}"
            for name, value in zip(self._fields, self._items(), strict=True)  # type: ignore[attr-defined]
        )
        return f"{type(self).__name__}({fields})"


# The tuple's own methods, past `_OwnOffset`'s.
_item: Final[Callable[[Any, Any], Any]] = tuple.__getitem__
_iter: Final[Callable[[Any], Iterator[Any]]] = tuple.__iter__
_tuple_eq: Final[Callable[[Any, Any], Any]] = tuple.__eq__
_tuple_hash: Final[Callable[[Any], int]] = tuple.__hash__
_ALL: Final = slice(None)
_HEAD: Final = slice(5)  # id, entity type, slice, seq_nr or revision, timestamp


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
# The `source` of an envelope that carries an id's snapshot instead of its events up to
# the snapshot's seq_nr (`Journal.events_by_slices_from_snapshots`).
SNAPSHOT_SOURCE: Final = "snapshot"


class _OffsetFields(NamedTuple):
    timestamp: datetime
    read_timestamp: datetime
    seen: Mapping[str, int]


class TimestampOffset(_Unordered, _OffsetFields):
    """Where a slice query is: a database timestamp plus the events already seen *at* it.

    `seen` maps persistence id to the highest seq_nr emitted at exactly
    `timestamp`, so restarting from this offset neither repeats those events nor
    skips others that share the timestamp. `read_timestamp` is the database time
    at which the row was read (used for lag figures).

    An immutable value: equal offsets are equal whatever built them, the hash
    leaves out `seen`, and `attrs.evolve` or `_replace` make a changed copy. It is
    a tuple underneath, because a catch-up makes one per event and a tuple is
    built several times faster than any other immutable object in Python;
    treat it as a value with named fields, not as a sequence.
    """

    __slots__ = ()

    def __new__(
        cls,
        timestamp: datetime,
        read_timestamp: datetime = EPOCH,
        seen: Mapping[str, int] | None = None,
    ) -> TimestampOffset:
        return tuple.__new__(cls, (timestamp, read_timestamp, _freeze_seen(seen)))

    def __hash__(self) -> int:
        return hash((self.timestamp, self.read_timestamp))

    def __repr__(self) -> str:
        return (
            f"TimestampOffset(timestamp={self.timestamp!r}, "
            f"read_timestamp={self.read_timestamp!r}, seen={dict(self.seen)!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # `seen` is a read-only view, which pickle cannot copy; offsets travel to
        # worker processes and Spark executors, so they pickle as plain values.
        return (TimestampOffset, (self.timestamp, self.read_timestamp, dict(self.seen)))

    def _replace(self, **changes: Any) -> TimestampOffset:
        # Through `__new__`, unlike the named tuple's: a new `seen` is frozen too.
        fields = self._asdict()
        fields.update(changes)
        return TimestampOffset(**fields)

    __replace__ = _replace  # copy.replace (Python 3.13)

    @classmethod
    def zero(cls) -> TimestampOffset:
        """The offset before every event."""
        return cls(EPOCH, EPOCH, {})


_attrs_compatible(TimestampOffset, {"read_timestamp": EPOCH, "seen": None})


_new_tuple: Final = tuple.__new__


def own_offset(
    timestamp: datetime, read_timestamp: datetime, pid: str, seq_nr: int
) -> TimestampOffset:
    """A row's own offset: its timestamp and read time, and only its id (at its seq_nr)
    seen there. What the slice query leaves unbuilt (`_OwnOffset`), and what it builds
    for a row with a timestamp of its own; `TimestampOffset` without its `__new__`."""
    return _new_tuple(TimestampOffset, (timestamp, read_timestamp, MappingProxyType({pid: seq_nr})))


@attrs.frozen
class SerializedPayload:
    """Bytes plus what is needed to turn them back into an object."""

    serializer_id: int
    manifest: str
    payload: bytes


class _EnvelopeFields(NamedTuple):
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


class EventEnvelope(_Unordered, _OwnOffset, _EnvelopeFields):
    """One event as read from the journal, with where it sits in it.

    `event` is `NOT_LOADED` for envelopes from backtracking queries (which skip
    the payload); `Journal.load_envelope` fetches it. It is `UNDECODABLE` when
    the payload or metadata could not be decoded (say, a serializer id a JVM
    service wrote that is not registered here): `error` then holds the
    `DeserializationError`, naming the event, so a stream goes on and the
    reader decides; projections hand it to their recovery strategy, and
    `decoded_event()` raises it. `source` tells which kind
    of query produced the envelope: "query", "backtracking", "persistence_id",
    "append", "snapshot" (see `from_snapshot`) or, for idle progress markers,
    "heartbeat". `deleted` marks the
    tombstone `Journal.delete_all` leaves: the id was erased, `event` is None.
    `event` is `FILTERED` for an event a stream's `EventFilter` left out (see
    `filtered`).

    An immutable value with named fields (`attrs.evolve` or `_replace` make a
    changed copy; `copy.replace` too on Python 3.13). Like `TimestampOffset` it is a
    tuple underneath, because a catch-up builds one per event; its `offset` is built
    when read, for most envelopes of a slice query (`_OwnOffset`).
    """

    __slots__ = ()
    _OFFSET_AT = 11

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

    @property
    def from_snapshot(self) -> bool:
        """True for an id's snapshot delivered in place of its events up to `seq_nr`
        (`Journal.events_by_slices_from_snapshots`): `event` is the snapshot's state,
        `db_timestamp` that of the event it was taken at."""
        return self.source == SNAPSHOT_SOURCE


_attrs_compatible(EventEnvelope, _EnvelopeFields._field_defaults)


def new_envelope(
    persistence_id: str,
    entity_type: str,
    slice_: int,
    seq_nr: int,
    db_timestamp: datetime,
    event: Any,
    serializer_id: int | None,
    serializer_manifest: str,
    tags: tuple[str, ...],
    metadata: Any,
    writer: str,
    offset: TimestampOffset | datetime | None,
    source: str,
    error: DeserializationError | None,
    deleted: bool,
) -> EventEnvelope:
    """EventEnvelope(...) with every field given positionally, in order; `offset` may be a
    row's read time, where the offset is the row's own (`_OwnOffset`)."""
    return _new_tuple(
        EventEnvelope,
        (persistence_id, entity_type, slice_, seq_nr, db_timestamp, event, serializer_id,
         serializer_manifest, tags, metadata, writer, offset, source, error, deleted),
    )  # fmt: skip


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
    """The latest saved state of one persistence id.

    `db_timestamp` is that of the event at `seq_nr` (where start-from-snapshot
    queries place the snapshot); `write_timestamp` is when it was saved.
    """

    persistence_id: str
    seq_nr: int
    db_timestamp: datetime
    write_timestamp: datetime
    state: Any
    tags: tuple[str, ...] = ()
    metadata: Any = None

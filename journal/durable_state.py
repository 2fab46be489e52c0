"""Durable state: one row per persistence id holding its latest revision.

Pekko Persistence R2DBC's third store beside the journal and the snapshots. A
writer upserts an id's whole state with the *new* revision (previous + 1); the
write succeeds only if the stored revision is exactly the previous one, so two
writers racing on one id cannot both win (`ConcurrencyError`, nothing written).
Deleting keeps the row, with no payload, at its new revision: the revision is
never reused and the changes query tells its readers the id was deleted.

The row carries the slice and `db_timestamp` like an event does, so the slice
query reads it through the same machine (`journal.query.source.STATE_CHANGES`):
a change is a row, ordered by `(db_timestamp, revision)`. Because an upsert
overwrites the row, a query sees the latest revision of each changed id, not
every revision; readers keep the highest revision per id and treat a gap as
normal.

This module is the pure part: the value types, the columns the changes query
selects and their decoding, and the validation of a write. No database import.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import attrs

from journal.callables import check_flavour, describe
from journal.errors import DeserializationError, InvalidArgument
from journal.model import (
    NOT_LOADED,
    UNDECODABLE,
    TimestampOffset,
    _attrs_compatible,
    _OwnOffset,
    _Unordered,
)
from journal.rows import ROW_DB_TIMESTAMP, ROW_PID, ROW_SEQ_NR, Row, RowOffset
from journal.serialization import SerializerRegistry
from journal.slices import entity_type_of, slice_for, validate_persistence_id

# The changes query's select list, in the positions the slice machine reads
# (`journal.rows`: id, seq_nr, db_timestamp) with the revision as the seq_nr,
# then the payload, then the read time.
STATE_COLUMNS = (
    "persistence_id",
    "entity_type",
    "slice",
    "revision",
    "db_timestamp",
    "state_ser_id",
    "state_ser_manifest",
    "tags",
    "deleted",  # computed: the row is a deletion marker (`DELETED_SQL`)
)
STATE_PAYLOAD_COLUMN = "state_payload"  # selected after STATE_COLUMNS
STATE_ROW_WIDTH = len(STATE_COLUMNS) + 1

if (
    STATE_COLUMNS.index("persistence_id") != ROW_PID
    or STATE_COLUMNS.index("revision") != ROW_SEQ_NR
    or STATE_COLUMNS.index("db_timestamp") != ROW_DB_TIMESTAMP
):  # pragma: no cover - a wrong edit of either layout
    raise ImportError("durable state columns out of the slice machine's positions")

# Pekko's deletion marker: serializer id 0, manifest "", an empty payload. Read
# through `octet_length`, which does not load a large payload from TOAST.
DELETED_SER_ID = 0
DELETED_SQL = "(state_ser_id = 0 AND octet_length(state_payload) = 0)"


@attrs.frozen
class DurableState:
    """An id's stored state and its revision (what `DurableStateStore.get` returns).

    After `delete`, `deleted` is True and `value` None; the revision is kept, so the
    next `upsert` takes revision + 1.
    """

    persistence_id: str
    revision: int
    value: Any
    db_timestamp: datetime
    tags: tuple[str, ...] = ()
    deleted: bool = False


class _ChangeFields(NamedTuple):
    persistence_id: str
    entity_type: str
    slice: int
    revision: int
    db_timestamp: datetime
    value: Any
    serializer_id: int | None = None
    serializer_manifest: str = ""
    tags: tuple[str, ...] = ()
    offset: TimestampOffset | None = None
    source: str = "query"
    error: DeserializationError | None = None
    deleted: bool = False


class DurableStateChange(_Unordered, _OwnOffset, _ChangeFields):
    """One change of an id's durable state as `changes_by_slices` delivers it.

    It is the latest revision the query saw (earlier revisions may have been
    overwritten before the query read the row), so revisions of one id arrive
    increasing but not necessarily consecutive. `value` is the state, None for a
    deletion (`deleted`), `NOT_LOADED` for a backtracking change (its payload is
    not read; `DurableStateStore.get` reads the latest) and `UNDECODABLE` with
    `error` when the payload could not be decoded. `offset` resumes a query right
    after it; `source` is "query", "backtracking" or "heartbeat" (an idle
    progress marker with no id), "write" for the change a store's
    `change_handler` gets, or "replay" for a dead letter replayed (neither has an
    offset). `seq_nr` is the revision, for consumers that
    track one number per id (the projections' offset store).

    An immutable value with named fields, tuple-backed like `EventEnvelope` (the
    changes query builds one per row); `attrs.evolve` or `_replace` make a copy.
    """

    __slots__ = ()
    _OFFSET_AT = 9

    @property
    def seq_nr(self) -> int:
        """The revision (one number per id, as an event's seq_nr)."""
        return self.revision

    @property
    def value_loaded(self) -> bool:
        """False for backtracking changes whose payload has not been read."""
        return self.value is not NOT_LOADED

    @property
    def is_heartbeat(self) -> bool:
        """True for the idle progress markers a changes query emits when asked to."""
        return self.source == "heartbeat"

    def decoded_value(self) -> Any:
        """The state, or raise the `DeserializationError` that kept it from being decoded."""
        if self.error is not None:
            raise self.error
        return self.value


_attrs_compatible(DurableStateChange, _ChangeFields._field_defaults)


def heartbeat_change(
    entity_type: str, min_slice: int, offset: TimestampOffset
) -> DurableStateChange:
    """An idle progress marker: every change of the range before `offset` was delivered."""
    return DurableStateChange(
        "", entity_type, min_slice, 0, offset.timestamp, None, offset=offset, source="heartbeat"
    )


def rows_to_changes(
    rows: Iterable[tuple[Row, RowOffset]],
    registry: SerializerRegistry,
    *,
    source: str,
) -> Iterator[DurableStateChange]:
    """Decode rows selected with `STATE_COLUMNS` (+ payload), each with its offset, one
    at a time (as `journal.rows.iter_envelopes`, so each dies young)."""
    for row, offset in rows:
        pid, entity_type, slice_, revision, db_ts, ser_id, manifest, tags, deleted, payload = row[
            :STATE_ROW_WIDTH
        ]
        value: Any = NOT_LOADED
        error: DeserializationError | None = None
        if deleted:
            value = None
        elif payload is not None:
            try:
                value = registry.deserialize(
                    ser_id, manifest or "", payload, persistence_id=pid, seq_nr=revision
                )
            except DeserializationError as e:
                value, error = UNDECODABLE, e
        yield _new(
            DurableStateChange,
            (pid, entity_type, slice_, revision, db_ts, value, ser_id, manifest or "",
             tuple(tags) if tags else (), offset, source, error, bool(deleted)),
        )  # fmt: skip


_new = tuple.__new__


def check_change_handler(handler: object, *, asynchronous: bool) -> None:
    """Refuse a store's `change_handler` that is not callable, or of the other flavour
    (`DurableStateStore` awaits it, `SyncDurableStateStore` calls it), when the store is
    built rather than at the first write."""
    if handler is None:
        return
    if not callable(handler):
        raise InvalidArgument(f"change_handler must be callable, got {handler!r}")
    check_flavour(
        handler, asynchronous=asynchronous, what=describe(handler, "change_handler"),
        async_api="DurableStateStore (Journal)", sync_api="SyncDurableStateStore (SyncJournal)",
    )  # fmt: skip


def written_change(
    params: dict[str, Any], value: Any, db_timestamp: datetime
) -> DurableStateChange:
    """The change a write of `state_params` made, as the store's change handler gets it
    (`source` "write", no offset: it is not a query's)."""
    deleted = params["ser_id"] == DELETED_SER_ID and not params["payload"]
    return _new(
        DurableStateChange,
        (params["pid"], params["entity_type"], params["slice"], params["revision"],
         db_timestamp, None if deleted else value, params["ser_id"], params["manifest"],
         tuple(params["tags"] or ()), None, "write", None, deleted),
    )  # fmt: skip


def state_change(state: DurableState, source: str) -> DurableStateChange:
    """An id's stored state as a change (a dead letter's replay hands it to the handler
    again): no offset, no serializer (the value is decoded already)."""
    pid = state.persistence_id
    return _new(
        DurableStateChange,
        (pid, entity_type_of(pid), slice_for(pid), state.revision, state.db_timestamp,
         state.value, None, "", state.tags, None, source, None, state.deleted),
    )  # fmt: skip


def row_to_state(registry: SerializerRegistry, pid: str, row: Sequence[Any]) -> DurableState:
    """Decode a row of `DurableStateSql.select` (revision, db_timestamp, serializer id,
    manifest, payload, tags)."""
    revision, db_ts, ser_id, manifest, payload, tags = row
    deleted = ser_id == DELETED_SER_ID and len(payload) == 0
    value = None
    if not deleted:
        value = registry.deserialize(
            ser_id, manifest or "", bytes(payload), persistence_id=pid, seq_nr=revision
        )
    return DurableState(pid, revision, value, db_ts, tuple(tags or ()), deleted)


def row_to_change(
    registry: SerializerRegistry, pid: str, row: Sequence[Any], *, source: str
) -> DurableStateChange:
    """The id's current state as a change: a row of `DurableStateSql.select` (revision,
    db_timestamp, serializer id, manifest, payload, tags) decoded as `rows_to_changes`
    does (a payload it cannot decode: `UNDECODABLE` with `error`)."""
    revision, db_ts, ser_id, manifest, payload, tags = row
    deleted = ser_id == DELETED_SER_ID and len(payload) == 0
    value: Any = None
    error: DeserializationError | None = None
    if not deleted:
        try:
            value = registry.deserialize(
                ser_id, manifest or "", bytes(payload), persistence_id=pid, seq_nr=revision
            )
        except DeserializationError as e:
            value, error = UNDECODABLE, e
    return DurableStateChange(
        pid, entity_type_of(pid), slice_for(pid), revision, db_ts, value, ser_id,
        manifest or "", tuple(tags or ()), None, source, error, deleted,
    )  # fmt: skip


def check_revision(revision: object) -> int:
    """The new revision of a write: an int >= 1."""
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise InvalidArgument(f"revision must be an int >= 1 (the new revision), got {revision!r}")
    return revision


def state_params(
    registry: SerializerRegistry,
    persistence_id: str,
    revision: int,
    state: Any,
    tags: Sequence[str],
    *,
    delete: bool = False,
) -> dict[str, Any]:
    """Validate and serialize a write into the parameters of `DurableStateSql`; a
    deletion is Pekko's marker: serializer id 0, no manifest, no bytes."""
    pid = validate_persistence_id(persistence_id)
    check_revision(revision)
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise InvalidArgument(f"tags must be a sequence of str, got {tags!r}")
    if not delete and state is None:
        raise InvalidArgument("the state of an upsert must not be None (to delete, use delete)")
    if delete:
        ser_id, manifest, payload = DELETED_SER_ID, "", b""
    else:
        serialized = registry.serialize(state, what="state")
        ser_id, manifest, payload = (
            serialized.serializer_id,
            serialized.manifest,
            serialized.payload,
        )
    return {
        "slice": slice_for(pid),
        "entity_type": entity_type_of(pid),
        "pid": pid,
        "revision": revision,
        "previous": revision - 1,
        "ser_id": ser_id,
        "manifest": manifest,
        "payload": payload,
        "tags": list(tags) or None,
    }

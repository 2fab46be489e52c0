"""The journal's column order and the one function that turns a row into an envelope.

Every read path (by persistence id, by slices, `load_envelope`) selects the
same columns in the same order (`journal.query.sql.envelope_columns` builds
the select list from `COLUMNS`) and decodes them here, so a payload is decoded
the same way whichever query produced it. Pure: no database import, so the
slice-query state machine can use the column positions on a Spark executor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import orjson

from journal.errors import DeserializationError
from journal.model import (
    FILTERED,
    FILTERED_MANIFEST,
    NOT_LOADED,
    TOMBSTONE_MANIFEST,
    TOMBSTONE_SER_ID,
    UNDECODABLE,
    EventEnvelope,
    TimestampOffset,
    new_envelope,
)
from journal.serialization import SerializerRegistry, is_plain_json, orjson_exact

COLUMNS = (
    "persistence_id",
    "entity_type",
    "slice",
    "seq_nr",
    "db_timestamp",
    "writer",
    "tags",
    "event_ser_id",
    "event_ser_manifest",
    "meta_ser_id",
    "meta_ser_manifest",
    "meta_payload",
)
PAYLOAD_COLUMN = "event_payload"  # selected last, after COLUMNS


Row = Sequence[Any]
ROW_PAYLOAD = len(COLUMNS)
ROW_DB_TIMESTAMP = COLUMNS.index("db_timestamp")
ROW_PID = COLUMNS.index("persistence_id")
ROW_SEQ_NR = COLUMNS.index("seq_nr")
ROW_WIDTH = len(COLUMNS) + 1  # queries may append columns after the payload
Emitted = TimestampOffset | datetime
"""What the slice query emits a row with: its offset, or its read time where the offset
is the row's own (its timestamp, that read time, its id alone seen at its seq_nr),
which the envelope builds when it is read (`journal.model._OwnOffset`)."""
RowOffset = Emitted | None
"""What a row is decoded with: `Emitted`, or None outside a slice query."""
# Start-from-snapshot queries (`journal.query.sql.snapshot_rows`): true for a snapshot.
SNAPSHOT_FLAG = ROW_WIDTH


def decode_payloads(
    registry: SerializerRegistry,
    pid: str,
    seq_nr: int,
    ser_id: int,
    manifest: str,
    payload: bytes | None,
    meta_ser_id: int | None,
    meta_manifest: str | None,
    meta_payload: bytes | None,
) -> tuple[Any, Any, DeserializationError | None]:
    """(event, metadata, error): `NOT_LOADED` without a payload, `UNDECODABLE` with the
    error when either cannot be decoded. Carried, not raised: one bad row must not
    end every stream over its slice; the reader decides (projections: their recovery)."""
    event: Any = NOT_LOADED
    metadata = None
    try:
        if payload is not None:
            event = registry.deserialize(
                ser_id, manifest, payload, persistence_id=pid, seq_nr=seq_nr
            )
        if meta_payload is not None and meta_ser_id is not None:
            metadata = registry.deserialize(
                meta_ser_id, meta_manifest or "", meta_payload, persistence_id=pid, seq_nr=seq_nr
            )
    except DeserializationError as e:
        return UNDECODABLE, None, e
    return event, metadata, None


def is_tombstone(ser_id: int | None, manifest: str | None) -> bool:
    """Whether a row's serializer and manifest are those of `Journal.delete_all`'s tombstone."""
    return ser_id == TOMBSTONE_SER_ID and manifest == TOMBSTONE_MANIFEST


def tombstone_envelope(
    pid: str,
    entity_type: str,
    slice_: int,
    seq_nr: int,
    db_timestamp: Any,
    writer: str,
    offset: RowOffset,
    source: str,
) -> EventEnvelope:
    """The envelope of a tombstone: the id was erased; no event, nothing to decode."""
    return new_envelope(
        pid, entity_type, slice_, seq_nr, db_timestamp, None, None, TOMBSTONE_MANIFEST,
        (), None, writer, offset, source, None, True,
    )  # fmt: skip


def row_to_envelope(
    row: Row,
    registry: SerializerRegistry,
    *,
    source: str,
    offset: TimestampOffset | None = None,
) -> EventEnvelope:
    """Decode one row (selected with `envelope_columns`) into an `EventEnvelope`."""
    return next(iter_envelopes(((row, offset),), registry, source=source))


def rows_to_envelopes(
    rows: Iterable[tuple[Row, RowOffset]],
    registry: SerializerRegistry,
    *,
    source: str,
) -> list[EventEnvelope]:
    """Decode rows (selected with `envelope_columns`), each with its offset, into envelopes."""
    return list(iter_envelopes(rows, registry, source=source))


def iter_envelopes(
    rows: Iterable[tuple[Row, RowOffset]],
    registry: SerializerRegistry,
    *,
    source: str,
    skip_filtered: bool = False,
) -> Iterator[EventEnvelope]:
    """Decode rows (selected with `envelope_columns`), each with its offset, into envelopes,
    one at a time; `skip_filtered` leaves out the rows an `EventFilter` left out.

    The one decoder of rows: `rows_to_envelopes` and `row_to_envelope` run it, and
    the slice query runs it over each part of a fetched batch (`PART` rows, turned
    into a list of envelopes at a time). A whole batch of envelopes alive at once
    would be promoted by the garbage collector, whose passes over them cost a
    catch-up about 1 us an event; a part stays under its first threshold.
    A payload is decoded with the registry's decoder for its serializer id and
    manifest, looked up once per call and pair (and not at all while the pair stays
    the one of the row before); if that fails (or the row has metadata), `decode_payloads`
    decodes the row and carries the `DeserializationError` naming the event.
    """
    decoders: dict[tuple[int, str], Callable[[bytes], Any] | None] = {}
    last_ser_id: int | None = None
    last_manifest: str | None = None
    last_decode: Callable[[bytes], Any] | None = None
    # A batch (the slice query's parts) whose JSON payloads orjson reads exactly: plain
    # JSON is decoded by `orjson.loads` itself, without `_loads`'s check per payload.
    plain_json: Callable[[bytes], Any] | None = None
    if type(rows) is list and rows:
        payloads = [p for row, _ in rows if (p := row[ROW_PAYLOAD]) is not None]
        if payloads and orjson_exact(payloads):
            plain_json = orjson.loads
    for row, offset in rows:
        if len(row) == _WITH_READ_TIME:  # a slice query's row: unpacked without a copy
            (
                pid, entity_type, slice_, seq_nr, db_timestamp, writer, tags, ser_id,
                manifest, meta_ser_id, meta_manifest, meta_payload, payload, _,
            ) = row  # fmt: skip
        else:
            (
                pid, entity_type, slice_, seq_nr, db_timestamp, writer, tags, ser_id,
                manifest, meta_ser_id, meta_manifest, meta_payload, payload,
            ) = row[:ROW_WIDTH]  # fmt: skip
        if ser_id == TOMBSTONE_SER_ID:  # 0: a tombstone or a filtered-out row, or neither
            if manifest == TOMBSTONE_MANIFEST:
                yield tombstone_envelope(
                    pid, entity_type, slice_, seq_nr, db_timestamp, writer, offset, source
                )
                continue
            if manifest == FILTERED_MANIFEST:  # `envelope_columns(matched=...)`: key only
                if not skip_filtered:
                    yield new_envelope(
                        pid, entity_type, slice_, seq_nr, db_timestamp, FILTERED, None,
                        FILTERED_MANIFEST, (), None, writer, offset, source, None, False,
                    )  # fmt: skip
                continue
        event: Any = NOT_LOADED
        metadata: Any = None
        error: DeserializationError | None = None
        decode: Callable[[bytes], Any] | None = None
        if payload is not None and meta_payload is None:
            if ser_id == last_ser_id and manifest == last_manifest:
                decode = last_decode
            else:
                key = (ser_id, manifest)
                if key in decoders:
                    decode = decoders[key]
                else:
                    decode = decoders[key] = registry.decoder(ser_id, manifest)
                    if plain_json is not None and is_plain_json(decode):
                        decode = decoders[key] = plain_json
                last_ser_id, last_manifest, last_decode = ser_id, manifest, decode
        if decode is not None:
            try:
                event = decode(payload)
            except Exception:
                decode = None  # decoded again below, for the error that names the event
        if decode is None:  # no payload, metadata, an unknown serializer id, or an error
            event, metadata, error = decode_payloads(
                registry, pid, seq_nr, ser_id, manifest, payload,
                meta_ser_id, meta_manifest, meta_payload,
            )  # fmt: skip
        # `new_envelope` without its call: this runs once for every event read.
        yield _new(
            EventEnvelope,
            (pid, entity_type, slice_, seq_nr, db_timestamp, event, ser_id, manifest,
             tuple(tags) if tags else (), metadata, writer, offset, source, error, False),
        )  # fmt: skip


_new = tuple.__new__
_WITH_READ_TIME = ROW_WIDTH + 1

"""The journal's rows as Spark sees them: one schema, both directions.

Partition readers get their rows (`sql.PARTITION_COLUMNS`) as Arrow record
batches (decoded in C by `arrow_read.py`) and reshape them here with Arrow compute,
column by column, so no row becomes a Python object on the way into Spark; the
projection sink turns those batches back into `EventEnvelope`s for the user's
handler. Keeping both here keeps the column list, its Spark DDL and its Arrow
types in one place.

Payloads written by the JSON serializer are already UTF-8 JSON: they go to
`event` as text (a cast that checks the UTF-8, nothing else). Any other
serializer's bytes go to `event_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from journal.durable_state import DurableStateChange, rows_to_changes
from journal.model import SNAPSHOT_SOURCE, EventEnvelope
from journal.rows import PAYLOAD_COLUMN, iter_envelopes
from journal.serialization import JSON_SERIALIZER_ID, SerializerRegistry

SCHEMA_DDL = (
    "persistence_id string, entity_type string, slice int, seq_nr long, "
    "db_timestamp timestamp, event string, event_bytes binary, ser_id int, "
    "ser_manifest string, tags array<string>, writer string, metadata string, "
    "deleted boolean"
)
ARROW_SCHEMA = pa.schema(
    [
        ("persistence_id", pa.string()),
        ("entity_type", pa.string()),
        ("slice", pa.int32()),
        ("seq_nr", pa.int64()),
        ("db_timestamp", pa.timestamp("us", tz="UTC")),
        ("event", pa.string()),
        ("event_bytes", pa.binary()),
        ("ser_id", pa.int32()),
        ("ser_manifest", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("writer", pa.string()),
        ("metadata", pa.string()),
        ("deleted", pa.bool_()),
    ]
)


# With `fromSnapshots`: one more column, true for an id's snapshot (its state in `event`
# or `event_bytes`, its seq_nr and db_timestamp those of the event it was taken at).
SNAPSHOTS_SCHEMA_DDL = SCHEMA_DDL + ", from_snapshot boolean"
SNAPSHOTS_ARROW_SCHEMA = ARROW_SCHEMA.append(pa.field("from_snapshot", pa.bool_()))

# With `read=durableState`: each id's latest durable state, one row per id.
STATE_SCHEMA_DDL = (
    "persistence_id string, entity_type string, slice int, revision long, "
    "db_timestamp timestamp, value string, value_bytes binary, ser_id int, "
    "ser_manifest string, tags array<string>, deleted boolean"
)
STATE_ARROW_SCHEMA = pa.schema(
    [
        ("persistence_id", pa.string()),
        ("entity_type", pa.string()),
        ("slice", pa.int32()),
        ("revision", pa.int64()),
        ("db_timestamp", pa.timestamp("us", tz="UTC")),
        ("value", pa.string()),
        ("value_bytes", pa.binary()),
        ("ser_id", pa.int32()),
        ("ser_manifest", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("deleted", pa.bool_()),
    ]
)

_TAGS = ARROW_SCHEMA.field("tags").type
_NO_TAGS = pa.scalar([], _TAGS)
_NO_BYTES = pa.scalar(None, pa.binary())


def _text_or_bytes(ser_ids: pa.Array, payloads: pa.Array) -> tuple[pa.Array, pa.Array]:
    """JSON payloads as text, the others' bytes apart (a NULL payload is NULL in both)."""
    is_json = pc.fill_null(pc.equal(ser_ids, JSON_SERIALIZER_ID), False)
    text = pc.if_else(is_json, payloads, _NO_BYTES).cast(pa.string())  # raises on bad UTF-8
    return text, pc.if_else(is_json, _NO_BYTES, payloads)


def spark_batch(rows: pa.RecordBatch, entity_type: str) -> pa.RecordBatch:
    """A partition's rows (`sql.PARTITION_COLUMNS`, by column name) of `entity_type` as a
    batch of `ARROW_SCHEMA`: payloads split by serializer, NULL tags as an empty list."""
    column = rows.column
    event, event_bytes = _text_or_bytes(column("event_ser_id"), column(PAYLOAD_COLUMN))
    # The driver's list type names its item field with the server's type: cast it away.
    tags = pc.if_else(pc.is_null(column("tags")), _NO_TAGS, column("tags").cast(_TAGS))
    columns = [
        column("persistence_id"),
        pa.repeat(pa.scalar(entity_type, pa.string()), rows.num_rows),
        column("slice"),
        column("seq_nr"),
        column("db_timestamp"),
        event,
        event_bytes,
        column("event_ser_id"),
        column("event_ser_manifest"),
        tags,
        column("writer"),
        column("meta_json").cast(pa.string()),  # raises on bad UTF-8
        column("deleted"),
    ]
    schema = ARROW_SCHEMA
    if "from_snapshot" in rows.schema.names:  # `sql.partition_rows` with `fromSnapshots`
        columns.append(column("from_snapshot"))
        schema = SNAPSHOTS_ARROW_SCHEMA
    return pa.RecordBatch.from_arrays(
        [c.cast(f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def state_batch(rows: pa.RecordBatch, entity_type: str) -> pa.RecordBatch:
    """A partition's durable state rows (`sql._STATE_COLUMNS`) as a batch of
    `STATE_ARROW_SCHEMA`, payloads split by serializer as events' are."""
    column = rows.column
    value, value_bytes = _text_or_bytes(column("state_ser_id"), column("state_payload"))
    tags = pc.if_else(pc.is_null(column("tags")), _NO_TAGS, column("tags").cast(_TAGS))
    columns = [
        column("persistence_id"),
        pa.repeat(pa.scalar(entity_type, pa.string()), rows.num_rows),
        column("slice"),
        column("revision"),
        column("db_timestamp"),
        value,
        value_bytes,
        column("state_ser_id"),
        pc.fill_null(column("state_ser_manifest"), ""),
        tags,
        column("deleted"),
    ]
    return pa.RecordBatch.from_arrays(
        [c.cast(f.type) for c, f in zip(columns, STATE_ARROW_SCHEMA, strict=True)],
        schema=STATE_ARROW_SCHEMA,
    )


def envelopes(batch: pa.RecordBatch, registry: SerializerRegistry) -> Iterator[EventEnvelope]:
    """The envelopes of a batch read by this source, decoded by the journal's one row
    decoder (`journal.rows.iter_envelopes`): payloads by `registry`, an undecodable one
    carrying the same `DeserializationError` as on every read path, a tombstone and a
    row the source's filter left out (`filteredEnvelopes`) as on every read path, and an
    id's snapshot (`fromSnapshots`) as `EventEnvelope.from_snapshot`."""
    cols = batch.to_pydict()
    decoded = iter_envelopes(
        (_journal_row(cols, i) for i in range(batch.num_rows)), registry, source="query"
    )
    snapshots = cols.get("from_snapshot")
    if snapshots is None:
        return decoded
    return (
        e._replace(source=SNAPSHOT_SOURCE) if snapshot else e
        for e, snapshot in zip(decoded, snapshots, strict=True)
    )


def changes(batch: pa.RecordBatch, registry: SerializerRegistry) -> Iterator[DurableStateChange]:
    """The durable state changes of a batch read with `read=durableState`, decoded by the
    store's one row decoder (`journal.durable_state.rows_to_changes`), as
    `changes_by_slices` delivers them (a deletion with `deleted`, an undecodable state
    with its `DeserializationError`)."""
    cols = batch.to_pydict()
    return rows_to_changes(
        (_state_row(cols, i) for i in range(batch.num_rows)), registry, source="query"
    )


def _state_row(cols: dict[str, list[Any]], i: int) -> tuple[tuple[Any, ...], None]:
    """Row `i` of a durable state batch in the store's column order
    (`journal.durable_state.STATE_COLUMNS`, then the payload), without an offset."""
    text = cols["value"][i]
    row = (
        cols["persistence_id"][i], cols["entity_type"][i], cols["slice"][i],
        cols["revision"][i], cols["db_timestamp"][i], cols["ser_id"][i],
        cols["ser_manifest"][i] or "", cols["tags"][i] or None, cols["deleted"][i],
        text.encode("utf-8") if text is not None else cols["value_bytes"][i],
    )  # fmt: skip
    return row, None


def _journal_row(cols: dict[str, list[Any]], i: int) -> tuple[tuple[Any, ...], None]:
    """Row `i` of a decoded batch in the journal's column order (`journal.rows.COLUMNS`,
    then the payload), without an offset: the source's rows have none."""
    text = cols["event"][i]
    meta = cols["metadata"][i]
    row = (
        cols["persistence_id"][i], cols["entity_type"][i], cols["slice"][i], cols["seq_nr"][i],
        cols["db_timestamp"][i], cols["writer"][i] or "", cols["tags"][i] or None,
        cols["ser_id"][i], cols["ser_manifest"][i] or "",
        None if meta is None else JSON_SERIALIZER_ID, None if meta is None else "",
        None if meta is None else meta.encode("utf-8"),
        text.encode("utf-8") if text is not None else cols["event_bytes"][i],
    )  # fmt: skip
    return row, None

"""The journal's rows as Spark sees them: one schema, both directions.

Partition readers turn the journal's select list into Arrow record batches
(measured ~1.6x faster into Spark than tuples); the projection sink turns
those batches back into `EventEnvelope`s for the user's handler. Keeping both
here keeps the column list, its Spark DDL and its Arrow types in one place.

Payloads written by the JSON serializer are already UTF-8 JSON: they go to
`event` as text, untouched. Any other serializer's bytes go to `event_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from journal.model import EventEnvelope
from journal.rows import decode_payloads
from journal.serialization import JSON_SERIALIZER_ID, SerializerRegistry

SCHEMA_DDL = (
    "persistence_id string, entity_type string, slice int, seq_nr long, "
    "db_timestamp timestamp, event string, event_bytes binary, ser_id int, "
    "ser_manifest string, tags array<string>, writer string, metadata string"
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
    ]
)


def _text(ser_id: int | None, payload: bytes | None) -> str | None:
    if payload is None or ser_id != JSON_SERIALIZER_ID:
        return None
    return bytes(payload).decode("utf-8")


def record_batch(rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """Journal rows (the `envelope_columns` select list) as one Arrow batch."""
    (
        pids,
        entity_types,
        slices,
        seq_nrs,
        timestamps,
        writers,
        tags,
        ser_ids,
        manifests,
        meta_ids,
        _meta_manifests,
        meta_payloads,
        payloads,
    ) = zip(*rows, strict=True) if rows else ((),) * 13
    events = [_text(s, p) for s, p in zip(ser_ids, payloads, strict=True)]
    raw = [None if e is not None else p for e, p in zip(events, payloads, strict=True)]
    metadata = [_text(s, p) for s, p in zip(meta_ids, meta_payloads, strict=True)]
    columns = [
        pids,
        entity_types,
        slices,
        seq_nrs,
        timestamps,
        events,
        raw,
        ser_ids,
        manifests,
        [list(t) if t else [] for t in tags],
        writers,
        metadata,
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, ARROW_SCHEMA, strict=True)],
        schema=ARROW_SCHEMA,
    )


def envelopes(batch: pa.RecordBatch, registry: SerializerRegistry) -> Iterator[EventEnvelope]:
    """The envelopes of a batch read by this source, payloads decoded by `registry`
    (an undecodable one carries the same `DeserializationError` as on every read path)."""
    cols = batch.to_pydict()
    for i in range(batch.num_rows):
        pid = cols["persistence_id"][i]
        seq_nr = cols["seq_nr"][i]
        ser_id = cols["ser_id"][i]
        manifest = cols["ser_manifest"][i] or ""
        text = cols["event"][i]
        payload = text.encode("utf-8") if text is not None else cols["event_bytes"][i]
        meta = cols["metadata"][i]
        event, metadata, error = decode_payloads(
            registry, pid, seq_nr, ser_id, manifest, payload,
            JSON_SERIALIZER_ID, "", None if meta is None else meta.encode("utf-8"),
        )  # fmt: skip
        yield EventEnvelope(
            pid, cols["entity_type"][i], cols["slice"][i], seq_nr, cols["db_timestamp"][i],
            event, ser_id, manifest, tuple(cols["tags"][i] or ()), metadata,
            cols["writer"][i] or "", None, "query", error,
        )  # fmt: skip

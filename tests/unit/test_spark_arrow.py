"""`arrow.spark_batch`: a partition's columns (`sql.PARTITION_COLUMNS`), as the ADBC driver
decodes them, reshaped into the source's Arrow schema column by column (pure: a
hand-built batch, no server)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from journal.errors import DeserializationError
from journal.model import TOMBSTONE_MANIFEST, TOMBSTONE_SER_ID
from journal.rows import PAYLOAD_COLUMN
from journal.serialization import BYTES_SERIALIZER_ID, JSON_SERIALIZER_ID, SerializerRegistry
from projections.spark.arrow import ARROW_SCHEMA, changes, envelopes, spark_batch, state_batch

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
# The driver names a text[]'s item field and tags every field with the server's type;
# `meta_json` is the metadata's payload when it is JSON (the statement's CASE).
_PG = {"POSTGRESQL:type": "varchar"}
_TEXT_ARRAY = pa.list_(pa.field("item", pa.string(), metadata={"POSTGRESQL:type": "text"}))
SELECT_LIST = pa.schema(
    [
        pa.field("persistence_id", pa.string(), metadata=_PG),
        pa.field("slice", pa.int32()),
        pa.field("seq_nr", pa.int64()),
        pa.field("db_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("writer", pa.string(), metadata=_PG),
        pa.field("tags", _TEXT_ARRAY),
        pa.field("event_ser_id", pa.int32()),
        pa.field("event_ser_manifest", pa.string(), metadata=_PG),
        pa.field("meta_json", pa.binary()),
        pa.field(PAYLOAD_COLUMN, pa.binary()),
        pa.field("deleted", pa.bool_()),
    ]
)


def _rows(*rows: dict[str, object]) -> pa.RecordBatch:
    defaults: dict[str, object] = {
        "persistence_id": "A|1", "slice": 7, "seq_nr": 1, "db_timestamp": T0, "writer": "w",
        "tags": None, "event_ser_id": JSON_SERIALIZER_ID, "event_ser_manifest": "",
        "meta_json": None, PAYLOAD_COLUMN: b"{}", "deleted": False,
    }  # fmt: skip
    full = [defaults | row for row in rows]
    return pa.RecordBatch.from_pylist(full, schema=SELECT_LIST)


def test_payloads_split_by_serializer_and_the_rest_passes_through() -> None:
    payload = json.dumps({"amount": 3, "note": "é ✓"}).encode()
    batch = spark_batch(
        _rows(
            {"seq_nr": 1, PAYLOAD_COLUMN: payload, "tags": ["t1", "t2"],
             "meta_json": b'{"m": 1}'},
            {"seq_nr": 2, "event_ser_id": BYTES_SERIALIZER_ID, PAYLOAD_COLUMN: b"\xff\x00raw",
             "event_ser_manifest": "bin"},
            {"seq_nr": 3, "event_ser_id": None, PAYLOAD_COLUMN: b"\x01", "writer": None},
            {"seq_nr": 4, PAYLOAD_COLUMN: None, "tags": []},
        ),
        "A",
    )  # fmt: skip
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert [r["event"] for r in rows] == [payload.decode(), None, None, None]
    assert [r["event_bytes"] for r in rows] == [None, b"\xff\x00raw", b"\x01", None]
    assert [r["ser_id"] for r in rows] == [JSON_SERIALIZER_ID, BYTES_SERIALIZER_ID, None, 31]
    assert [r["ser_manifest"] for r in rows] == ["", "bin", "", ""]
    assert [r["tags"] for r in rows] == [["t1", "t2"], [], [], []]
    assert [r["metadata"] for r in rows] == ['{"m": 1}', None, None, None]
    assert [r["writer"] for r in rows] == ["w", "w", None, "w"]
    assert [r["entity_type"] for r in rows] == ["A"] * 4
    assert [r["deleted"] for r in rows] == [False] * 4
    first = rows[0]
    assert (first["persistence_id"], first["entity_type"], first["slice"]) == ("A|1", "A", 7)
    assert (first["seq_nr"], first["db_timestamp"]) == (1, T0)


def test_an_empty_batch_keeps_the_schema() -> None:
    batch = spark_batch(pa.RecordBatch.from_pylist([], schema=SELECT_LIST), "A")
    assert batch.num_rows == 0 and batch.schema.equals(ARROW_SCHEMA)


def test_a_json_payload_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(pa.ArrowInvalid, match="Invalid UTF8"):
        spark_batch(_rows({PAYLOAD_COLUMN: b"\xff\xfe"}), "A")
    with pytest.raises(pa.ArrowInvalid, match="Invalid UTF8"):
        spark_batch(_rows({"meta_json": b"\xff\xfe"}), "A")


def test_a_tombstone_row_becomes_a_deleted_envelope() -> None:
    """`delete_all`'s tombstone (read because it is deleted *and* the tombstone's
    serializer) reaches a Spark handler as every reader delivers it: deleted, no event."""
    batch = spark_batch(
        _rows(
            {"seq_nr": 4, PAYLOAD_COLUMN: b'{"amount": 1}'},
            {"seq_nr": 5, "event_ser_id": TOMBSTONE_SER_ID,
             "event_ser_manifest": TOMBSTONE_MANIFEST, PAYLOAD_COLUMN: None, "deleted": True},
        ),
        "A",
    )  # fmt: skip
    event, tombstone = envelopes(batch, SerializerRegistry())
    assert (event.seq_nr, event.deleted, event.event) == (4, False, {"amount": 1})
    assert (tombstone.persistence_id, tombstone.seq_nr, tombstone.deleted) == ("A|1", 5, True)
    assert tombstone.event is None and tombstone.error is None
    assert tombstone.db_timestamp == T0 and tombstone.slice == 7


# A durable state partition's rows (`sql._STATE_COLUMNS`) as the driver returns them.
STATE_SELECT_LIST = pa.schema(
    [
        pa.field("persistence_id", pa.string(), metadata=_PG),
        pa.field("slice", pa.int32()),
        pa.field("revision", pa.int64()),
        pa.field("db_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("tags", _TEXT_ARRAY),
        pa.field("state_ser_id", pa.int32()),
        pa.field("state_ser_manifest", pa.string(), metadata=_PG),
        pa.field("state_payload", pa.binary()),
        pa.field("deleted", pa.bool_()),
    ]
)


def _state_rows(*rows: dict[str, object]) -> pa.RecordBatch:
    defaults: dict[str, object] = {
        "persistence_id": "Cart|1", "slice": 7, "revision": 1, "db_timestamp": T0,
        "tags": None, "state_ser_id": JSON_SERIALIZER_ID, "state_ser_manifest": None,
        "state_payload": b'{"items":1}', "deleted": False,
    }  # fmt: skip
    return pa.RecordBatch.from_pylist([defaults | row for row in rows], schema=STATE_SELECT_LIST)


def test_state_rows_come_back_as_the_changes_the_store_decodes() -> None:
    """`state_batch` then `changes` (the sink of `project_changes`): JSON and other
    serializers' states, a deletion, an undecodable state — each as the changes query
    delivers it (`source` "query", no offset)."""
    rows = _state_rows(
        {"tags": ["t"]},
        {"persistence_id": "Cart|2", "revision": 4, "state_ser_id": BYTES_SERIALIZER_ID,
         "state_payload": b"\x00\xff"},
        {"persistence_id": "Cart|3", "revision": 2, "state_payload": None, "deleted": True,
         "state_ser_id": 0},
        {"persistence_id": "Cart|4", "state_ser_id": 9999},
    )  # fmt: skip
    batch = state_batch(rows, "Cart")
    got = list(changes(batch, SerializerRegistry()))
    assert [(c.persistence_id, c.revision, c.value, c.deleted) for c in got[:3]] == [
        ("Cart|1", 1, {"items": 1}, False),
        ("Cart|2", 4, b"\x00\xff", False),
        ("Cart|3", 2, None, True),
    ]
    first = got[0]
    assert (first.entity_type, first.slice, first.db_timestamp, first.tags) == (
        "Cart", 7, T0, ("t",),
    )  # fmt: skip
    assert first.source == "query" and first.offset is None and first.error is None
    undecodable = got[3]
    assert undecodable.error is not None and not undecodable.deleted
    with pytest.raises(DeserializationError):
        undecodable.decoded_value()

"""The Spark source's event filter (issue 30), pure: options `manifests`, `tags`, `where`
and `filteredEnvelopes` parsed at `load()`, pushed `ser_manifest` filters, the
partition statement (the filter's condition, or the filtered rows as keys only) and
a key-only row turned into a `FILTERED` envelope for the sink. No server, no JVM."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, In

from journal import EventFilter
from journal.model import FILTERED, FILTERED_MANIFEST, FILTERED_SER_ID
from journal.rows import PAYLOAD_COLUMN
from journal.serialization import JSON_SERIALIZER_ID, SerializerRegistry
from projections.spark.arrow import envelopes, spark_batch
from projections.spark.options import SourceOptionError, filter_options, parse_options
from projections.spark.source import narrow
from projections.spark.sql import ReadPlan, partition_rows

BASE = {"dsn": "postgresql://u@h/db", "entityType": "Shop"}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, None),
        ({"manifests": "shop.A, shop.B"}, EventFilter(manifests=("shop.A", "shop.B"))),
        ({"tags": '["vip", "a,b"]'}, EventFilter(tags=("vip", "a,b"))),
        ({"where": "seq_nr > 1", "MANIFESTS": "x"}, EventFilter(("x",), where="seq_nr > 1")),
        ({"manifests": " , ", "where": " "}, None),
    ],
)
def test_filter_options_build_an_event_filter(
    options: dict[str, str], expected: EventFilter | None
) -> None:
    parsed = parse_options(BASE | options)
    assert parsed.event_filter == expected and not parsed.filtered_envelopes
    if expected is not None:  # what `project` passes reads back the same
        assert parse_options(BASE | filter_options(expected)).event_filter == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tags": "[1]"}, "'tags' must be a JSON list"),
        ({"manifests": "[broken"}, "'manifests' must be a JSON list"),
        ({"filteredEnvelopes": "yes"}, "filteredEnvelopes"),
    ],
)
def test_bad_filter_options_fail_at_load(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        parse_options(BASE | options)


def _sql(plan: ReadPlan) -> tuple[str, dict[str, object]]:
    statement, params = partition_rows(plan)
    return statement.as_string(None), params


def test_the_partition_statement_applies_the_filter_or_reads_keys() -> None:
    filtered = {"manifests": "shop.A", "tags": "vip", "where": "seq_nr % 2 = 0"}
    options = parse_options(BASE | filtered)
    text, params = _sql(ReadPlan(options, options.slice_range, None))
    assert "event_ser_manifest = ANY(%(filter_manifests)s::text[])" in text
    assert "tags && %(filter_tags)s::text[]" in text and "(seq_nr %% 2 = 0)" in text
    assert text.count("CASE WHEN") == 1  # the metadata's only: left out, not read at all
    assert params["filter_manifests"] == ["shop.A"] and params["filter_tags"] == ["vip"]

    keyed = parse_options(BASE | {"manifests": "shop.A", "filteredEnvelopes": "true"})
    text, params = _sql(ReadPlan(keyed, keyed.slice_range, None))
    assert (
        text.count("CASE WHEN") == 5
        and "THEN tags END" in text
        and f"'{FILTERED_MANIFEST}'" in text
    )
    assert "AS event_payload" in text and params["filter_manifests"] == ["shop.A"]


def test_pushed_manifest_filters_narrow_the_read_unless_keys_are_read() -> None:
    options = parse_options(BASE)
    pushed = [In(("ser_manifest",), ("shop.A", "shop.B")), EqualTo(("ser_manifest",), "shop.B")]
    narrowing, rest = narrow(options, pushed)
    assert narrowing.manifests == ("shop.B",) and rest == [] and not narrowing.empty
    text, params = _sql(ReadPlan(options, options.slice_range, None, manifests=("shop.B",)))
    assert "event_ser_manifest = ANY(%(pushed_manifests)s::text[])" in text
    assert params["pushed_manifests"] == ["shop.B"]
    narrowing, _ = narrow(options, [*pushed, EqualTo(("ser_manifest",), "shop.C")])
    assert narrowing.empty
    narrowing, rest = narrow(options, [EqualTo(("ser_manifest",), 3)])
    assert narrowing.manifests is None and len(rest) == 1
    # Keys read as `slicejournal.filtered`: Spark evaluates the filter itself.
    keyed = parse_options(BASE | {"tags": "vip", "filteredEnvelopes": "true"})
    narrowing, rest = narrow(keyed, pushed)
    assert narrowing.manifests is None and rest == pushed


def test_pushed_manifest_filters_on_durable_state_and_snapshots_name_their_columns() -> None:
    """The pushed `ser_manifest` filter reads the column each kind of row keeps it in:
    the durable state's may be NULL, which the source shows as ''."""
    state = parse_options(BASE | {"read": "durableState"})
    text, params = _sql(ReadPlan(state, state.slice_range, None, manifests=("", "cart.v1")))
    assert "coalesce(state_ser_manifest, '') = ANY(%(pushed_manifests)s::text[])" in text
    assert params["pushed_manifests"] == ["", "cart.v1"]
    assert "ORDER BY db_timestamp, revision" in text
    snapshots = parse_options(BASE | {"fromSnapshots": "true"})
    text, _ = _sql(ReadPlan(snapshots, snapshots.slice_range, None, manifests=("shop.A",)))
    assert "event_ser_manifest = ANY(" in text and " ser_manifest = ANY(" in text
    assert "s.db_timestamp <=" not in text  # unbounded: every snapshot covers its events
    bounded = ReadPlan(snapshots, snapshots.slice_range, None, to_inclusive=datetime.now(UTC))
    assert "s.db_timestamp <= %(to_ts)s" in _sql(bounded)[0]


def test_a_key_only_row_becomes_a_filtered_envelope() -> None:
    t0 = datetime(2026, 1, 2, tzinfo=UTC)
    schema = pa.schema(
        [
            ("persistence_id", pa.string()), ("slice", pa.int32()), ("seq_nr", pa.int64()),
            ("db_timestamp", pa.timestamp("us", tz="UTC")), ("writer", pa.string()),
            ("tags", pa.list_(pa.string())), ("event_ser_id", pa.int32()),
            ("event_ser_manifest", pa.string()), ("meta_json", pa.binary()),
            (PAYLOAD_COLUMN, pa.binary()), ("deleted", pa.bool_()),
        ]
    )  # fmt: skip
    rows = [
        {"persistence_id": "Shop|1", "slice": 3, "seq_nr": 1, "db_timestamp": t0,
         "writer": "w", "tags": ["vip"], "event_ser_id": JSON_SERIALIZER_ID,
         "event_ser_manifest": "", "meta_json": None, PAYLOAD_COLUMN: b'{"n": 1}',
         "deleted": False},
        {"persistence_id": "Shop|1", "slice": 3, "seq_nr": 2, "db_timestamp": t0,
         "writer": "w", "tags": None, "event_ser_id": FILTERED_SER_ID,
         "event_ser_manifest": FILTERED_MANIFEST, "meta_json": None, PAYLOAD_COLUMN: None,
         "deleted": False},
    ]  # fmt: skip
    batch = spark_batch(pa.RecordBatch.from_pylist(rows, schema=schema), "Shop")
    kept, left_out = envelopes(batch, SerializerRegistry())
    assert kept.event == {"n": 1} and not kept.filtered and kept.tags == ("vip",)
    assert left_out.filtered and left_out.event is FILTERED and left_out.error is None
    assert (left_out.persistence_id, left_out.seq_nr, left_out.deleted) == ("Shop|1", 2, False)

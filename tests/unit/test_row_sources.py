"""The slice machine's row sources: events and durable state changes in the same positions,
each source's statements over its own table, and the state rows' decoding."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from journal import DurableStateChange, JournalSettings, SerializerRegistry
from journal.durable_state import STATE_COLUMNS, rows_to_changes, state_params
from journal.errors import InvalidArgument
from journal.model import NOT_LOADED, TimestampOffset
from journal.query.by_slice import BucketsQuery, RowsQuery
from journal.query.source import EVENTS, EVENTS_FROM_SNAPSHOTS, STATE_CHANGES
from journal.rows import COLUMNS, ROW_DB_TIMESTAMP, ROW_PID, ROW_SEQ_NR
from journal.tables import Tables

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TABLES = Tables(JournalSettings(schema="s", durable_state_table="states"))


@pytest.mark.timeout(10)
def test_state_rows_sit_in_the_positions_the_machine_reads() -> None:
    for position in (ROW_PID, ROW_SEQ_NR, ROW_DB_TIMESTAMP):
        assert {COLUMNS[position], STATE_COLUMNS[position]} <= {
            "persistence_id",
            "seq_nr",
            "revision",
            "db_timestamp",
        }
    assert STATE_COLUMNS[ROW_SEQ_NR] == "revision"


@pytest.mark.timeout(10)
def test_each_source_reads_its_own_table() -> None:
    query = RowsQuery(False, T0, {"Cart|1": 2}, None, None, timedelta(0), 10)
    state, _ = STATE_CHANGES.rows(TABLES, "Cart", 0, 1023, query, None)
    events, _ = EVENTS.rows(TABLES, "Cart", 0, 1023, query, None)
    assert '"s"."states"' in state.as_string(None)
    assert "ORDER BY db_timestamp, revision" in state.as_string(None)
    assert '"s"."event_journal"' in events.as_string(None)
    buckets = BucketsQuery(T0, None, 10)
    assert '"s"."states"' in STATE_CHANGES.buckets(TABLES, "Cart", 0, 1, buckets, timedelta(0))[
        0
    ].as_string(None)
    # The horizon waits for the writers of the table the source reads.
    assert STATE_CHANGES.horizon(TABLES, "reader")[1]["table"] == "states"
    assert EVENTS.horizon(TABLES, "reader")[1]["table"] == "event_journal"


@pytest.mark.timeout(10)
def test_state_rows_decode_into_changes() -> None:
    registry = SerializerRegistry()
    offset = TimestampOffset(T0, T0, {"Cart|1": 3})
    payload = state_params(registry, "Cart|1", 3, {"n": 1}, ())["payload"]
    rows = [
        (("Cart|1", "Cart", 7, 3, T0, 31, "", None, False, payload, T0), offset),
        (("Cart|2", "Cart", 8, 5, T0, 0, "", None, True, b"", T0), offset),
        (("Cart|3", "Cart", 9, 2, T0, 31, "", ["t"], False, None, T0), offset),
    ]
    one, deleted, backtracked = rows_to_changes(rows, registry, source="query")
    assert (one.value, one.seq_nr, one.deleted, one.offset) == ({"n": 1}, 3, False, offset)
    assert (deleted.value, deleted.deleted) == (None, True)
    assert backtracked.value is NOT_LOADED and not backtracked.value_loaded
    assert backtracked.tags == ("t",)
    heartbeat = STATE_CHANGES.heartbeat("Cart", 0, offset)
    assert isinstance(heartbeat, DurableStateChange) and heartbeat.is_heartbeat


@pytest.mark.timeout(10)
def test_a_write_is_checked_before_anything_is_written() -> None:
    registry = SerializerRegistry()
    for revision in (0, -1, True, 1.0):
        with pytest.raises(InvalidArgument):
            state_params(registry, "Cart|1", revision, {}, ())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        state_params(registry, "Cart|1", 1, None, ())
    with pytest.raises(InvalidArgument):
        state_params(registry, "Cart|1", 1, {}, "tag")
    assert state_params(registry, "Cart|1", 2, None, (), delete=True)["payload"] == b""


@pytest.mark.timeout(10)
def test_each_source_names_the_slices_of_its_range_one_by_one() -> None:
    """`slice = ANY(...)` of exactly min..max (PostgreSQL before 18 then reads one bounded
    scan per slice instead of the whole range's index): rows, bucket counts, states."""
    query = RowsQuery(False, T0, {}, None, None, timedelta(0), 10)
    buckets = BucketsQuery(T0, None, None, 10)
    for statement, params in (
        EVENTS.rows(TABLES, "Cart", 3, 6, query, None),
        EVENTS_FROM_SNAPSHOTS.rows(TABLES, "Cart", 3, 6, query, None),
        STATE_CHANGES.rows(TABLES, "Cart", 3, 6, query, None),
        EVENTS.buckets(TABLES, "Cart", 3, 6, buckets, timedelta(0)),
        STATE_CHANGES.buckets(TABLES, "Cart", 3, 6, buckets, timedelta(0)),
    ):
        assert "slice = ANY(%(slices)s::int[])" in statement.as_string(None)
        assert params["slices"] == "{3,4,5,6}"
    snapshots, _ = EVENTS_FROM_SNAPSHOTS.rows(TABLES, "Cart", 3, 6, query, None)
    assert "BETWEEN" not in snapshots.as_string(None)  # the snapshot table's scans too
    assert EVENTS.rows(TABLES, "Cart", 7, 7, query, None)[1]["slices"] == "{7}"
    every = EVENTS.rows(TABLES, "Cart", 0, 1023, query, None)[1]["slices"]
    assert [int(s) for s in every.strip("{}").split(",")] == list(range(1024))

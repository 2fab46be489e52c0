"""The Spark source's pure decisions: options, partition ranges, stream offsets."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime, timedelta

import pytest

from journal.slices import SliceRange
from projections.spark.offsets import (
    ONE_MICROSECOND,
    UNKNOWN_WINDOW,
    StreamOffset,
    end_timestamp,
    initial_offset,
    reread_from,
)
from projections.spark.options import SourceOptionError, parse_options

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_options_are_case_insensitive_and_pickle() -> None:
    options = parse_options({"DSN": "x", "entitytype": "A", "MINSLICE": "3", "maxslice": "9"})
    assert options.slice_range == SliceRange(3, 9)
    assert pickle.loads(pickle.dumps(options)) == options


def test_offsets_serialise_with_a_fixed_key_order() -> None:
    offset = StreamOffset(T0, 7)
    text = json.dumps(offset.to_json())
    assert text == '{"timestamp": "2026-01-01T00:00:00+00:00", "window": 7}'
    assert StreamOffset.from_json(json.loads(text)) == offset
    with pytest.raises(SourceOptionError):
        StreamOffset.from_json({"ts": 1})


def test_end_never_splits_a_timestamp_and_never_moves_back() -> None:
    start = StreamOffset(T0, 0)
    later = T0 + timedelta(seconds=5)
    assert end_timestamp(start, None, None, None) == T0
    assert end_timestamp(start, later, None, None) == later + ONE_MICROSECOND
    # The limit-th row shares the start's timestamp: the batch takes that whole timestamp.
    assert end_timestamp(start, later, T0, None) == T0 + ONE_MICROSECOND
    assert end_timestamp(start, later, T0 + timedelta(seconds=1), None) == T0 + timedelta(seconds=1)
    assert end_timestamp(start, later, None, T0 + timedelta(seconds=2)) == T0 + timedelta(seconds=2)
    assert end_timestamp(StreamOffset(later, 0), later, None, T0) == later


def test_late_rows_in_the_window_make_the_batch_reread_it() -> None:
    options = parse_options({"dsn": "x", "entityType": "A", "backtrackingWindow": "60"})
    start = StreamOffset(T0 + timedelta(hours=1), 10)
    assert reread_from(start, 10, options) == start.timestamp
    assert reread_from(start, 11, options) == start.timestamp - timedelta(seconds=60)
    first = initial_offset(options)
    assert first.window == UNKNOWN_WINDOW
    assert reread_from(first, 0, options) == first.timestamp  # nothing before the epoch

"""Projection settings, validated when built; defaults are Pekko Projection's."""

from __future__ import annotations

from datetime import timedelta

import attrs

from journal.settings import _positive_int, duration_field


@attrs.frozen
class ProjectionSettings:
    """How a projection batches, saves offsets, cleans up and watches for pause."""

    # Offset rows (and in-memory records) older than this, per slice, are removed.
    time_window: timedelta = duration_field(timedelta(minutes=5), allow_zero=False)
    # Grouped exactly-once: a transaction per this many envelopes or this long.
    group_after_envelopes: int = attrs.field(default=20, validator=_positive_int)
    group_after_duration: timedelta = duration_field(timedelta(milliseconds=500))
    # At-least-once: save offsets after this many envelopes or this long.
    save_offset_after_envelopes: int = attrs.field(default=100, validator=_positive_int)
    save_offset_after_duration: timedelta = duration_field(timedelta(milliseconds=500))
    # How often old offset rows are deleted.
    cleanup_interval: timedelta = duration_field(timedelta(seconds=30), allow_zero=False)
    # How often a running instance checks projection_management for pause.
    management_poll_interval: timedelta = duration_field(timedelta(seconds=1), allow_zero=False)
    # Progress markers of quiet slices are refreshed at most this often.
    progress_interval: timedelta = duration_field(timedelta(seconds=5), allow_zero=False)
    # How often a running instance reads its range's backlog for its telemetry (only
    # when the telemetry asks for samples: never with telemetry off).
    backlog_sample_interval: timedelta = duration_field(timedelta(seconds=5), allow_zero=False)
    # Envelopes buffered between the stream and the handler.
    buffer: int = attrs.field(default=1000, validator=_positive_int)

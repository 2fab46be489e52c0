"""Projection settings, validated when built; defaults are Pekko Projection's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs

from journal.settings import _non_negative, _positive_int, duration_field, to_timedelta


def _optional_duration(value: timedelta | float | int | None) -> timedelta | None:
    return None if value is None else to_timedelta(value)


def optional_duration_field(default: timedelta | None) -> Any:
    """A duration that may be None (off); validated like `duration_field` otherwise."""
    return attrs.field(
        default=default,
        converter=_optional_duration,
        validator=attrs.validators.optional(_non_negative),
    )


@attrs.frozen
class ProjectionSettings:
    """How a projection batches, saves offsets, cleans up and watches for pause."""

    # Offset rows (and in-memory records) older than this, per slice, are removed.
    time_window: timedelta = duration_field(timedelta(minutes=5), allow_zero=False)
    # Beside the time window (Akka's delete-after-consumed): a row outside the window
    # is deleted only once it was consumed (stored) at least this long ago. None: at
    # once. Memory still keeps only the window; an unknown pid is then looked up in
    # the table, so a projection replaying old events keeps knowing what it handled.
    delete_after_consumed: timedelta | None = optional_duration_field(None)
    # A seq_nr 1 (or a reset tombstone) whose db_timestamp is later than the pid's
    # handled event by at least this starts a new lifetime of a reset id instead of
    # being a duplicate (a replay of the original seq_nr 1 is never later). None: off.
    accept_sequence_number_reset_after: timedelta | None = optional_duration_field(timedelta(0))
    # An envelope rejected because events before it are not visible yet (and not shown
    # deleted) is retried this often, besides whenever its pid's predecessor arrives.
    rejected_retry_interval: timedelta = duration_field(timedelta(seconds=2), allow_zero=False)
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

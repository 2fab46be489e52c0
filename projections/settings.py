"""Projection settings, validated when built; defaults are Pekko Projection's.

The names of the projections' tables are settings here too, not the
journal's: the journal knows nothing of projections (`projections/tables.py`
turns these names into identifiers).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from journal.durations import (
    name_duration_fields,
    non_negative,
    positive,
    to_optional_timedelta,
    to_timedelta,
)
from journal.errors import InvalidSettings
from journal.settings import _identifier, _positive_int

if TYPE_CHECKING:
    from journal.tables import Tables
    from projections.tables import ProjectionTables


@attrs.frozen
class ProjectionTableNames:
    """The names of the projections' tables in the journal's schema (validated like the
    journal's own: non-empty, within PostgreSQL's 63 bytes, no NUL or '%').

    The projection registry, the lease epoch sequence and the fence function are
    named after the management and lease tables (`projections/tables.py`).
    """

    offset_table: str = attrs.field(
        default="projection_timestamp_offset_store", validator=_identifier
    )
    management_table: str = attrs.field(default="projection_management", validator=_identifier)
    dead_letter_table: str = attrs.field(default="projection_dead_letter", validator=_identifier)
    # The projection fleet: desired instance counts, live workers, slice-range leases.
    fleet_table: str = attrs.field(default="projection_fleet", validator=_identifier)
    fleet_worker_table: str = attrs.field(default="projection_fleet_worker", validator=_identifier)
    lease_table: str = attrs.field(default="projection_lease", validator=_identifier)
    # The schema component these name the tables of (`journal.schema.ComponentNames`).
    component: ClassVar[str] = "projections"

    def in_schema(self, journal: Tables) -> ProjectionTables:
        """These names placed in the schema of `journal` (a journal's `tables`): what
        `Journal.create_schema(tables=[ProjectionTableNames(...)])` does with them."""
        from projections.tables import ProjectionTables  # it imports this module

        return ProjectionTables(journal, self)

    def key_names(self) -> tuple[str, ...]:
        """The names in the order of the migration key `projections(...)`: existing
        databases recorded their version under it, so the order never changes."""
        return (
            self.offset_table,
            self.management_table,
            self.dead_letter_table,
            self.fleet_table,
            self.fleet_worker_table,
            self.lease_table,
        )


def _table_names(instance: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, ProjectionTableNames):
        raise InvalidSettings(f"{attribute.name} must be ProjectionTableNames, got {value!r}")


@attrs.frozen(field_transformer=name_duration_fields)
class ProjectionSettings:
    """How a projection batches, saves offsets, cleans up and watches for pause."""

    # Offset rows (and in-memory records) older than this, per slice, are removed.
    time_window: timedelta = attrs.field(
        default=timedelta(minutes=5), converter=to_timedelta, validator=positive
    )
    # Beside the time window (Akka's delete-after-consumed): a row outside the window
    # is deleted only once it was consumed (stored) at least this long ago. None: at
    # once. Memory still keeps only the window; an unknown pid is then looked up in
    # the table, so a projection replaying old events keeps knowing what it handled.
    delete_after_consumed: timedelta | None = attrs.field(
        default=None, converter=to_optional_timedelta, validator=non_negative
    )
    # A seq_nr 1 (or a reset tombstone) whose db_timestamp is later than the pid's
    # handled event by at least this starts a new lifetime of a reset id instead of
    # being a duplicate (a replay of the original seq_nr 1 is never later). None: off.
    accept_sequence_number_reset_after: timedelta | None = attrs.field(
        default=timedelta(0), converter=to_optional_timedelta, validator=non_negative
    )
    # An envelope rejected because events before it are not visible yet (and not shown
    # deleted) is retried this often, besides whenever its pid's predecessor arrives.
    rejected_retry_interval: timedelta = attrs.field(
        default=timedelta(seconds=2), converter=to_timedelta, validator=positive
    )
    # Grouped exactly-once: a transaction per this many envelopes or this long.
    group_after_envelopes: int = attrs.field(default=20, validator=_positive_int)
    group_after_duration: timedelta = attrs.field(
        default=timedelta(milliseconds=500), converter=to_timedelta, validator=non_negative
    )
    # At-least-once: save offsets after this many envelopes or this long.
    save_offset_after_envelopes: int = attrs.field(default=100, validator=_positive_int)
    save_offset_after_duration: timedelta = attrs.field(
        default=timedelta(milliseconds=500), converter=to_timedelta, validator=non_negative
    )
    # How often old offset rows are deleted.
    cleanup_interval: timedelta = attrs.field(
        default=timedelta(seconds=30), converter=to_timedelta, validator=positive
    )
    # How often a running instance checks projection_management for pause.
    management_poll_interval: timedelta = attrs.field(
        default=timedelta(seconds=1), converter=to_timedelta, validator=positive
    )
    # Progress markers of quiet slices are refreshed at most this often.
    progress_interval: timedelta = attrs.field(
        default=timedelta(seconds=5), converter=to_timedelta, validator=positive
    )
    # How often a running instance reads its range's backlog for its telemetry (only
    # when the telemetry asks for samples: never with telemetry off).
    backlog_sample_interval: timedelta = attrs.field(
        default=timedelta(seconds=5), converter=to_timedelta, validator=positive
    )
    # Envelopes buffered between the stream and the handler: about that many, in parts
    # of up to 50 (the queue holds ceil(buffer / 50) parts, at least 2).
    buffer: int = attrs.field(default=1000, validator=_positive_int)
    # Where the offsets, management, dead letters and leases live (in the journal's schema).
    tables: ProjectionTableNames = attrs.field(factory=ProjectionTableNames, validator=_table_names)

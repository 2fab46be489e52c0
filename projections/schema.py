"""The projections' part of the database schema (offsets, management, dead letters,
the fleet's leases): its migrations live in `projections/migrations/`, applied
with the journal's by `slicejournal migrate` (registered under the
`slicejournal.schema` entry-point group, so the journal need not know of it)."""

from journal.schema import Component

PROJECTIONS = Component(
    "projections",
    "projections",
    (
        "offset_table",
        "management_table",
        "dead_letter_table",
        "fleet_table",
        "fleet_worker_table",
        "lease_table",
    ),
    order=10,
)

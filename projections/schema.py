"""The projections' part of the database schema (offsets, management, dead letters,
the fleet's leases): its migrations live in `projections/migrations/`, applied
with the journal's by `slicejournal migrate` (registered under the
`slicejournal.schema` entry-point group, so the journal need not know of it).
Its tables are named by `ProjectionTables` (the defaults unless a caller
passes its own to `Journal.create_schema(tables=...)`)."""

from journal.schema import Component
from projections.tables import ProjectionTables

PROJECTIONS = Component("projections", "projections", ProjectionTables, order=10)

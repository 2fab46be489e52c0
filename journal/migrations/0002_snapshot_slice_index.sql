-- slicejournal 0.2.0: the snapshot table's slice index, as in Pekko Persistence R2DBC's
-- DDL, for reading snapshots by slice range (start-from-snapshot projections, retention).
-- Additive: it builds an index and changes no row. Building it briefly blocks writes to
-- the snapshot table (one row per persistence id, so it is quick); it does not touch the
-- event journal, so appends and projections go on meanwhile.
-- Placeholders (names in curly brackets) are filled in with quoted identifiers.
-- Never edit a shipped migration: add the next number instead.

CREATE INDEX IF NOT EXISTS {snapshot_slice_idx}
  ON {snapshot} (slice, entity_type, db_timestamp);

-- slicejournal 0.3.0: the projection registry, which retention reads to know which
-- projections hold back the deletion of events (see projections/retention.py).
-- A projection is registered implicitly by storing offsets; a row here registers one
-- explicitly (with its entity type and slice range, before it has stored anything) or
-- retires one (retired = true: its offsets stop holding retention). Additive: it creates
-- a table and changes no row.
-- Placeholders (names in curly brackets) are filled in with quoted identifiers.
-- Never edit a shipped migration: add the next number instead.

CREATE TABLE IF NOT EXISTS {registry} (
  projection_name VARCHAR(255) PRIMARY KEY,
  -- NULL: not known (a retired projection that was never registered explicitly).
  entity_type VARCHAR(255),
  min_slice INT NOT NULL,
  max_slice INT NOT NULL,
  retired BOOLEAN NOT NULL DEFAULT FALSE,
  updated_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
  CHECK (0 <= min_slice AND min_slice <= max_slice AND max_slice <= 1023)
);

-- slicejournal 0.3.0: what a running projection reads, recorded by its instances in the
-- management row of key '*' (as its event filter is): NULL for the journal's events,
-- 'durable_state' for the durable state's changes (`Projection.*_changes`). `status`
-- and management's backlog then measure the projection against the rows it reads.
-- Additive: one nullable column, no row changed, no table rewrite.
-- Placeholders (names in curly brackets) are filled in with quoted identifiers.
-- Never edit a shipped migration: add the next number instead.

ALTER TABLE {management} ADD COLUMN IF NOT EXISTS reads TEXT;

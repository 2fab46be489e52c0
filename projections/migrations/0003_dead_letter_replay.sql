-- slicejournal 0.3.0: dead-letter replay (`ProjectionManagement.replay_dead_letters`,
-- `slicejournal dead-letters replay`). An operator marks letters for replay
-- (replay_requested_at); the running instance that owns the letter's slice hands the
-- envelope to its handler again and marks it replayed (replayed_at), in the handler's
-- transaction for exactly-once and grouped projections; a replay that fails keeps the
-- letter parked with the new error and counts it (replay_failures).
-- Additive: nullable or defaulted columns, no row changed, no table rewrite.
-- Placeholders (names in curly brackets) are filled in with quoted identifiers.
-- Never edit a shipped migration: add the next number instead.

ALTER TABLE {dead_letter} ADD COLUMN IF NOT EXISTS replay_requested_at TIMESTAMP WITH TIME ZONE;
ALTER TABLE {dead_letter} ADD COLUMN IF NOT EXISTS replayed_at TIMESTAMP WITH TIME ZONE;
ALTER TABLE {dead_letter} ADD COLUMN IF NOT EXISTS replay_failures INT NOT NULL DEFAULT 0;

-- The event filter of a running projection (`EventFilter` as JSON: manifests, tags,
-- where), recorded by its instances in the row of key '*' (inserted not paused if
-- there was none; NULL again when it runs without one), so `status` shows it and the
-- backlog counts only the events it lets through. Not the registry: a row there
-- registers a projection for retention.
ALTER TABLE {management} ADD COLUMN IF NOT EXISTS event_filter JSONB;

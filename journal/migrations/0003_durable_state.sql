-- slicejournal 0.3.0: the durable state store's table, as in Pekko Persistence R2DBC's
-- PostgreSQL DDL (primary key persistence_id, as Akka Persistence R2DBC 1.3 has it): one
-- row per id holding its latest revision, and the slice index the changes query reads.
-- Additive: it creates a table and its index and changes no existing row.
-- Placeholders (names in curly brackets) are filled in with quoted identifiers.
-- Never edit a shipped migration: add the next number instead.

CREATE TABLE IF NOT EXISTS {durable_state} (
  slice INT NOT NULL,
  entity_type VARCHAR(255) NOT NULL,
  persistence_id VARCHAR(255) NOT NULL,
  revision BIGINT NOT NULL,
  db_timestamp TIMESTAMP WITH TIME ZONE NOT NULL,

  state_ser_id INTEGER NOT NULL,
  state_ser_manifest VARCHAR(255),
  state_payload BYTEA NOT NULL,
  tags TEXT ARRAY,

  PRIMARY KEY (persistence_id)
);

-- The changes query's index: one range scan per slice range, ordered by time.
CREATE INDEX IF NOT EXISTS {durable_state_slice_idx}
  ON {durable_state} (slice, entity_type, db_timestamp, revision);

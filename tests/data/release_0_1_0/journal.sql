-- slicejournal: event journal and snapshots.
-- Column names and types follow Pekko Persistence R2DBC's PostgreSQL DDL, so a JVM
-- service using that plugin and Python workers can share one journal.
-- Placeholders (names in curly brackets) are filled in by `slicejournal init` as quoted identifiers.

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {event_journal} (
  slice INT NOT NULL,
  entity_type VARCHAR(255) NOT NULL,
  persistence_id VARCHAR(255) NOT NULL,
  seq_nr BIGINT NOT NULL,
  db_timestamp TIMESTAMP WITH TIME ZONE NOT NULL,

  event_ser_id INTEGER NOT NULL,
  event_ser_manifest VARCHAR(255) NOT NULL,
  event_payload BYTEA NOT NULL,

  deleted BOOLEAN DEFAULT FALSE NOT NULL,
  writer VARCHAR(255) NOT NULL,
  adapter_manifest VARCHAR(255),
  tags TEXT ARRAY,

  meta_ser_id INTEGER,
  meta_ser_manifest VARCHAR(255),
  meta_payload BYTEA,

  PRIMARY KEY (persistence_id, seq_nr)
);

-- The slice query's index: one range scan per slice range, ordered by time.
CREATE INDEX IF NOT EXISTS {event_journal_slice_idx}
  ON {event_journal} (slice, entity_type, db_timestamp, seq_nr);

CREATE TABLE IF NOT EXISTS {snapshot} (
  slice INT NOT NULL,
  entity_type VARCHAR(255) NOT NULL,
  persistence_id VARCHAR(255) NOT NULL,
  seq_nr BIGINT NOT NULL,
  db_timestamp TIMESTAMP WITH TIME ZONE,
  write_timestamp BIGINT NOT NULL,
  ser_id INTEGER NOT NULL,
  ser_manifest VARCHAR(255) NOT NULL,
  snapshot BYTEA NOT NULL,
  tags TEXT ARRAY,
  meta_ser_id INTEGER,
  meta_ser_manifest VARCHAR(255),
  meta_payload BYTEA,

  PRIMARY KEY (persistence_id)
);

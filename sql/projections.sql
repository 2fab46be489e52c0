-- slicejournal: projection offsets, management and dead letters.
-- The offset and management tables follow Pekko Projection R2DBC's PostgreSQL DDL.
-- Placeholders (names in curly brackets) are filled in by `slicejournal init` as quoted identifiers.

CREATE SCHEMA IF NOT EXISTS {schema};

-- One row per (projection, slice, persistence id, seq_nr) accepted within the time
-- window; each slice always keeps its latest row so any slice range can resume.
CREATE TABLE IF NOT EXISTS {offset_store} (
  projection_name VARCHAR(255) NOT NULL,
  projection_key VARCHAR(255) NOT NULL,
  slice INT NOT NULL,
  persistence_id VARCHAR(255) NOT NULL,
  seq_nr BIGINT NOT NULL,
  timestamp_offset TIMESTAMP WITH TIME ZONE NOT NULL,
  timestamp_consumed TIMESTAMP WITH TIME ZONE NOT NULL,
  PRIMARY KEY (slice, projection_name, timestamp_offset, persistence_id, seq_nr)
);

CREATE TABLE IF NOT EXISTS {management} (
  projection_name VARCHAR(255) NOT NULL,
  projection_key VARCHAR(255) NOT NULL,
  paused BOOLEAN NOT NULL,
  last_updated BIGINT NOT NULL,
  PRIMARY KEY (projection_name, projection_key)
);

-- Events a projection skipped after its retries ran out, with the error: never dropped silently.
CREATE TABLE IF NOT EXISTS {dead_letter} (
  projection_name VARCHAR(255) NOT NULL,
  projection_key VARCHAR(255) NOT NULL,
  slice INT NOT NULL,
  persistence_id VARCHAR(255) NOT NULL,
  seq_nr BIGINT NOT NULL,
  db_timestamp TIMESTAMP WITH TIME ZONE NOT NULL,
  error TEXT NOT NULL,
  failed_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
  PRIMARY KEY (projection_name, persistence_id, seq_nr)
);

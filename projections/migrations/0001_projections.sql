-- slicejournal: projection offsets, management and dead letters.
-- The offset and management tables follow Pekko Projection R2DBC's PostgreSQL DDL.
-- Migration 1 of the projections component (release 0.1.0's schema). Placeholders (names
-- in curly brackets) are filled in with quoted identifiers. Never edit a shipped migration.

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

-- The projection fleet (worker processes sharing a projection's slice ranges).
-- Desired split and the settings every worker of the projection agrees on.
CREATE TABLE IF NOT EXISTS {fleet} (
  projection_name VARCHAR(255) PRIMARY KEY,
  entity_type VARCHAR(255) NOT NULL,
  instances INT NOT NULL,
  lease_ttl_ms BIGINT NOT NULL,
  updated_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
);

-- Live workers: a row per worker, renewed with its leases; balance counts these.
CREATE TABLE IF NOT EXISTS {fleet_worker} (
  projection_name VARCHAR(255) NOT NULL,
  worker_id VARCHAR(255) NOT NULL,
  expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
  started_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
  PRIMARY KEY (projection_name, worker_id)
);

-- A lease per slice range: owner (NULL once released), epoch (drawn anew at every
-- claim), expiry on the database clock, and what status shows of the instance.
CREATE TABLE IF NOT EXISTS {lease} (
  projection_name VARCHAR(255) NOT NULL,
  min_slice INT NOT NULL,
  max_slice INT NOT NULL,
  owner VARCHAR(255),
  epoch BIGINT NOT NULL,
  expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
  running BOOLEAN NOT NULL DEFAULT FALSE,
  restarts INT NOT NULL DEFAULT 0,
  last_error TEXT,
  updated_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
  PRIMARY KEY (projection_name, min_slice, max_slice)
);

CREATE SEQUENCE IF NOT EXISTS {lease_epoch};

-- Fencing: the first statement of every offset-storing transaction of a fleet worker.
-- It fails the transaction unless the lease is still held by that owner at that epoch
-- and unexpired. FOR KEY SHARE lets the owner's renewals through but makes a takeover
-- (SELECT ... FOR UPDATE) wait until the transaction has ended; a transaction left idle
-- longer than p_idle_ms (its worker frozen mid-batch) is ended by the server, so a
-- frozen worker cannot hold a takeover up for long.
CREATE OR REPLACE FUNCTION {lease_fence}(
  p_name VARCHAR, p_min INT, p_max INT, p_owner VARCHAR, p_epoch BIGINT, p_idle_ms BIGINT
) RETURNS VOID LANGUAGE plpgsql AS {body}
BEGIN
  PERFORM set_config('idle_in_transaction_session_timeout', p_idle_ms::text, true);
  PERFORM 1 FROM {lease}
   WHERE projection_name = p_name AND min_slice = p_min AND max_slice = p_max
     AND owner = p_owner AND epoch = p_epoch AND expires_at > clock_timestamp()
   FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'SJ001', MESSAGE = 'slicejournal: lease lost: projection '
      || p_name || ' range ' || p_min || '-' || p_max || ' is no longer held by '
      || p_owner || ' at epoch ' || p_epoch;
  END IF;
END
{body};

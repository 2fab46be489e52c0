-- slicejournal 0.3.0: a snapshot's db_timestamp is the db_timestamp of the event it was
-- taken at (Pekko Persistence R2DBC's rule for start-from-snapshot queries), not the time
-- it was saved: a query that delivers the snapshot in place of the events up to its
-- seq_nr places it where the last of them stood, before every later event of its id.
-- Snapshots saved by earlier releases carry their save time; this sets each to its
-- event's timestamp where that event (or the deletion marker standing for it) is still
-- in the journal, and leaves the others as they are. It changes no event and no payload.
-- Placeholders (names in curly brackets) are filled in with quoted identifiers.
-- Never edit a shipped migration: add the next number instead.

UPDATE {snapshot} AS s
   SET db_timestamp = e.db_timestamp
  FROM {event_journal} AS e
 WHERE e.persistence_id = s.persistence_id
   AND e.seq_nr = s.seq_nr
   AND s.db_timestamp IS DISTINCT FROM e.db_timestamp;

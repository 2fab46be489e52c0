"""Retention's statements, built from `ProjectionTables`; they run nothing.

One place for every statement retention and the projection registry run
(`projections/aio/retention.py` executes them): the projections that hold a
slice, one batch of a slice (examine a page of events in the slice index's
order, delete what `projections/retention.py` allows, leave the deletion
marker), the retired projections' offsets, and the registry itself.

A batch is one statement, so what it checks (the offset rows that prove an
event consumed) and what it deletes are read in one snapshot; the marker
reuses the writer's `MARK_DELETED`, so `delete_events_to` and retention leave
the same row. Registering a projection and a batch take one advisory lock
(exclusive and shared), so a registration is either seen by a batch or
committed after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import sql

from journal.slices import NUMBER_OF_SLICES
from journal.tables import rendered
from journal.writer import MARK_DELETED
from projections.offset_sql import Statement
from projections.offset_store import PROGRESS_PID, START_SEQ_NR
from projections.retention import RetentionPolicy, SlicePlan
from projections.tables import ProjectionTables

# The advisory lock's first key (the second is the registry's name, hashed).
_LOCK_CLASS = 0x51CE
INFINITY = "infinity"
MINUS_INFINITY = "-infinity"

# A page of a slice's events in the slice index's order after a cursor, and the facts
# each rule needs: the id's highest seq_nr, its snapshot's seq_nr, and per projection
# that must show it consumed the event, its newest offset row of that id (seq_nr and
# timestamp both at or above the event's: a row of an earlier lifetime of an id that
# `delete_all` reset to seq_nr 1 is older than every event of the new one).
# An id with a reset tombstone (seq_nr 0, `deleted`) is kept off until every projection
# shows the tombstone consumed: the tombstone is newer than the events above it, so
# their consumption proves nothing of it, and deleting below a target would sweep it
# away before projections learnt of the erasure (`erasing`). The erasure removes the
# id's rows itself meanwhile.
_VERDICT = """
WITH page AS MATERIALIZED (
  SELECT persistence_id AS pid, seq_nr AS seq, db_timestamp AS ts FROM {j}
  WHERE slice = %(slice)s AND entity_type = %(et)s AND NOT deleted
    AND db_timestamp >= %(after_ts)s::timestamptz
    AND (db_timestamp, seq_nr, persistence_id)
        > (%(after_ts)s::timestamptz, %(after_seq)s::bigint, %(after_pid)s::text)
    AND db_timestamp < %(cutoff)s::timestamptz AND db_timestamp <= %(scan_upper)s::timestamptz
  ORDER BY db_timestamp, seq_nr, persistence_id
  LIMIT %(batch)s),
ids AS (SELECT DISTINCT pid FROM page),
facts AS (
  SELECT i.pid,
    (SELECT max(seq_nr) FROM {j} WHERE persistence_id = i.pid) AS highest,
    (SELECT seq_nr FROM {s} WHERE persistence_id = i.pid) AS snap,
    (SELECT db_timestamp FROM {j} WHERE persistence_id = i.pid AND seq_nr = 0 AND deleted)
      AS reset_ts
  FROM ids i),
checks AS (SELECT * FROM unnest(%(names)s::text[], %(befores)s::timestamptz[]) AS h(name, before)),
consumed AS (
  SELECT DISTINCT ON (o.projection_name, o.persistence_id)
    o.projection_name AS name, o.persistence_id AS pid, o.seq_nr AS seq, o.timestamp_offset AS ts
  FROM {o} o
  WHERE o.slice = %(slice)s AND o.projection_name = ANY(%(names)s::text[])
    AND o.persistence_id IN (SELECT pid FROM ids)
  ORDER BY o.projection_name, o.persistence_id, o.timestamp_offset DESC, o.seq_nr DESC),
unmet AS (
  SELECT DISTINCT p.pid, p.seq FROM page p JOIN checks h ON p.ts >= h.before
  LEFT JOIN consumed c ON c.name = h.name AND c.pid = p.pid
  WHERE c.pid IS NULL OR c.seq < p.seq OR c.ts < p.ts),
erasing AS (
  SELECT f.pid FROM facts f WHERE f.reset_ts IS NOT NULL AND (
    %(blocked)s::boolean OR f.reset_ts > %(upper)s::timestamptz OR EXISTS (
      SELECT 1 FROM checks h WHERE f.reset_ts >= h.before AND NOT EXISTS (
        SELECT 1 FROM consumed c
        WHERE c.name = h.name AND c.pid = f.pid AND c.ts >= f.reset_ts)))),
verdict AS (
  SELECT p.pid, p.seq,
    (%(keep_last)s::bigint IS NULL OR p.seq <= f.highest - %(keep_last)s::bigint)
      AND (NOT %(keep_snapshot)s::boolean OR p.seq <= coalesce(f.snap, 0)) AS policy_ok,
    NOT %(blocked)s::boolean AND p.ts <= %(upper)s::timestamptz AND u.pid IS NULL
      AND e.pid IS NULL AS consumed
  FROM page p JOIN facts f USING (pid)
  LEFT JOIN unmet u ON u.pid = p.pid AND u.seq = p.seq
  LEFT JOIN erasing e ON e.pid = p.pid),
ok AS (
  SELECT v.pid, max(v.seq) AS target, f.reset_ts FROM verdict v JOIN facts f USING (pid)
  WHERE v.policy_ok AND v.consumed GROUP BY v.pid, f.reset_ts),
last AS (SELECT ts, seq, pid FROM page ORDER BY ts DESC, seq DESC, pid DESC LIMIT 1)"""

# Apply: per id, every row below the highest deletable seq_nr goes (downward closed:
# they are deletable too, or already deletion markers) and that row becomes the marker.
# A reset tombstone (seq_nr 0) goes only as the verdict saw it: a second reset that
# commits meanwhile moves it to a new db_timestamp, the delete re-checks the moved row
# (READ COMMITTED), and that tombstone no projection has handled yet must stay.
_APPLY = """,
gone AS (
  DELETE FROM {j} AS j USING ok WHERE j.persistence_id = ok.pid AND j.seq_nr < ok.target
    AND (j.seq_nr <> 0 OR j.db_timestamp = ok.reset_ts)
  RETURNING j.deleted),
marked AS (
  UPDATE {j} AS j SET {marker} FROM ok WHERE j.persistence_id = ok.pid AND j.seq_nr = ok.target
  RETURNING 1)
SELECT (SELECT count(*) FROM page),
  (SELECT count(*) FROM gone WHERE NOT deleted) + (SELECT count(*) FROM marked),
  (SELECT count(*) FROM verdict WHERE policy_ok AND NOT consumed),
  l.ts, l.seq, l.pid
FROM (SELECT 1) AS one LEFT JOIN last AS l ON true"""

_DRY_RUN = """
SELECT (SELECT count(*) FROM page),
  (SELECT count(*) FROM verdict WHERE policy_ok AND consumed),
  (SELECT count(*) FROM verdict WHERE policy_ok AND NOT consumed),
  l.ts, l.seq, l.pid
FROM (SELECT 1) AS one LEFT JOIN last AS l ON true"""

# Every projection name retention knows of: with offsets, or in the registry; what the
# registry, the fleet and its offset rows say of it.
_PROJECTIONS = """
WITH per_slice AS (
  SELECT projection_name, slice, max(timestamp_offset) AS latest FROM {o} GROUP BY 1, 2),
agg AS (
  SELECT projection_name, count(*) AS slices, min(latest) AS min_offset FROM per_slice
  GROUP BY 1),
seen AS (
  SELECT projection_name, array_agg(DISTINCT split_part(persistence_id, '|', 1)) AS types
  FROM {o} WHERE persistence_id <> %(progress_pid)s GROUP BY 1),
names AS (SELECT projection_name FROM agg UNION SELECT projection_name FROM {r})
SELECT n.projection_name, g.retired, g.entity_type, g.min_slice, g.max_slice, f.entity_type,
  coalesce(t.types, ARRAY[]::text[]), coalesce(a.slices, 0), a.min_offset,
  EXISTS (SELECT 1 FROM {m} AS m WHERE m.projection_name = n.projection_name AND m.paused)
FROM names AS n
LEFT JOIN agg AS a USING (projection_name)
LEFT JOIN {r} AS g USING (projection_name)
LEFT JOIN {f} AS f USING (projection_name)
LEFT JOIN seen AS t USING (projection_name)
ORDER BY 1"""

# The projections holding one slice of an entity type, read inside the batch's
# transaction: the registry as it is now (a registration waits for the lock), the
# implicit ones known at the start of the run that hold the entity type, and any name
# with rows in the slice that is new since (held, unless known not to hold the type).
_HOLDERS = """
WITH rows AS (
  SELECT projection_name, max(timestamp_offset) AS latest,
    max(timestamp_offset) FILTER (
      WHERE persistence_id = %(progress_pid)s AND seq_nr = %(start_seq)s) AS start
  FROM {o} WHERE slice = %(slice)s GROUP BY 1),
names AS (
  SELECT projection_name FROM rows
  UNION SELECT unnest(%(implicit)s::text[])
  UNION SELECT projection_name FROM {r} WHERE NOT retired)
SELECT n.projection_name, r.latest, r.start,
  EXISTS (SELECT 1 FROM {m} AS m WHERE m.projection_name = n.projection_name AND m.paused)
FROM names AS n
LEFT JOIN rows AS r USING (projection_name)
LEFT JOIN {r} AS g USING (projection_name)
LEFT JOIN {f} AS f USING (projection_name)
WHERE CASE
  WHEN g.projection_name IS NOT NULL THEN NOT g.retired AND g.entity_type = %(et)s
    AND %(slice)s BETWEEN g.min_slice AND g.max_slice
  WHEN f.projection_name IS NOT NULL THEN f.entity_type = %(et)s
  ELSE NOT n.projection_name = ANY(%(others)s::text[]) END
ORDER BY 1"""


class RetentionSql:
    """Retention's and the registry's statements for one installation."""

    def __init__(self, tables: ProjectionTables) -> None:
        names: dict[str, Any] = {
            "j": tables.journal_tables.journal,
            "s": tables.journal_tables.snapshot,
            "o": tables.offset_store,
            "m": tables.management,
            "f": tables.fleet,
            "r": tables.registry,
            "marker": MARK_DELETED,
        }
        self._lock_name = f"{tables.schema_name}.{tables.registry_name}"
        self.apply = rendered(sql.SQL(_VERDICT + _APPLY).format(**names))
        self.dry_run = rendered(sql.SQL(_VERDICT + _DRY_RUN).format(**names))
        self.projections = rendered(sql.SQL(_PROJECTIONS).format(**names))
        self.holders = rendered(sql.SQL(_HOLDERS).format(**names))
        self.now = Statement("SELECT now()", ())
        self.candidates = rendered(
            sql.SQL(
                "SELECT s.slice FROM generate_series(0, {last}) AS s(slice) WHERE EXISTS ("
                "  SELECT 1 FROM {j} WHERE slice = s.slice AND entity_type = %(et)s "
                "  AND db_timestamp < %(cutoff)s::timestamptz AND NOT deleted) ORDER BY 1"
            ).format(last=sql.Literal(NUMBER_OF_SLICES - 1), **names)
        )
        self.beyond = rendered(
            sql.SQL(
                "SELECT count(*) FROM (SELECT 1 FROM {j} WHERE slice = %(slice)s "
                "  AND entity_type = %(et)s AND NOT deleted "
                "  AND db_timestamp > %(upper)s::timestamptz "
                "  AND db_timestamp < %(cutoff)s::timestamptz LIMIT %(cap)s) AS held"
            ).format(**names)
        )
        self.retired = rendered(
            sql.SQL("SELECT projection_name FROM {r} WHERE retired ORDER BY 1").format(**names)
        )
        self.delete_offsets = rendered(
            sql.SQL(
                "DELETE FROM {o} WHERE ctid = ANY(ARRAY("
                "  SELECT ctid FROM {o} WHERE projection_name = ANY(%(names)s::text[]) "
                "  LIMIT %(batch)s))"
            ).format(**names)
        )
        self.count_offsets = rendered(
            sql.SQL(
                "SELECT count(*) FROM {o} WHERE projection_name = ANY(%(names)s::text[])"
            ).format(**names)
        )
        self.register = rendered(
            sql.SQL(
                "INSERT INTO {r} (projection_name, entity_type, min_slice, max_slice, retired) "
                "VALUES (%s, %s, %s, %s, false) ON CONFLICT (projection_name) DO UPDATE SET "
                "entity_type = excluded.entity_type, min_slice = excluded.min_slice, "
                "max_slice = excluded.max_slice, retired = false, updated_at = now()"
            ).format(**names)
        )
        self.retire = rendered(
            sql.SQL(
                "INSERT INTO {r} (projection_name, entity_type, min_slice, max_slice, retired) "
                "VALUES (%s, NULL, 0, 1023, true) ON CONFLICT (projection_name) DO UPDATE SET "
                "retired = true, updated_at = now()"
            ).format(**names)
        )
        self.known = rendered(
            sql.SQL(
                "SELECT EXISTS (SELECT 1 FROM {r} WHERE projection_name = %(n)s) "
                "OR EXISTS (SELECT 1 FROM {o} WHERE projection_name = %(n)s) "
                "OR EXISTS (SELECT 1 FROM {m} WHERE projection_name = %(n)s) "
                "OR EXISTS (SELECT 1 FROM {f} WHERE projection_name = %(n)s)"
            ).format(**names)
        )

    def lock(self, *, exclusive: bool) -> Statement:
        """The registry's advisory lock, for the transaction: a batch shares it, a
        registration takes it alone.

        A batch also commits asynchronously (`synchronous_commit` off, for its own
        transaction only): it only deletes what every projection has consumed, so a
        batch lost in a crash just leaves those events for the next run, and any later
        synchronous commit (an append) flushes it anyway; without it, each batch waits
        for its own WAL flush, which was most of a batch's time on a plain disk."""
        kind = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        query = sql.SQL(
            "SELECT {}(%s::int, hashtext(%s)), set_config('synchronous_commit', %s, true)"
        ).format(sql.Identifier(kind))
        return Statement(query, (_LOCK_CLASS, self._lock_name, "on" if exclusive else "off"))

    def candidate_slices(self, policy: RetentionPolicy, now: datetime) -> Statement:
        """The slices holding an event of the entity type that the time rule lets go."""
        cutoff = _bound(policy.cutoff(now))
        return Statement(self.candidates, {"et": policy.entity_type, "cutoff": cutoff})

    def held_beyond(self, plan: SlicePlan, policy: RetentionPolicy, cap: int) -> Statement:
        """Applying: how many events (up to `cap`) the time rule lets go past the
        projections' bound, where no batch looks: held back, for the report."""
        params = {
            "slice": plan.slice,
            "et": policy.entity_type,
            "cutoff": _bound(plan.cutoff),
            "upper": MINUS_INFINITY if plan.blocked else _bound(plan.upper),
            "cap": cap,
        }
        return Statement(self.beyond, params)

    def holders_of(
        self, slice_: int, entity_type: str, implicit: Sequence[str], others: Sequence[str]
    ) -> Statement:
        params = {
            "slice": slice_,
            "et": entity_type,
            "implicit": list(implicit),
            "others": list(others),
            "progress_pid": PROGRESS_PID,
            "start_seq": START_SEQ_NR,
        }
        return Statement(self.holders, params)

    def batch(
        self,
        plan: SlicePlan,
        policy: RetentionPolicy,
        after: tuple[Any, int, str],
        batch_size: int,
        *,
        dry_run: bool,
    ) -> Statement:
        """Examine the next page of the slice after `after` (db_timestamp, seq_nr, pid):
        delete what may go (or, dry, count it). One row: examined, events, held, and the
        page's last position (NULLs when the page was empty)."""
        upper = _bound(plan.upper)
        params = {
            "slice": plan.slice,
            "et": policy.entity_type,
            "after_ts": after[0],
            "after_seq": after[1],
            "after_pid": after[2],
            "cutoff": _bound(plan.cutoff),
            # Applying, a page stops at the projections' bound: nothing after it can go.
            # A dry run reads on to the policy's cutoff, to count what is held back.
            "scan_upper": INFINITY if dry_run else upper,
            "upper": upper,
            "blocked": plan.blocked,
            "batch": batch_size,
            "names": [name for name, _ in plan.checks],
            "befores": [before for _, before in plan.checks],
            "keep_last": policy.keep_last,
            "keep_snapshot": policy.keep_snapshot,
        }
        return Statement(self.dry_run if dry_run else self.apply, params)


def _bound(value: datetime | None) -> datetime | str:
    return INFINITY if value is None else value


START = (MINUS_INFINITY, 0, "")  # before every event: the first page's cursor

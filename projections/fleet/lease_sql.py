"""The fleet's statements on its three tables; they run nothing.

Every time is the database's clock (`clock_timestamp()`), never a worker's:
workers on different hosts disagree about the time, the database does not.
Expiries come back as epoch seconds so the pure planner (`assignment.py`)
can compare them with the `now` read in the same statement.

Claims are serialised per projection by locking its `fleet` row `FOR
UPDATE`: two workers can never both decide that the same slice is free.
The lease rows a claim replaces are locked `FOR UPDATE` too, which waits for
any fenced offset transaction still holding them `FOR KEY SHARE` (bounded by
the claim's `lock_timeout`): a takeover never overtakes a commit in flight.
Renewals are plain UPDATEs of a non-key column, which `FOR KEY SHARE` lets
through, so a long batch never keeps its own lease from being renewed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from journal.slices import NUMBER_OF_SLICES, SliceRange
from projections.fleet.assignment import LeaseRow
from projections.tables import ProjectionTables

_EPOCH_SECONDS = "extract(epoch FROM {})::float8"


class FleetSql:
    """Statements of the fleet tables of one journal installation."""

    def __init__(self, tables: ProjectionTables) -> None:
        f, w, lease = tables.fleet, tables.fleet_worker, tables.lease
        now = sql.SQL(_EPOCH_SECONDS.format("clock_timestamp()"))
        # The stored count wins: `--instances` only seeds a projection seen for the first time.
        self.register = sql.SQL(
            "INSERT INTO {f} (projection_name, entity_type, instances, lease_ttl_ms) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (projection_name) DO UPDATE SET "
            "entity_type = excluded.entity_type, lease_ttl_ms = excluded.lease_ttl_ms"
        ).format(f=f)
        # Spark registers a projection it runs so that `status` shows it, but leaves a
        # fleet's own settings alone.
        self.register_if_absent = sql.SQL(
            "INSERT INTO {f} (projection_name, entity_type, instances, lease_ttl_ms) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (projection_name) DO NOTHING"
        ).format(f=f)
        self.fleet = sql.SQL(
            "SELECT instances, entity_type, lease_ttl_ms, {now}, "
            + _EPOCH_SECONDS.format("updated_at")
            + " FROM {f} WHERE projection_name = %s"
        ).format(f=f, now=now)
        self.lock_fleet = self.fleet + sql.SQL(" FOR UPDATE")
        self.now = sql.SQL("SELECT {now}").format(now=now)
        # Every claim of the projection's leases, by fleet workers or by a Spark
        # runner (which may have no fleet row to lock), takes this lock first.
        self.lock_claims = sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))")
        self._claims_prefix = f"slicejournal claims {tables.lease.as_string()} "
        self.scale = sql.SQL(
            "UPDATE {f} SET instances = %s, updated_at = clock_timestamp() "
            "WHERE projection_name = %s AND instances <> %s"
        ).format(f=f)
        self.heartbeat = sql.SQL(
            "INSERT INTO {w} (projection_name, worker_id, expires_at) "
            "VALUES (%(name)s, %(me)s, clock_timestamp() + %(ttl)s * interval '1 millisecond') "
            "ON CONFLICT (projection_name, worker_id) "
            "DO UPDATE SET expires_at = excluded.expires_at"
        ).format(w=w)
        self.live_workers = sql.SQL(
            "SELECT worker_id FROM {w} WHERE projection_name = %s "
            "AND expires_at > clock_timestamp() ORDER BY worker_id"
        ).format(w=w)
        self.leave = sql.SQL(
            "DELETE FROM {w} WHERE projection_name = %s AND worker_id = %s"
        ).format(w=w)
        # Workers gone for longer than a day: nothing reads them any more.
        self.forget_workers = sql.SQL(
            "DELETE FROM {w} WHERE projection_name = %s "
            "AND expires_at < clock_timestamp() - interval '1 day'"
        ).format(w=w)
        columns = sql.SQL(
            "min_slice, max_slice, owner, epoch, " + _EPOCH_SECONDS.format("expires_at")
        )
        self.leases = sql.SQL(
            "SELECT {c} FROM {l} WHERE projection_name = %s ORDER BY min_slice, max_slice"
        ).format(c=columns, l=lease)
        self.lease_details = sql.SQL(
            "SELECT min_slice, max_slice, owner, epoch, "
            + _EPOCH_SECONDS.format("expires_at")
            + ", running, restarts, last_error FROM {l} WHERE projection_name = %s "
            "ORDER BY min_slice, max_slice"
        ).format(l=lease)
        # Locks every row sharing a slice with the range, of any split.
        self.lock_overlapping = sql.SQL(
            "SELECT {c} FROM {l} WHERE projection_name = %s "
            "AND min_slice <= %s AND max_slice >= %s FOR UPDATE"
        ).format(c=columns, l=lease)
        self.delete_lease = sql.SQL(
            "DELETE FROM {l} WHERE projection_name = %s AND min_slice = %s AND max_slice = %s"
        ).format(l=lease)
        self.claim = sql.SQL(
            "INSERT INTO {l} (projection_name, min_slice, max_slice, owner, epoch, expires_at) "
            "VALUES (%(name)s, %(lo)s, %(hi)s, %(me)s, nextval(%(seq)s::regclass), "
            "clock_timestamp() + %(ttl)s * interval '1 millisecond') "
            "ON CONFLICT (projection_name, min_slice, max_slice) DO UPDATE SET "
            "owner = excluded.owner, epoch = excluded.epoch, expires_at = excluded.expires_at, "
            "running = FALSE, last_error = NULL, restarts = 0, updated_at = clock_timestamp() "
            "RETURNING epoch"
        ).format(l=lease)
        # The sequence's quoted name travels as a parameter, never inside SQL text.
        self._sequence = tables.lease_epoch.as_string()
        # Epochs are unique across the table (one sequence), so they name the leases.
        self.renew = sql.SQL(
            "UPDATE {l} SET expires_at = clock_timestamp() + %s * interval '1 millisecond' "
            "WHERE projection_name = %s AND owner = %s AND epoch = ANY(%s::bigint[]) "
            "RETURNING epoch"
        ).format(l=lease)
        self.release = sql.SQL(
            "UPDATE {l} SET owner = NULL, running = FALSE, expires_at = clock_timestamp(), "
            "updated_at = clock_timestamp() "
            "WHERE projection_name = %s AND owner = %s AND epoch = %s"
        ).format(l=lease)
        # An operator moved the offsets: every lease sharing a slice ends now.
        self.revoke = sql.SQL(
            "UPDATE {l} SET owner = NULL, running = FALSE, expires_at = clock_timestamp(), "
            "updated_at = clock_timestamp() WHERE projection_name = %s "
            "AND min_slice <= %s AND max_slice >= %s"
        ).format(l=lease)
        self.report = sql.SQL(
            "UPDATE {l} SET running = %s, restarts = %s, last_error = %s, "
            "updated_at = clock_timestamp() "
            "WHERE projection_name = %s AND owner = %s AND epoch = %s"
        ).format(l=lease)
        # Rows of an older split nobody holds any more; SKIP LOCKED: a row a fenced
        # transaction still holds is left for a later tick rather than waited for.
        self.collect = sql.SQL(
            "DELETE FROM {l} WHERE ctid IN (SELECT ctid FROM {l} WHERE projection_name = %s "
            "AND (owner IS NULL OR expires_at <= clock_timestamp()) "
            "AND (max_slice - min_slice + 1) <> %s / %s FOR UPDATE SKIP LOCKED)"
        ).format(l=lease)

    def claims_key(self, name: str) -> tuple[str]:
        return (self._claims_prefix + name,)

    def collect_params(self, name: str, instances: int) -> tuple[str, int, int]:
        """`collect` drops the free rows whose range size is not that of `instances` ranges."""
        return (name, NUMBER_OF_SLICES, instances)

    def claim_params(self, name: str, r: SliceRange, me: str, ttl_ms: int) -> dict[str, Any]:
        return {
            "name": name,
            "lo": r.min_slice,
            "hi": r.max_slice,
            "me": me,
            "ttl": ttl_ms,
            "seq": self._sequence,
        }


def lease_rows(rows: Sequence[Sequence[Any]]) -> list[LeaseRow]:
    """`leases` / `lock_overlapping` rows as the planner's values."""
    return [LeaseRow(SliceRange(lo, hi), owner, epoch, exp) for lo, hi, owner, epoch, exp in rows]

# Generated from projections/aio/leases.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The claim protocol of a projection's slice-range leases, one for every runner.

Fleet workers and Spark drivers hold a projection's ranges through the same
lease rows (projections/fleet/lease_sql.py), and must follow the same rule,
or one could overtake the other: under the projection's claim lock, a range
is claimable only when no other owner's live lease shares a slice with it;
free rows of another split that overlap it are deleted; the claim draws a new
epoch, which every fenced transaction of the new owner then proves. The
worker drives these with asyncio, Spark's driver through the generated sync
twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import Connection

from journal.slices import SliceRange
from projections.fleet.assignment import LeaseRow, claim_check
from projections.fleet.lease_sql import FleetSql, lease_rows


def lock_claims(conn: Connection[Any], fleet: FleetSql, name: str) -> None:
    """Take the projection's claim lock for the rest of the caller's transaction."""
    conn.execute(fleet.lock_claims, fleet.claims_key(name))


def claim_range(
    conn: Connection[Any],
    fleet: FleetSql,
    name: str,
    r: SliceRange,
    owner: str,
    ttl_ms: int,
) -> tuple[int | None, list[LeaseRow]]:
    """Claim `r` for `owner` inside a transaction holding `lock_claims`.

    Returns the new epoch, or None and the live leases of other owners that
    block it. The overlapping lease rows are locked first: a row still locked
    by its previous owner's fenced transaction makes the claim wait (up to
    the caller's `lock_timeout`), so a takeover never overtakes a commit.
    """
    cur = conn.execute(fleet.lock_overlapping, (name, r.max_slice, r.min_slice))
    rows = lease_rows(cur.fetchall())
    cur = conn.execute(fleet.now)
    now = float((cur.fetchone() or (0.0,))[0])
    blockers, stale = claim_check(rows, r, owner, now)
    if blockers:
        return None, blockers
    for free in stale:  # a free row of another split: gone for good
        conn.execute(fleet.delete_lease, (name, free.min_slice, free.max_slice))
    cur = conn.execute(fleet.claim, fleet.claim_params(name, r, owner, ttl_ms))
    claimed = cur.fetchone()
    return (None if claimed is None else int(claimed[0])), []


def renew_leases(
    conn: Connection[Any],
    fleet: FleetSql,
    name: str,
    owner: str,
    epochs: Sequence[int],
    ttl_ms: int,
) -> set[int]:
    """Extend `owner`'s leases of these epochs by the TTL; the epochs still held."""
    cur = conn.execute(fleet.renew, (ttl_ms, name, owner, list(epochs)))
    return {int(epoch) for (epoch,) in cur.fetchall()}


def release_lease(
    conn: Connection[Any], fleet: FleetSql, name: str, owner: str, epoch: int
) -> None:
    """Give one lease back, so a runner waiting for its slices may claim at once."""
    conn.execute(fleet.release, (name, owner, epoch))

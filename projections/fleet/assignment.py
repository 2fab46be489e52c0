"""Who leases which slice range: the decisions of the fleet, as pure functions.

The workers of a projection share its 1024 slices through lease rows in
PostgreSQL. On every tick each worker reads the desired split, the live workers
and all lease rows, and asks `plan` which ranges to release, which to claim and
which to keep. This module is sans-I/O (no database, no event loop, no clock):
the decisions are tested in microseconds, by example and by simulation, and the
drivers only execute them. Every worker computes the same function on the same
rows, so the result depends on the data alone, never on the order it was read in.

The assignment is cooperative and sticky, like Kafka's cooperative-sticky
assignor (KIP-429): a range stays with its holder unless balance forces a move,
a moving range is released by its holder before the new owner may claim it, and
a range of a new split goes to the worker that held most of its slices before.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import attrs

from journal.slices import SliceRange


@attrs.frozen
class LeaseRow:
    """One lease row as read from the database (any split, old or current)."""

    slice_range: SliceRange
    owner: str | None  # None: released
    epoch: int
    expires_at: float  # seconds on the database clock (epoch seconds)

    def live(self, now: float) -> bool:
        """Whether the lease is held and unexpired at `now` (database clock)."""
        return self.owner is not None and self.expires_at > now


@attrs.frozen
class Plan:
    """What one worker must do on this tick; every field is sorted."""

    release: tuple[SliceRange, ...]
    """Ranges I hold (of any split) that I must stop and give back."""
    claim: tuple[SliceRange, ...]
    """Ranges assigned to me that I may claim now."""
    keep: tuple[SliceRange, ...]
    """Ranges I hold and keep."""
    waiting: tuple[SliceRange, ...]
    """Ranges assigned to me, blocked by a live overlapping lease of another owner."""


def _bounds(r: SliceRange) -> tuple[int, int]:
    """A range's sort key: the order attrs generates for `SliceRange`, without its cost
    (its comparisons build tuples field by field; this planner sorts in every tick)."""
    return r.min_slice, r.max_slice


def _shared(a: SliceRange, b: SliceRange) -> int:
    return max(0, min(a.max_slice, b.max_slice) - max(a.min_slice, b.min_slice) + 1)


def _affinities(
    wanted: Sequence[SliceRange], holdings: Sequence[tuple[SliceRange, str]]
) -> dict[SliceRange, dict[str, int]]:
    """For each wanted range: worker → how many of its slices the worker holds (if any)."""
    ordered = sorted(holdings, key=lambda h: (*_bounds(h[0]), h[1]))
    starts = [h.min_slice for h, _ in ordered]
    longest = max((len(h) for h, _ in ordered), default=1)
    affinity: dict[SliceRange, dict[str, int]] = {}
    for r in wanted:
        slices: dict[str, int] = {}
        # Only a held range starting less than the longest held range before r reaches into r.
        lo = bisect.bisect_left(starts, r.min_slice - longest + 1)
        hi = bisect.bisect_right(starts, r.max_slice)
        for h, owner in ordered[lo:hi]:
            shared = _shared(r, h)
            if shared:
                slices[owner] = slices.get(owner, 0) + shared
        affinity[r] = slices
    return affinity


def _match(
    ranges: Sequence[SliceRange],
    candidates: Mapping[SliceRange, Sequence[str]],
    spare: Mapping[str, int],
) -> dict[SliceRange, str]:
    """As many ranges as possible to one of their candidates, at most `spare[w]` to worker w.

    A maximum bipartite matching by augmenting paths, searched breadth first in
    the order given: a range placed early moves to another of its candidates
    when that lets a later range in, so one greedy choice strands nothing.
    """
    owner: dict[SliceRange, str] = {}
    taken: dict[str, list[SliceRange]] = {w: [] for w in spare}
    for r in ranges:
        via: dict[str, SliceRange] = {}
        queue = deque([r])
        free: str | None = None
        while queue and free is None:
            x = queue.popleft()
            for w in candidates[x]:
                if w in via or not spare[w]:
                    continue
                via[w] = x
                if len(taken[w]) < spare[w]:
                    free = w
                    break
                queue.extend(taken[w])
        # Shift every range on the path one step along it, r included.
        step = free
        while step is not None:
            x = via[step]
            previous = owner.get(x)
            if previous is not None:
                taken[previous].remove(x)
            owner[x] = step
            taken[step].append(x)
            step = previous
    return owner


def assign(
    ranges: Sequence[SliceRange], workers: Iterable[str], held: Mapping[SliceRange, str]
) -> dict[SliceRange, str]:
    """An owner for every range of the desired split, balanced and sticky.

    `held` maps the ranges of live leases (of any split) to their owners; owners
    that are not among `workers` are ignored. Every worker gets ``n // w`` or
    ``n // w + 1`` ranges, and a range moves only when balance requires it:

    1. Quotas: the ``n % w`` larger quotas go to the workers most ranges wish to
       stay with (a range wishes for its holder, else for the worker holding
       most of its slices), then by worker id.
    2. A range held exactly stays with its holder, up to the holder's quota.
    3. The others go to a worker holding part of them where quotas allow, as
       many as possible (a maximum matching), the larger share preferred.
    4. The rest fill up the workers furthest below quota.

    Ties are broken by worker id and range order: the result depends on the
    data only, never on the order of `workers` or of `held`.
    """
    live = sorted(set(workers))
    wanted = sorted(set(ranges), key=_bounds)
    if not live or not wanted:
        return {}
    alive = set(live)
    holdings = [(r, owner) for r, owner in held.items() if owner in alive]
    affinity = _affinities(wanted, holdings)

    def holder(r: SliceRange) -> str | None:
        owner = held.get(r)
        return owner if owner in alive else None

    def candidates(r: SliceRange) -> list[str]:
        """Workers holding part of r, the exact holder first, then the larger share, then id."""
        slices = affinity[r]
        return sorted(slices, key=lambda w: (w != holder(r), -slices[w], w))

    wishes = dict.fromkeys(live, 0)
    for r in wanted:
        if affinity[r]:
            wishes[candidates(r)[0]] += 1
    base, extra = divmod(len(wanted), len(live))
    by_wishes = sorted(live, key=lambda w: (-wishes[w], w))
    quota = {w: base + 1 if i < extra else base for i, w in enumerate(by_wishes)}

    owners: dict[SliceRange, str] = {}
    load = dict.fromkeys(live, 0)
    for r in wanted:
        w = holder(r)
        if w is not None and load[w] < quota[w]:
            owners[r] = w
            load[w] += 1

    pending = [r for r in wanted if r not in owners]
    pending.sort(key=lambda r: (-max(affinity[r].values(), default=0), *_bounds(r)))
    spare = {w: quota[w] - load[w] for w in live}
    for r, w in _match(pending, {r: candidates(r) for r in pending}, spare).items():
        owners[r] = w
        load[w] += 1

    for r in wanted:
        if r not in owners:
            w = min((w for w in live if load[w] < quota[w]), key=lambda w: (load[w] - quota[w], w))
            owners[r] = w
            load[w] += 1
    return {r: owners[r] for r in wanted}


def plan(
    me: str,
    ranges: Sequence[SliceRange],
    workers: Iterable[str],
    leases: Iterable[LeaseRow],
    now: float,
) -> Plan:
    """What worker `me` does on this tick, given everything read from the database.

    `workers` are the live workers (`me` is always one), `leases` all lease rows
    of the projection, `now` the database clock. My own rows count as mine even
    when expired: I try to renew them and the database decides. A range assigned
    to me is claimable only once no other owner's live lease overlaps it, so a
    moving range is never processed by two workers at once.
    """
    rows = list(leases)
    live_workers = set(workers) | {me}

    chosen: dict[SliceRange, LeaseRow] = {}
    for row in rows:
        if not (row.live(now) or row.owner == me):
            continue
        # One row per range in the table; should the input repeat one, the live
        # row with the highest epoch wins, whatever the order.
        best = chosen.get(row.slice_range)
        if best is None or _precedence(row, now) > _precedence(best, now):
            chosen[row.slice_range] = row
    held = {r: row.owner for r, row in chosen.items() if row.owner is not None}

    target = assign(ranges, live_workers, held)
    mine = sorted((r for r, owner in held.items() if owner == me), key=_bounds)
    blockers = [row.slice_range for row in rows if row.live(now) and row.owner != me]

    claim: list[SliceRange] = []
    waiting: list[SliceRange] = []
    for r in sorted((r for r, owner in target.items() if owner == me), key=_bounds):
        if held.get(r) == me:
            continue
        (waiting if any(r.overlaps(b) for b in blockers) else claim).append(r)
    return Plan(
        release=tuple(r for r in mine if target.get(r) != me),
        claim=tuple(claim),
        keep=tuple(r for r in mine if target.get(r) == me),
        waiting=tuple(waiting),
    )


def claim_check(
    rows: Iterable[LeaseRow], r: SliceRange, me: str, now: float
) -> tuple[list[LeaseRow], list[SliceRange]]:
    """Claiming `r` over the lease rows that overlap it (locked): the live leases of other
    owners that block the claim, and the free rows of other splits to delete first."""
    rows = list(rows)
    blockers = [row for row in rows if row.live(now) and row.owner != me]
    stale = [row.slice_range for row in rows if row.slice_range != r]
    return blockers, stale


def _precedence(row: LeaseRow, now: float) -> tuple[bool, int, str]:
    return (row.live(now), row.epoch, row.owner or "")

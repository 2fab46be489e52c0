"""The fleet's pure decisions: who owns which slice range, and when a worker may claim it.

No database here: `assign` and `plan` are checked against expectations computed
independently (literal examples, the fewest moves balance allows found by brute
force, the slices each worker held), and a simulated database clock drives whole
fleets through a crash and a rescale to check that leases never overlap.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal.slices import SliceRange, slice_ranges
from projections.fleet.assignment import LeaseRow, Plan, assign, plan

SPLITS = [1, 2, 4, 8, 16, 32, 64]
MAX_WORKERS = 8


def r(lo: int, hi: int) -> SliceRange:
    return SliceRange(lo, hi)


def loads(owners: Mapping[SliceRange, str], workers: Iterable[str]) -> dict[str, int]:
    """Ranges per worker, zero included."""
    counts = dict.fromkeys(workers, 0)
    for owner in owners.values():
        counts[owner] += 1
    return counts


def check_valid(
    owners: Mapping[SliceRange, str], ranges: Sequence[SliceRange], workers: Iterable[str]
) -> None:
    """Every range has one live owner and loads differ by at most one over all live workers."""
    live = set(workers)
    assert sorted(owners) == sorted(ranges)
    assert set(owners.values()) <= live
    counts = loads(owners, live)
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def fewest_moves(wished: Mapping[str, int], n: int, workers: Sequence[str]) -> int:
    """How many of `n` ranges cannot go where they wish, at best, in a balanced assignment.

    `wished[w]` ranges wish to stay with (or go to) worker `w`; the rest wish
    nothing. Balance gives `n % w` workers one range more than the others; every
    choice of those workers is tried.
    """
    base, extra = divmod(n, len(workers))
    best = max(
        sum(min(wished.get(w, 0), base + (w in bigger)) for w in workers)
        for bigger in map(set, itertools.combinations(workers, extra))
    )
    return n - best


def parent(child: SliceRange, split: Sequence[SliceRange]) -> SliceRange:
    (p,) = [p for p in split if child.min_slice in p]
    assert child.max_slice in p
    return p


# --- LeaseRow --------------------------------------------------------------------------------


def test_a_lease_is_live_while_held_and_unexpired() -> None:
    assert LeaseRow(r(0, 1023), "a", 1, 10.0).live(9.99)
    assert not LeaseRow(r(0, 1023), "a", 1, 10.0).live(10.0)
    assert not LeaseRow(r(0, 1023), None, 1, 10.0).live(0.0)


# --- assign: examples ------------------------------------------------------------------------


def test_no_workers_no_owners() -> None:
    assert assign(slice_ranges(4), [], {}) == {}
    assert assign(slice_ranges(4), [], {r(0, 255): "a"}) == {}


def test_four_ranges_on_two_workers_two_each() -> None:
    owners = assign(slice_ranges(4), ["b", "a", "b"], {})
    check_valid(owners, slice_ranges(4), ["a", "b"])
    assert loads(owners, ["a", "b"]) == {"a": 2, "b": 2}


def test_more_workers_than_ranges_holders_keep_theirs() -> None:
    ranges = slice_ranges(2)
    owners = assign(ranges, ["a", "b", "c"], {r(0, 511): "c", r(512, 1023): "b"})
    assert owners == {r(0, 511): "c", r(512, 1023): "b"}


def test_holders_that_are_not_live_are_ignored() -> None:
    ranges = slice_ranges(4)
    held = dict.fromkeys(ranges, "gone")
    owners = assign(ranges, ["a", "b"], held)
    check_valid(owners, ranges, ["a", "b"])


def test_doubling_gives_each_new_range_to_its_parents_owner() -> None:
    old = {r(0, 255): "a", r(256, 511): "b", r(512, 767): "b", r(768, 1023): "a"}
    owners = assign(slice_ranges(8), ["a", "b"], old)
    assert owners == {
        r(0, 127): "a",
        r(128, 255): "a",
        r(256, 383): "b",
        r(384, 511): "b",
        r(512, 639): "b",
        r(640, 767): "b",
        r(768, 895): "a",
        r(896, 1023): "a",
    }


@pytest.mark.parametrize(
    "layout",
    [
        # Halves of one range at different owners, and one owner at both ends.
        "abbccdda",
        # First come, first served (0-255 to "a", 256-511 to "b", 512-767 to "c") would
        # leave 768-1023 to "d", which holds neither half: 0-255 must go to "d" instead.
        "dadbcbca",
    ],
)
def test_halving_gives_each_range_to_an_owner_of_one_half(layout: str) -> None:
    old = dict(zip(slice_ranges(len(layout)), layout, strict=True))
    halved = slice_ranges(len(layout) // 2)
    owners = assign(halved, "abcd", old)
    check_valid(owners, halved, "abcd")
    for x, owner in owners.items():
        halves = [o for h, o in old.items() if h.overlaps(x)]
        assert owner in halves, (x, owner, halves)


def test_halving_with_even_owners_keeps_everything_where_it_was() -> None:
    old = dict(zip(slice_ranges(8), "aabbccdd", strict=True))
    owners = assign(slice_ranges(4), "abcd", old)
    assert owners == dict(zip(slice_ranges(4), "abcd", strict=True))


def test_a_join_moves_only_what_balance_requires_and_only_to_the_joiner() -> None:
    ranges = slice_ranges(8)
    before = dict(zip(ranges, "aaaabbbb", strict=True))
    after = assign(ranges, ["a", "b", "c"], before)
    check_valid(after, ranges, "abc")
    moved = {x for x in ranges if after[x] != before[x]}
    assert {after[x] for x in moved} == {"c"}
    assert len(moved) == 2  # 8 over 3 workers: 3, 3, 2
    assert loads(after, "abc") == {"a": 3, "b": 3, "c": 2}


def test_a_leave_moves_only_the_leavers_ranges() -> None:
    ranges = slice_ranges(8)
    before = dict(zip(ranges, "aaabbbcc", strict=True))
    after = assign(ranges, ["a", "b"], before)
    assert {x: after[x] for x in ranges if before[x] != "c"} == {
        x: o for x, o in before.items() if o != "c"
    }
    assert loads(after, "ab") == {"a": 4, "b": 4}


def test_a_range_held_exactly_beats_one_held_in_part() -> None:
    # "a" still has its expired old range 0-511 (a plan counts it), "b" holds 0-255 itself.
    held = {r(0, 511): "a", r(0, 255): "b"}
    owners = assign(slice_ranges(4), ["a", "b"], held)
    assert owners[r(0, 255)] == "b"
    assert owners[r(256, 511)] == "a"


def test_a_range_held_exactly_stays_even_if_moving_it_would_keep_more_in_place() -> None:
    # Moving 0-511 to "a" would let "b" take 512-1023, of which it holds a part;
    # but 0-511 is running at "b" and balance does not require it to move.
    held = {r(0, 511): "b", r(0, 255): "a", r(512, 767): "b"}
    assert assign(slice_ranges(2), ["a", "b"], held) == {r(0, 511): "b", r(512, 1023): "a"}


def test_a_new_range_goes_to_the_worker_holding_most_of_it() -> None:
    held = {r(0, 127): "a", r(128, 511): "b"}
    owners = assign(slice_ranges(2), ["a", "b", "c"], held)
    assert owners[r(0, 511)] == "b"
    assert assign([r(0, 1023)], ["a", "b"], {r(0, 255): "a", r(256, 1023): "b"}) == {
        r(0, 1023): "b"
    }


def test_a_single_shared_slice_counts() -> None:
    assert assign([r(512, 1023)], ["a", "b"], {r(1, 512): "b"}) == {r(512, 1023): "b"}


@settings(max_examples=60, database=None, deadline=None)
@given(
    split=st.sampled_from(SPLITS),
    workers=st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True),
    data=st.data(),
)
def test_assign_ignores_the_order_of_workers_and_of_held(
    split: int, workers: list[str], data: st.DataObject
) -> None:
    ranges = slice_ranges(split)
    old = slice_ranges(data.draw(st.sampled_from(SPLITS)))
    held_items = [
        (x, data.draw(st.sampled_from([*workers, "gone"])))
        for x in data.draw(st.lists(st.sampled_from(old), unique=True))
    ]
    owners = assign(ranges, workers, dict(held_items))
    check_valid(owners, ranges, workers)
    shuffle = random.Random(data.draw(st.integers(0, 2**32)))
    for _ in range(3):
        shuffle.shuffle(workers)
        shuffle.shuffle(held_items)
        assert assign(list(reversed(ranges)), workers + workers[:1], dict(held_items)) == owners


# --- assign: joins, leaves and rescales in any order ------------------------------------------

Step = tuple[str, int]
STEPS = st.one_of(
    st.tuples(st.just("join"), st.just(0)),
    st.tuples(st.just("leave"), st.integers(0, MAX_WORKERS - 1)),
    st.tuples(st.just("rescale"), st.sampled_from(SPLITS)),
)


@settings(max_examples=150, database=None, deadline=None)
@given(
    first_split=st.sampled_from(SPLITS),
    first_workers=st.integers(1, 4),
    steps=st.lists(STEPS, max_size=20),
)
def test_assignment_stays_balanced_and_sticky(
    first_split: int, first_workers: int, steps: list[Step]
) -> None:
    names = (f"w{i:02}" for i in itertools.count())
    workers = [next(names) for _ in range(first_workers)]
    ranges = slice_ranges(first_split)
    owners = assign(ranges, workers, {})
    check_valid(owners, ranges, workers)

    for kind, arg in steps:
        before, old_ranges = owners, ranges
        if kind == "join":
            if len(workers) == MAX_WORKERS:
                continue
            joiner = next(names)
            workers = [*workers, joiner]
            owners = assign(ranges, workers, before)
            check_valid(owners, ranges, workers)
            moved = [x for x in ranges if owners[x] != before[x]]
            assert all(owners[x] == joiner for x in moved)
            wished = Counter(before.values())
            assert len(moved) == fewest_moves(wished, len(ranges), workers)
            assert len(moved) == len(ranges) // len(workers)
        elif kind == "leave":
            if len(workers) == 1:
                continue
            leaver = workers[arg % len(workers)]
            workers = [w for w in workers if w != leaver]
            owners = assign(ranges, workers, before)
            check_valid(owners, ranges, workers)
            survivors_moved = [x for x in ranges if before[x] != leaver and owners[x] != before[x]]
            assert survivors_moved == []
        else:
            ranges = slice_ranges(arg)
            owners = assign(ranges, workers, before)
            check_valid(owners, ranges, workers)
            if len(ranges) % len(old_ranges) == 0:
                # A finer split: each new range wishes to stay with its parent's owner.
                heirs = {x: before[parent(x, old_ranges)] for x in ranges}
                misplaced = [x for x in ranges if owners[x] != heirs[x]]
                wished = Counter(heirs.values())
                assert len(misplaced) == fewest_moves(wished, len(ranges), workers)
                if len(old_ranges) % len(workers) == 0:
                    assert misplaced == []
            else:
                # A coarser split: the owner held part of the range, unless balance forbids.
                strangers = [
                    x
                    for x in ranges
                    if all(before[o] != owners[x] for o in old_ranges if o.overlaps(x))
                ]
                if len(old_ranges) % len(workers) == 0 and len(ranges) >= len(workers):
                    assert strangers == []


# --- plan: examples --------------------------------------------------------------------------

NOW = 1_000.0
LATER = NOW + 10.0
EARLIER = NOW - 1.0


def lease(x: SliceRange, owner: str | None, expires_at: float = LATER, epoch: int = 1) -> LeaseRow:
    return LeaseRow(x, owner, epoch, expires_at)


def test_a_lone_worker_claims_everything() -> None:
    assert plan("a", slice_ranges(2), [], [], NOW) == Plan(
        release=(), claim=(r(0, 511), r(512, 1023)), keep=(), waiting=()
    )


def test_a_joiner_waits_until_the_holder_releases() -> None:
    ranges = slice_ranges(4)
    rows = [lease(x, "a") for x in ranges]
    workers = ["a", "b"]
    holder = plan("a", ranges, workers, rows, NOW)
    joiner = plan("b", ranges, workers, rows, NOW)
    assert set(holder.release) == set(joiner.waiting)
    assert len(holder.release) == 2
    assert joiner.claim == () and joiner.keep == () and joiner.release == ()
    assert holder.claim == () and holder.waiting == ()
    assert sorted(holder.keep + holder.release) == ranges

    released = [lease(x, None) if x in holder.release else lease(x, "a") for x in ranges]
    assert plan("b", ranges, workers, released, NOW).claim == joiner.waiting
    assert plan("a", ranges, workers, released, NOW).keep == holder.keep


def test_a_dead_owners_lease_blocks_until_it_expires() -> None:
    ranges = slice_ranges(2)
    rows = [lease(r(0, 511), "b"), lease(r(512, 1023), "a", expires_at=LATER + 5)]
    blocked = plan("b", ranges, ["b"], rows, NOW)
    assert blocked.keep == (r(0, 511),)
    assert blocked.waiting == (r(512, 1023),)
    assert blocked.claim == () and blocked.release == ()
    freed = plan("b", ranges, ["b"], rows, LATER + 5)
    assert freed.claim == (r(512, 1023),)
    assert freed.keep == (r(0, 511),)  # my own expired row: I try to renew it


def test_my_expired_row_is_kept_not_claimed() -> None:
    rows = [lease(r(0, 1023), "a", expires_at=EARLIER)]
    assert plan("a", slice_ranges(1), ["a"], rows, NOW) == Plan(
        release=(), claim=(), keep=(r(0, 1023),), waiting=()
    )


def test_released_and_expired_rows_of_others_do_not_block() -> None:
    rows = [lease(r(0, 511), None), lease(r(512, 1023), "b", expires_at=EARLIER)]
    assert plan("a", slice_ranges(1), ["b"], rows, NOW) == Plan(
        release=(), claim=(r(0, 1023),), keep=(), waiting=()
    )


def test_doubling_releases_the_parent_and_claims_both_halves_at_once() -> None:
    rows = [lease(r(0, 511), "a"), lease(r(512, 1023), "b")]
    assert plan("a", slice_ranges(4), ["a", "b"], rows, NOW) == Plan(
        release=(r(0, 511),), claim=(r(0, 255), r(256, 511)), keep=(), waiting=()
    )


def test_halving_waits_for_the_other_half() -> None:
    rows = [lease(r(0, 511), "a"), lease(r(512, 1023), "b")]
    a = plan("a", slice_ranges(1), ["a", "b"], rows, NOW)
    b = plan("b", slice_ranges(1), ["a", "b"], rows, NOW)
    assert a == Plan(release=(r(0, 511),), claim=(), keep=(), waiting=(r(0, 1023),))
    assert b == Plan(release=(r(512, 1023),), claim=(), keep=(), waiting=())
    rows = [lease(r(0, 511), None), lease(r(512, 1023), None)]
    assert plan("a", slice_ranges(1), ["a", "b"], rows, NOW).claim == (r(0, 1023),)


def test_a_repeated_row_is_resolved_whatever_the_order() -> None:
    rows = [
        lease(r(0, 1023), "b", epoch=7),
        lease(r(0, 1023), "a", expires_at=EARLIER, epoch=6),
    ]
    expected = Plan(release=(), claim=(), keep=(), waiting=(r(0, 1023),))
    assert plan("a", slice_ranges(1), ["a"], rows, NOW) == expected
    assert plan("a", slice_ranges(1), ["a"], rows[::-1], NOW) == expected


# --- plan: a simulated fleet on a simulated database clock ---------------------------------------

TTL = 10.0
RENEW_EVERY = TTL / 3
TICK_EVERY = TTL / 4


@attrs.define
class Fleet:
    """The lease and worker tables, and what the workers did to them."""

    desired: list[SliceRange]
    leases: dict[SliceRange, LeaseRow] = attrs.field(factory=dict)
    heartbeats: dict[str, float] = attrs.field(factory=dict)
    claims: list[tuple[float, str, SliceRange]] = attrs.field(factory=list)

    def live_workers(self, now: float) -> list[str]:
        return sorted(w for w, expires_at in self.heartbeats.items() if expires_at > now)

    def renew(self, me: str, now: float) -> None:
        self.heartbeats[me] = now + TTL
        for x, row in self.leases.items():
            if row.owner == me and row.live(now):
                self.leases[x] = attrs.evolve(row, expires_at=now + TTL)

    def tick(self, me: str, now: float) -> Plan:
        decided = plan(me, self.desired, self.live_workers(now), self.leases.values(), now)
        for x in decided.release:
            assert self.leases[x].owner == me
            self.leases[x] = attrs.evolve(self.leases[x], owner=None)
        for x in decided.claim:
            others = [
                row
                for row in self.leases.values()
                if row.live(now) and row.owner != me and row.slice_range.overlaps(x)
            ]
            assert others == [], f"{me} claims {x} at {now} over {others}"
            previous = self.leases.get(x)
            epoch = previous.epoch + 1 if previous else 1
            self.leases[x] = LeaseRow(x, me, epoch, now + TTL)
            self.claims.append((now, me, x))
        self.check_no_overlap(now)
        return decided

    def check_no_overlap(self, now: float) -> None:
        # Only a claim can make a lease live, so checking after each tick covers every instant.
        live = sorted(
            (row for row in self.leases.values() if row.live(now)), key=lambda row: row.slice_range
        )
        for i, row in enumerate(live):
            for other in live[i + 1 :]:
                if other.slice_range.min_slice > row.slice_range.max_slice:
                    break
                assert other.owner == row.owner, f"{row} and {other} overlap at {now}"

    def converged(self, workers: Sequence[str], now: float) -> bool:
        """Every desired range leased by a live worker, balanced; no other live lease."""
        live = {row.slice_range: row.owner for row in self.leases.values() if row.live(now)}
        if sorted(live) != sorted(self.desired) or not set(live.values()) <= set(workers):
            return False
        counts = Counter(live.values())
        per_worker = [counts[w] for w in workers]
        return max(per_worker) - min(per_worker) <= 1


def schedule(
    phases: Mapping[str, tuple[float, float]], until: float
) -> list[tuple[float, int, str]]:
    """Renewals (kind 0) every ttl/3 and ticks (kind 1) every ttl/4, per worker from its phase."""
    events: list[tuple[float, int, str]] = []
    for worker, (renew_phase, tick_phase) in phases.items():
        for kind, phase, every in ((0, renew_phase, RENEW_EVERY), (1, tick_phase, TICK_EVERY)):
            t = phase
            while t < until:
                events.append((t, kind, worker))
                t += every
    heapq.heapify(events)
    return [heapq.heappop(events) for _ in range(len(events))]


PHASES = st.tuples(st.floats(0, RENEW_EVERY, exclude_max=True), st.floats(0, TICK_EVERY))


def start(workers: Sequence[str], desired: list[SliceRange]) -> Fleet:
    fleet = Fleet(desired)
    for w in workers:
        fleet.heartbeats[w] = TTL  # every worker registered at time 0
    return fleet


@settings(max_examples=25, database=None, deadline=None)
@given(
    split=st.sampled_from([4, 8, 16, 32]),
    phases=st.lists(PHASES, min_size=2, max_size=4),
    victim_index=st.integers(0, 3),
    kill_at=st.floats(2 * TTL, 3 * TTL),
)
def test_a_dead_workers_ranges_are_taken_over_within_two_ttls(
    split: int, phases: list[tuple[float, float]], victim_index: int, kill_at: float
) -> None:
    workers = [f"w{i}" for i in range(len(phases))]
    victim = workers[victim_index % len(workers)]
    survivors = [w for w in workers if w != victim]
    fleet = start(workers, slice_ranges(split))
    until = kill_at + 3 * TTL
    orphans: list[SliceRange] | None = None
    for now, kind, worker in schedule(dict(zip(workers, phases, strict=True)), until):
        if orphans is None and now >= kill_at:
            assert fleet.converged(workers, kill_at), fleet.leases
            orphans = [x for x, row in fleet.leases.items() if row.owner == victim]
            assert orphans
        if worker == victim and now >= kill_at:
            continue
        (fleet.renew if kind == 0 else fleet.tick)(worker, now)

    assert orphans is not None
    for x in orphans:
        taken = [t for t, w, y in fleet.claims if y == x and t > kill_at and w in survivors]
        assert taken, f"{x} of {victim} (killed at {kill_at}) never taken over"
        assert taken[0] - kill_at <= 2 * TTL, f"{x} taken over {taken[0] - kill_at}s after"
    assert fleet.converged(survivors, until)
    assert victim not in fleet.live_workers(until)


RESCALE_TICKS = 3


@settings(max_examples=30, database=None, deadline=None)
@given(
    splits=st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]), min_size=2, max_size=2, unique=True),
    phases=st.lists(PHASES, min_size=1, max_size=4),
    rescale_at=st.floats(2 * TTL, 3 * TTL),
)
def test_a_rescale_never_overlaps_and_converges(
    splits: list[int], phases: list[tuple[float, float]], rescale_at: float
) -> None:
    old, new = (slice_ranges(n) for n in splits)
    workers = [f"w{i}" for i in range(len(phases))]
    fleet = start(workers, old)
    until = rescale_at + 3 * TTL
    converged_at: float | None = None
    claims_before: int | None = None
    for now, kind, worker in schedule(dict(zip(workers, phases, strict=True)), until):
        if fleet.desired is old and now >= rescale_at:
            assert fleet.converged(workers, rescale_at), fleet.leases
            fleet.desired = new
        (fleet.renew if kind == 0 else fleet.tick)(worker, now)
        if fleet.desired is new and converged_at is None and fleet.converged(workers, now):
            converged_at, claims_before = now, len(fleet.claims)

    # Holders release on their first tick after the rescale, claimants claim on the next.
    assert converged_at is not None, fleet.leases
    assert converged_at - rescale_at <= RESCALE_TICKS * TICK_EVERY
    assert fleet.converged(workers, until)
    assert len(fleet.claims) == claims_before, "the fleet kept moving after it converged"


@pytest.mark.parametrize("workers", [1, 3])
def test_a_fleet_started_empty_converges_in_one_tick(workers: int) -> None:
    names = [f"w{i}" for i in range(workers)]
    fleet = start(names, slice_ranges(8))
    phases = {w: (0.1 * i, 0.2 * i) for i, w in enumerate(names)}
    for now, kind, worker in schedule(phases, TICK_EVERY + 1):
        (fleet.renew if kind == 0 else fleet.tick)(worker, now)
    assert fleet.converged(names, TICK_EVERY + 1)
    assert len(fleet.claims) == 8

"""Issue 27, part 3: the offset store never hands out an envelope from an id's past.

Per pid the handled record is the newest by (timestamp, seq_nr); an envelope
older than it — of its own lifetime, or from before a handled tombstone of
`Journal.delete_all` — is a duplicate, whatever its seq_nr. The cases of the
issue first, through `OffsetState` and through the real projection core;
then a model of the journal with lifetimes (appends, erasures with and
without a reset, retention's deletion markers, late commits, erasure
batches that leave the old rows visible for a while) driven through the core
with re-deliveries, crashes, restarts and cleanup, against an offset table
that, like the real one, refuses a row it already holds (`OffsetConflict`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from journal import EventEnvelope, TimestampOffset
from projections.core import (
    Action,
    Commit,
    GapFill,
    MissingEvents,
    Mode,
    Previous,
    PreviousTimestamp,
    ProjectionCore,
    StoredOffset,
)
from projections.offset_store import OffsetState, Record, Verdict
from projections.settings import ProjectionSettings

BASE = datetime(2025, 3, 1, tzinfo=UTC)
WINDOW = timedelta(minutes=5)
SLICE = 7

ACCEPTED = Verdict.ACCEPTED
DUPLICATE = Verdict.DUPLICATE


def at(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)


def env(pid: str, seq_nr: int, seconds: float, *, deleted: bool = False) -> EventEnvelope:
    return EventEnvelope(
        pid, "T", SLICE, seq_nr, at(seconds), None if deleted else "e",
        offset=TimestampOffset(at(seconds)), deleted=deleted,
    )  # fmt: skip


def core(records: Iterable[Record] = (), **changes: object) -> ProjectionCore:
    kw: dict[str, Any] = {"group_after_envelopes": 1000, "group_after_duration": 60.0}
    c = ProjectionCore(Mode.GROUPED, ProjectionSettings(**{**kw, **changes}), [SLICE])
    c.start(records)
    return c


def old_lifetime() -> list[Record]:
    """p handled 1..3 (at 10, 11, 12), then its reset tombstone (seq_nr 0, at 20)."""
    return [Record(SLICE, "p", n, at(9 + n)) for n in (1, 2, 3)] + [Record(SLICE, "p", 0, at(20))]


# -- the cases of the issue ----------------------------------------------------------------------


@pytest.mark.timeout(5)
def test_after_a_handled_reset_tombstone_the_previous_lifetime_is_a_duplicate() -> None:
    # The erasure's batches have not removed seq_nr 1..3 yet: backtracking (or a
    # restart) delivers them again. The handled tombstone is seq_nr 0, so seq_nr 1
    # looked like "handled + 1": accepted, and its offset row clashed with the
    # one stored before (OffsetConflict on a single instance).
    rows = old_lifetime()
    for records in (rows, rows[::-1], rows[-1:]):  # loaded in any order; old rows cleaned up
        state = OffsetState(WINDOW, records)
        for n in (1, 2, 3):
            assert state.validate("p", n, SLICE, at(9 + n)).verdict is DUPLICATE, (records, n)
        # Not a gap either, whatever the deletion evidence (retention's marker).
        assert state.validate("p", 3, SLICE, at(12), deleted_to=2).verdict is DUPLICATE
        # The new lifetime goes on from the tombstone.
        assert state.validate("p", 1, SLICE, at(21)).verdict is ACCEPTED
        assert state.validate("p", 2, SLICE, at(21)).verdict is Verdict.GAP


@pytest.mark.timeout(5)
def test_the_core_drops_a_previous_lifetime_redelivered_after_its_tombstone() -> None:
    c = core([Record(SLICE, "p", n, at(9 + n)) for n in (1, 2, 3)])
    assert c.offer(env("p", 0, 20, deleted=True), 0.0) is None  # the reset tombstone
    # Backtracking ~12 s later, before the batch is saved and after.
    for n in (1, 2, 3):
        assert c.offer(env("p", n, 9 + n), 1.0) is None
    commit = c.flush(1.0)
    assert isinstance(commit, Commit)
    assert [(r.seq_nr, r.timestamp) for r in commit.events] == [(0, at(20))]
    c.committed(1.0)
    for n in (3, 1, 2):  # in any order, never a request for a gap
        assert c.offer(env("p", n, 9 + n), 2.0) is None
    assert not c.pending and not c.held
    assert c.stats.duplicates == 6 and c.stats.accepted == 1
    # The new lifetime is applied.
    assert c.offer(env("p", 1, 21), 3.0) is None
    assert [(e.seq_nr, e.db_timestamp) for e in c.pending] == [(1, at(21))]


@pytest.mark.timeout(5)
def test_a_held_envelope_of_a_previous_lifetime_is_dropped_once_its_tombstone_is_handled() -> None:
    # A projection that never saw p reads seq_nr 4 while the erasure has already
    # removed 1..3 (no deletion marker above them: the reset tombstone is at 0).
    # It is held; once the tombstone is handled, it is from before it: dropped.
    c = core([Record(SLICE, "x", 1, at(30))])
    assert c.offer(env("p", 4, 13), 0.0) == PreviousTimestamp("p", 3)
    assert c.answer(Previous(None, 0), 0.0) is None
    assert [e.seq_nr for e in c.held] == [4]
    assert c.offer(env("p", 0, 20, deleted=True), 1.0) is None
    assert c.poll(1.0) is None  # the held one is retried at once: a duplicate now
    assert c.held == () and [e.seq_nr for e in c.pending] == [0]


@pytest.mark.timeout(5)
def test_a_gap_is_not_filled_with_a_later_lifetime_of_the_id() -> None:
    # Found by the erasure soak: p handled 1..35 (the last at 28.5). Its event 37
    # (at 29.9, of that lifetime) comes from a read buffered before the id was reset
    # and written again: its 36 is gone, and the journal's 36 now is the next
    # lifetime's (at 32.1). Taken for the missing one, it was handled as 35 + 1;
    # the reset tombstone (at 30.8) was then older than it and dropped, and so was
    # the new lifetime up to 36.
    c = core([Record(SLICE, "p", n, at(n * 0.8)) for n in range(1, 36)])
    assert c.offer(env("p", 37, 29.9), 0.0) == MissingEvents("p", 36, 36)
    assert c.answer(GapFill([env("p", 36, 32.1)]), 0.0) is None
    assert not c.pending and [e.seq_nr for e in c.held] == [37]
    assert c.offer(env("p", 0, 30.8, deleted=True), 1.0) is None  # the reset tombstone
    assert c.poll(1.0) is None  # 37 is retried: from before the tombstone, a duplicate
    assert c.held == ()
    for n in range(1, 37):  # the new lifetime, all of it
        assert c.offer(env("p", n, 31 + n / 100), 2.0) is None
    assert [(e.seq_nr, e.db_timestamp) for e in c.pending] == [(0, at(30.8))] + [
        (n, at(31 + n / 100)) for n in range(1, 37)
    ]


@pytest.mark.timeout(5)
def test_an_unknown_ids_previous_event_of_a_later_lifetime_is_not_its_predecessor() -> None:
    # The same through an instance that has no record of p: 36 is the later lifetime's,
    # and so are the events its gap fill finds. Event 37 is held.
    c = core([Record(SLICE, "x", 1, at(1))])
    assert c.offer(env("p", 37, 29.9), 0.0) == PreviousTimestamp("p", 36)
    assert c.answer(Previous(at(32.1), 0), 0.0) == MissingEvents("p", 1, 36)
    assert c.answer(GapFill([env("p", n, 31 + n / 10) for n in (35, 36)]), 0.0) is None
    assert not c.pending and [e.seq_nr for e in c.held] == [37]
    assert c.offer(env("p", 0, 30.8, deleted=True), 1.0) is None
    assert c.poll(1.0) is None
    assert c.held == () and [e.seq_nr for e in c.pending] == [0]


@pytest.mark.timeout(5)
def test_a_later_lifetimes_tombstone_found_by_a_gap_fill_is_handled_first() -> None:
    # The later lifetime was erased too, keeping its sequence: its tombstone (at 32.5)
    # erases everything of p before it, event 37 of the earlier lifetime included.
    c = core([Record(SLICE, "p", n, at(n * 0.8)) for n in range(1, 36)])
    assert c.offer(env("p", 37, 29.9), 0.0) == MissingEvents("p", 36, 36)
    assert c.answer(GapFill([env("p", 36, 32.5, deleted=True)], 36), 0.0) is None
    assert c.held == () and [(e.seq_nr, e.deleted) for e in c.pending] == [(36, True)]
    assert c.offer(env("p", 0, 30.8, deleted=True), 1.0) is None  # from before it
    assert c.offer(env("p", 37, 32.6), 1.0) is None  # the next lifetime goes on
    assert [(e.seq_nr, e.deleted) for e in c.pending] == [(36, True), (37, False)]


@pytest.mark.timeout(5)
def test_an_envelope_older_than_its_ids_stored_record_is_a_duplicate() -> None:
    # Records of two lifetimes: p1:3 at t, then p1:2 at t + 1 ms (the newer
    # lifetime). p1:3 at t is not "2 + 1": it was handled.
    t, later = 50.0, 50.001
    first, second = Record(SLICE, "p1", 3, at(t)), Record(SLICE, "p1", 2, at(later))
    saved = OffsetState(WINDOW)
    saved.saved([first])
    saved.saved([second])
    for state in (
        saved,
        OffsetState(WINDOW, [first, second]),
        OffsetState(WINDOW, [second, first]),
    ):
        assert state.seq_nr_of("p1") == 2
        assert state.validate("p1", 3, SLICE, at(t)).verdict is DUPLICATE
        assert state.validate("p1", 4, SLICE, at(t)).verdict is DUPLICATE
        assert state.validate("p1", 3, SLICE, at(later)).verdict is ACCEPTED
    # In flight the same: an accepted later lifetime is never replaced by an older event.
    state = OffsetState(WINDOW, [first])
    state.accept("p1", 2, at(later))
    state.accept("p1", 4, at(t))
    assert state.seq_nr_of("p1") == 2
    assert state.validate("p1", 3, SLICE, at(t)).verdict is DUPLICATE
    state.saved([Record(SLICE, "p1", 1, at(later))])  # an older record does not settle it
    assert state.seq_nr_of("p1") == 2
    state.saved([second])
    assert state.validate("p1", 3, SLICE, at(later)).verdict is ACCEPTED


@pytest.mark.timeout(5)
def test_an_old_event_after_the_window_evicted_its_id_is_still_a_duplicate() -> None:
    # The tombstone is older than the window now: memory forgot p, and anything
    # from before the tombstone is older than the window too.
    state = OffsetState(timedelta(seconds=60), [*old_lifetime(), Record(SLICE, "x", 1, at(200))])
    assert state.evict() == 1
    assert state.seq_nr_of("p") is None
    for n in (1, 2, 3):
        assert state.validate("p", n, SLICE, at(9 + n)).verdict is DUPLICATE
    # With the table keeping rows longer, the lookup restores the tombstone's record.
    trimmed = OffsetState(
        timedelta(seconds=60), [*old_lifetime(), Record(SLICE, "x", 1, at(200))],
        table_outlives_memory=True,
    )  # fmt: skip
    trimmed.evict()
    assert trimmed.validate("p", 2, SLICE, at(150)).verdict is Verdict.NEEDS_STORED_OFFSET
    trimmed.looked_up("p", Record(SLICE, "p", 0, at(20)))
    assert trimmed.validate("p", 2, SLICE, at(150)).verdict is Verdict.GAP  # 1 of the new lifetime


# -- a model of the journal with lifetimes ----------------------------------------------------

NEVER = 10**9


@attrs.define
class Row:
    """A journal row: written at `ts`, committed (visible) at tick `visible`, removed at
    tick `gone`. `deleted`: a tombstone (delivered) or retention's marker (not)."""

    pid: str
    slice: int
    seq_nr: int
    ts: int
    visible: int
    gone: int = NEVER
    deleted: bool = False
    tombstone: bool = False

    def present(self, tick: int) -> bool:
        return self.visible <= tick < self.gone

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.pid, self.seq_nr, self.ts)

    def envelope(self) -> EventEnvelope:
        return EventEnvelope(
            self.pid, "T", self.slice, self.seq_nr, at(self.ts),
            None if self.tombstone else "e", offset=TimestampOffset(at(self.ts)),
            deleted=self.tombstone,
        )  # fmt: skip


@attrs.define
class _Id:
    highest: int = 0
    last_ts: int = -1
    last_visible: int = 0
    free_at: int = 0


@st.composite
def histories(draw: st.DrawFn) -> list[Row]:
    """A few ids; appends of 1-3 events, `delete_all` with or without a reset (its
    batches remove the old rows some ticks after the tombstone commits; the id is
    written again only once they are done), retention (`delete_events_to`: rows up
    to a seq_nr gone, a deletion marker there). Per id, timestamps increase and
    commits happen in order; across ids, commits are late by up to a few ticks."""
    pids = [f"T|p{i}" for i in range(draw(st.integers(1, 3)))]
    slices = draw(st.integers(1, 2))
    ids = {pid: _Id() for pid in pids}
    lateness = draw(st.integers(0, 3))
    rows: list[Row] = []
    tick = 0
    for _ in range(draw(st.integers(1, 20))):
        tick += draw(st.integers(0, 3))
        pid = draw(st.sampled_from(pids))
        i, slice_ = ids[pid], pids.index(pid) % slices
        mine = [r for r in rows if r.pid == pid and r.gone == NEVER]
        ts = max(tick, i.last_ts + 1, i.free_at)
        visible = max(i.last_visible, ts + draw(st.integers(0, lateness)))
        kind = draw(st.sampled_from(["append", "append", "append", "erase", "erase", "retain"]))
        if kind == "erase" and mine:
            reset = draw(st.integers(0, 2)) > 0
            seq_nr = 0 if reset else max(r.seq_nr for r in mine) + 1
            # Row 0, an earlier reset's tombstone, stays (`delete_all` keeps it).
            doomed = sorted((r for r in mine if r.seq_nr > 0 and (reset or r.seq_nr < seq_nr)),
                            key=lambda r: r.seq_nr)  # fmt: skip
            gone = visible + draw(st.integers(0, 3))
            for r in doomed:  # bounded batches, lowest seq_nrs first
                gone += draw(st.integers(0, 3))
                r.gone = gone
            for r in mine:
                if reset and r.seq_nr == 0:
                    r.gone = visible  # a second reset moves the tombstone on
            rows.append(Row(pid, slice_, seq_nr, ts, visible, deleted=True, tombstone=True))
            i.highest, i.free_at = seq_nr, gone + 1
        elif kind == "retain" and any(not r.deleted and r.visible <= tick for r in mine):
            upto = draw(st.sampled_from([r for r in mine if not r.deleted and r.visible <= tick]))
            for r in mine:
                if not r.deleted and r.seq_nr <= upto.seq_nr:
                    r.gone = max(tick, r.visible)
            rows.append(Row(pid, slice_, upto.seq_nr, upto.ts, max(tick, upto.visible),
                            deleted=True))  # fmt: skip
            continue
        else:
            for _ in range(draw(st.integers(1, 3))):
                i.highest += 1
                rows.append(Row(pid, slice_, i.highest, ts, visible))
        i.last_ts, i.last_visible = ts, visible
    return rows


def delivered(row: Row) -> bool:
    """What queries deliver: events and tombstones, not retention's deletion markers."""
    return row.tombstone or not row.deleted


class Journal:
    """What the runners read, at a tick: by persistence id, a timestamp, the evidence."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = rows
        self.tick = 0

    def _present(self, pid: str) -> list[Row]:
        return [r for r in self.rows if r.pid == pid and r.present(self.tick)]

    def previous(self, pid: str, seq_nr: int) -> Previous:
        found = [r for r in self._present(pid) if r.seq_nr == seq_nr and delivered(r)]
        return Previous(at(found[0].ts) if found else None, self.evidence(pid, seq_nr))

    def fill(self, pid: str, lo: int, hi: int) -> GapFill:
        found = sorted(
            (r for r in self._present(pid) if lo <= r.seq_nr <= hi and delivered(r)),
            key=lambda r: r.seq_nr,
        )
        return GapFill([r.envelope() for r in found], self.evidence(pid, lo))

    def evidence(self, pid: str, from_seq_nr: int) -> int:
        """`deleted_to`: the highest deleted row's seq_nr at or above `from_seq_nr`, or 0."""
        markers = (r.seq_nr for r in self._present(pid) if r.deleted and r.seq_nr >= from_seq_nr)
        return max(markers, default=0)


class OffsetConflictError(AssertionError):
    pass


class Table:
    """The offset table: its primary key refuses a row it holds (`OffsetConflict`);
    cleanup per slice keeps rows within the window of the slice's latest, or all of
    them (`delete_after_consumed` not reached)."""

    def __init__(self) -> None:
        self.rows: set[Record] = set()

    def save(self, records: Iterable[Record]) -> None:
        for r in records:
            if r in self.rows:
                raise OffsetConflictError(f"a row stored before: {r}")
            self.rows.add(r)

    def cleanup(self, window: timedelta) -> None:
        latest: dict[int, datetime] = {}
        for r in self.rows:
            latest[r.slice] = max(latest.get(r.slice, r.timestamp), r.timestamp)
        self.rows = {r for r in self.rows if r.timestamp >= latest[r.slice] - window}

    def newest(self, pid: str, slice_: int) -> Record | None:
        mine = [r for r in self.rows if r.persistence_id == pid and r.slice == slice_]
        return max(mine, key=lambda r: (r.timestamp, r.seq_nr), default=None)


class Instance:
    """One projection instance over slices 0-1: the real core, its requests answered
    from the journal model and the table; `committed` is what was handed out."""

    def __init__(self, journal: Journal, table: Table, window: int, keep: bool) -> None:
        self.journal, self.table = journal, table
        self.settings = ProjectionSettings(
            group_after_envelopes=1000, group_after_duration=timedelta(minutes=1),
            time_window=timedelta(seconds=window),
            delete_after_consumed=timedelta(days=1) if keep else None,
        )  # fmt: skip
        self.committed: list[tuple[str, int, int]] = []
        self.seen: list[str] = []  # what happened, for hypothesis' statistics
        self.core = self.restart()

    def restart(self) -> ProjectionCore:
        self.core = ProjectionCore(Mode.GROUPED, self.settings, [0, 1])
        self.core.start(self.table.rows)
        return self.core

    def drive(self, action: Action | None) -> None:
        while action is not None:
            self.seen.append(type(action).__name__)
            if isinstance(action, StoredOffset):
                reply: Any = self.table.newest(action.persistence_id, action.slice)
            elif isinstance(action, PreviousTimestamp):
                reply = self.journal.previous(action.persistence_id, action.seq_nr)
            elif isinstance(action, MissingEvents):
                reply = self.journal.fill(action.persistence_id, action.from_seq_nr,
                                          action.to_seq_nr)  # fmt: skip
            else:
                raise AssertionError(f"unexpected {action}")
            action = self.core.answer(reply, 0.0)

    def deliver(self, row: Row) -> None:
        tombstones = [ts for pid, n, ts in self.committed if pid == row.pid and n == 0]
        if tombstones and row.ts < max(tombstones):
            self.seen.append("a previous lifetime after its handled reset tombstone")
        self.drive(self.core.offer(row.envelope(), 0.0))

    def flush(self) -> None:
        self.drive(self.core.retry(0.0))
        commit = self.core.flush(0.0)
        if commit is None:
            return
        assert isinstance(commit, Commit)
        self.table.save(commit.records)
        self.committed += [(r.persistence_id, r.seq_nr, int((r.timestamp - BASE).total_seconds()))
                           for r in commit.events]  # fmt: skip
        assert self.core.committed(0.0) is None


def readable(rows: Iterable[Row], tick: int) -> list[Row]:
    """What a slice query can deliver at `tick`: events and tombstones still there, in
    (timestamp, seq_nr) order (retention's markers stand for deleted events)."""
    there = (r for r in rows if r.present(tick) and delivered(r))
    return sorted(there, key=lambda r: (r.ts, r.seq_nr))


@settings(max_examples=600, deadline=None)
@given(histories(), st.integers(0, 2**32), st.booleans())
@pytest.mark.timeout(60)
def test_every_event_is_handed_out_at_most_once_and_nothing_from_an_ids_past(
    rows: list[Row], seed: int, keep: bool
) -> None:
    rng = random.Random(seed)
    journal = Journal(rows)
    table = Table()
    window = 14  # covers the lateness and the lags: a first delivery is never older
    lag, late = rng.choice((0, 1, 3, 6)), rng.choice((0, 1, 2, 4))
    p = Instance(journal, table, window, keep)
    end = max(max(r.visible for r in rows), max((r.gone for r in rows if r.gone < NEVER),
                                                 default=0)) + 2  # fmt: skip
    for tick in range(end + lag + late + 1):
        journal.tick = tick
        there = readable(rows, tick)
        # The query: rows as they commit, in (timestamp, seq_nr) order; read `late` ticks
        # after they commit (what is gone by then is not read) and handled `lag` ticks
        # after the read (a projection behind: its reads by persistence id see the
        # present) ...
        if tick >= lag + late:
            for row in readable(rows, tick - lag):
                if row.visible == tick - lag - late:
                    p.deliver(row)
        # ... and backtracking, behind where the query got: rows still there, again ...
        behind = [r for r in readable(rows, tick - lag) if r.visible <= tick - lag - late]
        for _ in range(rng.randrange(4)):
            if behind:
                p.deliver(rng.choice(behind))
        # ... and a row the query read a few ticks before, handled only now: it may be
        # gone, its id reset and written again meanwhile.
        read_at = tick - lag - late - rng.randint(1, 4)
        if read_at >= 0 and rng.random() < 0.3:
            buffered = readable(rows, read_at)
            if buffered:
                p.deliver(rng.choice(buffered))
        if rng.random() < 0.1:
            p.core.failed()  # a crash: the pending batch is lost; the restart reads again
            p.restart()
            for row in there:
                p.deliver(row)
        p.flush()
        if rng.random() < 0.3:
            if not keep:
                table.cleanup(timedelta(seconds=window))
            if p.core.state.evict():
                p.seen.append("ids evicted")
    # A last restart reads whatever is still there.
    p.restart()
    for row in readable(rows, end):
        p.deliver(row)
    p.flush()
    for what in sorted(set(p.seen)):
        event(what)

    # At most once (the table would have refused a second row, had it kept the first).
    assert len(set(p.committed)) == len(p.committed), p.committed
    # Per id, handed out in (timestamp, seq_nr) order: nothing older than what it handled,
    # so nothing from before a handled tombstone.
    last: dict[str, tuple[int, int]] = {}
    for pid, seq_nr, ts in p.committed:
        assert (ts, seq_nr) > last.get(pid, (-1, -1)), (pid, seq_nr, ts, p.committed)
        last[pid] = (ts, seq_nr)
    # Nothing that is still there is lost: the last lifetime and the tombstones.
    still_there = {r.key for r in rows if r.gone == NEVER and (r.tombstone or not r.deleted)}
    assert still_there <= set(p.committed), (still_there - set(p.committed), p.committed)

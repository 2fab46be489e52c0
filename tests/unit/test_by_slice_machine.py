"""The slice query state machine, driven against an in-memory model of the journal.

No database here on purpose: `BySliceQuery` is sans-I/O, so its decisions can be
checked over thousands of generated histories (late commits, ties, bounded
catch-up) in seconds. The model executes each request with the same semantics
as the SQL in `journal/query/sql.py`; the PostgreSQL tests in
`test_slice_queries.py` check that SQL against a real server.
"""

from __future__ import annotations

import bisect
import functools
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import InvalidSettings, QuerySettings, TimestampOffset
from journal.model import EPOCH
from journal.query.buckets import CHUNK_BUFFERS
from journal.query.by_slice import (
    BUCKET_SECONDS,
    BucketsQuery,
    BySliceQuery,
    Done,
    HeartbeatDue,
    HorizonQuery,
    Request,
    RowsQuery,
    Wait,
    bucket_start,
)
from journal.query.horizon import Blind, Horizon, OpenTransaction
from journal.settings import BacktrackingSettings, HorizonSettings

BASE = EPOCH + timedelta(days=20000)


@functools.cache  # the model asks for the same few instants millions of times
def at(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)


@attrs.frozen
class Ev:
    pid: str
    seq_nr: int
    ts: float  # db_timestamp, seconds after BASE
    commit: float  # when it becomes visible
    # When its transaction takes the journal's write lock (None: at `ts`); before
    # that it is an open transaction that has not written yet.
    writes_from: float | None = None


def row(ev: Ev) -> tuple[Any, ...]:
    # Column layout of journal.rows: pid, entity_type, slice, seq_nr, db_timestamp, ...
    return (ev.pid, "T", 0, ev.seq_nr, at(ev.ts), "w", None, 1, "", None, None, None, b"x")


class Model:
    """Executes BySliceQuery requests against a list of events with commit times.

    The machine asks it hundreds of thousands of times per test, so it answers
    from indexes built once: rows by bisecting the timestamps, the open
    transactions from a table of the instants where that set changes.
    """

    def __init__(self, events: list[Ev]) -> None:
        self.events = sorted(events, key=lambda e: (e.ts, e.seq_nr, e.pid))
        # Non-decreasing, as `at` is: the rows query bisects it for its range.
        self.timestamps = [at(e.ts) for e in self.events]
        # One transaction per (pid, start, commit), in the order of its first event,
        # whose position is its backend: unique and stable.
        first: dict[tuple[str, float, float], tuple[int, float, float, float]] = {}
        for i, e in enumerate(self.events):
            writes = e.ts if e.writes_from is None else e.writes_from
            first.setdefault((e.pid, e.ts, e.commit), (i, e.ts, e.commit, writes))
        self.transactions = list(first.values())
        # Which transactions are open (and which write) changes only at these instants.
        self.changes = sorted({t for tx in self.transactions for t in tx[1:]})
        self.open_between: dict[int, tuple[OpenTransaction, ...]] = {}

    def visible(self, now: float) -> list[Ev]:
        return [e for e in self.events if e.commit <= now]

    def horizon(self, now: float) -> Horizon:
        """The open transactions at `now`: one per (pid, start, commit) still uncommitted.

        Its start is the events' db_timestamp, as with transaction_timestamp().
        """
        between = bisect.bisect_right(self.changes, now)
        open_ = self.open_between.get(between)
        if open_ is None:
            open_ = tuple(
                OpenTransaction(backend, at(ts), now >= writes)
                for backend, ts, commit, writes in self.transactions
                if ts <= now < commit
            )
            self.open_between[between] = open_
        return Horizon(at(now), open_)

    def rows(self, q: RowsQuery, now: float) -> list[Ev]:
        ends = [q.until_exclusive, q.horizon]
        if q.behind_current_time is not None:
            ends.append(at(now) - q.behind_current_time)
        end = min((ts for ts in ends if ts is not None), default=None)
        stamps = self.timestamps
        start = bisect.bisect_left(stamps, q.from_timestamp)
        stop = len(stamps) if end is None else bisect.bisect_left(stamps, end)
        if q.to_inclusive is not None:
            stop = min(stop, bisect.bisect_right(stamps, q.to_inclusive))
        out: list[Ev] = []
        for i in range(start, stop):
            if q.limit is not None and len(out) >= q.limit:
                break
            e = self.events[i]
            if e.commit > now:
                continue
            if stamps[i] == q.from_timestamp and q.exclude.get(e.pid, 0) >= e.seq_nr:
                continue
            out.append(e)
        return out

    def buckets(self, q: BucketsQuery, now: float, behind: timedelta) -> list[tuple[int, int]]:
        counts: dict[int, int] = {}
        limit_ts = bucket_start(at(now) - behind)
        for e in self.visible(now):
            ts = at(e.ts)
            if ts < q.from_timestamp:
                continue
            if q.until_exclusive is not None and ts >= q.until_exclusive:
                continue
            if q.to_inclusive is not None and ts > q.to_inclusive:
                continue
            if q.to_inclusive is None and ts >= EPOCH + timedelta(seconds=limit_ts):
                continue
            counts[bucket_start(ts)] = counts.get(bucket_start(ts), 0) + 1
        return sorted(counts.items())[: q.limit]


@attrs.define
class Emitted:
    ev: tuple[str, int]
    source: str
    offset: TimestampOffset


def drive(
    machine: BySliceQuery,
    model: Model,
    *,
    start: float,
    until: float,
    step: float = 0.0,
    stop_after: int | None = None,
    requests: list[Request] | None = None,
) -> list[Emitted]:
    """Run the machine in simulated time; each query takes `step` seconds. Every
    request is also appended to `requests`, if given."""
    now = start
    out: list[Emitted] = []
    while now < until:
        req = machine.next_request(now)
        if requests is not None:
            requests.append(req)
        if isinstance(req, Done):
            break
        if isinstance(req, Wait):
            assert req.until > now
            now = req.until
        elif isinstance(req, HeartbeatDue):
            machine.on_heartbeat(at(now), now)
        elif isinstance(req, HorizonQuery):
            machine.on_horizon(model.horizon(now))
        elif isinstance(req, BucketsQuery):
            machine.on_buckets(model.buckets(req, now, machine.settings.behind_current_time))
        else:
            source = "backtracking" if req.backtracking else "query"
            for e in model.rows(req, now):
                off = machine.on_row(row(e), at(now), now)
                if off is not None:
                    out.append(Emitted((e.pid, e.seq_nr), source, off))
                    if stop_after is not None and len(out) >= stop_after:
                        return out
            machine.on_rows_done(now)
            now += step
    return out


def fast(**kw: Any) -> QuerySettings:
    base: dict[str, Any] = {
        "buffer_size": 10,
        "refresh_interval": 1.0,
        "behind_current_time": 0.1,
        "backtracking": BacktrackingSettings(window=60, behind_current_time=5),
    }
    base.update(kw)
    return QuerySettings(**base)


def pekko(**kw: Any) -> QuerySettings:
    """`fast` without the horizon: behind the clock, as Pekko's query (and the fallback)."""
    return fast(horizon=HorizonSettings(enabled=False), **kw)


# -- generated histories -----------------------------------------------------


# Strategies are built once, outside the composites: hypothesis caches `st.integers`,
# but builds a `sampled_from` anew on every call, and inside a composite that runs
# for every step of every generated history that costs more than the draws.
GAPS = st.sampled_from([0.0, 0.0, 0.001, 0.05, 0.5, 2.0, 15.0])


@functools.cache
def lateness(max_late: float) -> st.SearchStrategy[float]:
    return st.sampled_from([0.0, 0.0, 0.0, 0.01, 1.0, max_late])


@st.composite
def histories(draw: st.DrawFn, max_late: float = 4.0) -> list[Ev]:
    """Several pids, atomic batches sharing a timestamp, some committing late."""
    n_pids = draw(st.integers(1, 8))
    events: list[Ev] = []
    seq = dict.fromkeys(range(n_pids), 0)
    last_ts = dict.fromkeys(range(n_pids), 0.0)
    t = 0.0
    for _ in range(draw(st.integers(1, 60))):
        t += draw(GAPS)
        p = draw(st.integers(0, n_pids - 1))
        ts = max(t, last_ts[p] + 0.000001)
        last_ts[p] = ts
        late = draw(lateness(max_late))
        for _ in range(draw(st.integers(1, 4))):
            seq[p] += 1
            events.append(Ev(f"p{p}", seq[p], ts, ts + late))
    return events


def test_a_late_commit_behind_a_bounded_chunk_is_backtracked() -> None:
    """Found by the property below: a catch-up chunk bounded by a bucket end moves
    the scan past the last emitted event; an event in between that commits late
    (within backtracking.behind_current_time) must still come by backtracking."""
    timestamps = [1e-06, 2e-06, 2.0, 17.0, 17.000001, 17.000002000000002, 17.000003000000003]
    timestamps += [17.000004000000004] + [17.000005000000005] * 4 + [19.0, 34.0, 49.0, 49.000001]
    timestamps += [49.000001999999995, 49.00000299999999, 49.00000399999999, 49.00000499999999]
    timestamps += [49.000005999999985] + [49.00000699999998] * 3 + [49.00000799999998]
    timestamps += [49.00000899999998, 49.000009999999975, 49.00001099999997, 49.00001199999997]
    timestamps += [49.00001299999997] * 2
    events = [Ev("p0", i + 1, ts, ts) for i, ts in enumerate(timestamps)]
    late_ts = 49.000013999999965
    events.append(Ev("p0", len(events) + 1, late_ts, late_ts + 4.0))
    machine = BySliceQuery(fast(), None, now=0.0)
    out = drive(machine, Model(events), start=0.0, until=late_ts + 200, step=0.01)
    assert {o.ev for o in out} == {(e.pid, e.seq_nr) for e in events}


@settings(max_examples=150, deadline=None)
@given(histories(), st.sampled_from([0.0, 0.01, 0.3]))
def test_live_query_delivers_every_event_despite_late_commits(
    events: list[Ev], step: float
) -> None:
    machine = BySliceQuery(fast(), None, now=0.0)
    end = max(e.commit for e in events) + 200
    out = drive(machine, Model(events), start=0.0, until=end, step=step)
    delivered = {o.ev for o in out}
    assert delivered == {(e.pid, e.seq_nr) for e in events}
    # Normal (non-backtracking) envelopes: never repeated, per pid in seq order,
    # offsets never go backwards.
    normal = [o for o in out if o.source == "query"]
    assert len({o.ev for o in normal}) == len(normal)
    last_seq: dict[str, int] = {}
    last_ts = EPOCH
    for o in normal:
        pid, seq_nr = o.ev
        assert seq_nr > last_seq.get(pid, 0)
        last_seq[pid] = seq_nr
        assert o.offset.timestamp >= last_ts
        last_ts = o.offset.timestamp


@settings(max_examples=150, deadline=None)
@given(histories(), st.sampled_from([0.0, 0.01, 0.3]))
def test_without_the_horizon_backtracking_delivers_commits_late_within_its_delay(
    events: list[Ev], step: float
) -> None:
    """Pekko's guarantee, which backtracking keeps as the safety net: a row that becomes
    visible within `backtracking.behind_current_time` of its timestamp is never missed,
    also when the normal query read its stretch of the journal long after it was written."""
    machine = BySliceQuery(pekko(), None, now=0.0)
    end = max(e.commit for e in events) + 200
    out = drive(machine, Model(events), start=0.0, until=end, step=step)
    assert {o.ev for o in out} == {(e.pid, e.seq_nr) for e in events}


@settings(max_examples=200, deadline=None)
@given(histories(max_late=0.0), st.integers(1, 80))
def test_resume_from_any_offset_continues_right_after_it(events: list[Ev], cut: int) -> None:
    model = Model(events)
    end = max(e.commit for e in events) + 5
    first = drive(
        BySliceQuery(fast(backtracking=BacktrackingSettings(enabled=False)), now=0.0),
        model,
        start=end,
        until=end + 100,
        stop_after=cut,
    )
    resumed = drive(
        BySliceQuery(
            fast(backtracking=BacktrackingSettings(enabled=False)), first[-1].offset, now=0.0
        ),
        model,
        start=end,
        until=end + 100,
    )
    together = [o.ev for o in first] + [o.ev for o in resumed]
    assert sorted(together) == sorted((e.pid, e.seq_nr) for e in events)
    assert len(together) == len(set(together))


@settings(max_examples=100, deadline=None)
@given(histories(max_late=0.0))
def test_current_query_ends_and_has_no_duplicates(events: list[Ev]) -> None:
    model = Model(events)
    end_s = max(e.ts for e in events)
    machine = BySliceQuery(fast(), live=False, end=at(end_s), now=0.0)
    out = drive(machine, model, start=end_s + 1, until=end_s + 10_000)
    assert machine.done
    assert [o.ev for o in out] == [(e.pid, e.seq_nr) for e in model.events]


def test_thousands_of_events_sharing_one_timestamp_do_not_stall() -> None:
    events = [Ev(f"p{i}", s, 1.0, 1.0) for i in range(300) for s in (1, 2, 3)]
    machine = BySliceQuery(fast(buffer_size=7), now=0.0)
    out = drive(machine, Model(events), start=2.0, until=400.0)
    assert {o.ev for o in out} == {(e.pid, e.seq_nr) for e in events}
    assert len([o for o in out if o.source == "query"]) == len(events)


def test_catch_up_scans_are_bounded_by_bucket_counts() -> None:
    # 30 buckets of 10 s with 25 events each; buffer 10: every scan is bounded to
    # the buckets that reach CHUNK_BUFFERS buffers instead of "everything after the offset".
    events = [
        Ev(f"p{i}", b * 25 + i + 1, b * BUCKET_SECONDS + i * 0.1, 0.0)
        for b in range(30)
        for i in range(25)
    ]
    events = [Ev("p", i + 1, e.ts, 0.0) for i, e in enumerate(events)]
    model = Model(events)
    machine = BySliceQuery(fast(backtracking=BacktrackingSettings(enabled=False)), now=0.0)
    now = 400.0
    scanned: list[int] = []
    while True:
        req = machine.next_request(now)
        if isinstance(req, HorizonQuery):
            machine.on_horizon(model.horizon(now))
            continue
        if isinstance(req, BucketsQuery):
            machine.on_buckets(model.buckets(req, now, machine.settings.behind_current_time))
            continue
        if isinstance(req, RowsQuery) and not req.backtracking:
            rows = model.rows(attrs.evolve(req, limit=None), now)
            if req.limit is None:
                assert req.until_exclusive is not None
            scanned.append(len(rows))
            for e in rows[: req.limit] if req.limit else rows:
                machine.on_row(row(e), at(now), now)
            machine.on_rows_done(now)
            if len(scanned) > 40 or machine.latest.timestamp == at(events[-1].ts):
                break
        else:
            break
    assert machine.latest.timestamp == at(events[-1].ts)
    # Unbounded, the first scans would see all 750 rows; bounded, the buckets that
    # reach the chunk size (at most one bucket more).
    chunk = CHUNK_BUFFERS * machine.settings.buffer_size
    assert chunk < 750 - 25
    assert max(scanned) <= chunk + 25
    assert machine.bucket_queries >= 1


def _backtracking_runs(events: list[Ev], now: float) -> list[RowsQuery]:
    """Drive a live machine over `events` from `now`; the backtracking queries it asks for."""
    requests: list[Request] = []
    drive(
        BySliceQuery(fast(), now=0.0), Model(events), start=now, until=now + 60, requests=requests
    )
    seen_bt = [q for q in requests if isinstance(q, RowsQuery) and q.backtracking]
    assert seen_bt, "backtracking never ran"
    assert all(q.with_payload is False for q in seen_bt)
    assert all(q.behind_current_time == timedelta(seconds=5) for q in seen_bt)
    return seen_bt


def test_bucket_counts_read_a_window_and_cross_gaps_longer_than_it() -> None:
    """Counts stop at a window of bucket_limit buckets (so a catch-up from far back does
    not count to the end of the journal on every chunk), and a gap longer than the
    window is crossed by one count to the end."""
    settings_ = fast(bucket_limit=4)  # a window of 40 s
    sparse = [Ev("a", i + 1, 1.0 + 7.0 * i, 1.0 + 7.0 * i) for i in range(30)]
    after_gap = [Ev("a", 31 + i, 5000.0 + i, 5000.0 + i) for i in range(30)]
    events = sparse + after_gap
    for live in (False, True):
        machine = BySliceQuery(settings_, live=live, end=None if live else at(6000.0), now=0.0)
        requests: list[Request] = []
        emitted = drive(machine, Model(events), start=6000.0, until=6060.0, requests=requests)
        out = [o.ev for o in emitted if o.source == "query"]
        counts = [q for q in requests if isinstance(q, BucketsQuery)]
        assert out == [(e.pid, e.seq_nr) for e in events]
        windowed = [q for q in counts if q.until_exclusive is not None]
        assert windowed, "every count read to the end"
        assert all(q.until_exclusive - q.from_timestamp <= timedelta(seconds=50) for q in windowed)
        assert any(q.until_exclusive is None for q in counts), "the gap was never crossed"


def test_backtracking_does_not_reread_what_a_normal_query_read_late_enough() -> None:
    # Read 46 s after they were written (backtracking stays 5 s behind): the normal
    # query saw them as completely as backtracking would, so no run re-reads them.
    events = [Ev("a", i + 1, 100.0 + i, 100.0 + i) for i in range(5)]
    seen_bt = _backtracking_runs(events, now=150.0)
    assert seen_bt[0].from_timestamp == at(104.0)
    assert all(q.to_inclusive == at(104.0) for q in seen_bt)


def test_backtracking_rereads_rows_younger_than_its_delay_and_never_passes_the_scan() -> None:
    # Read at 106 s: rows after 101 s were younger than backtracking's 5 s when read,
    # so the first run goes back to there, and never past where the normal scan got.
    events = [Ev("a", i + 1, 100.0 + i, 100.0 + i) for i in range(5)]
    seen_bt = _backtracking_runs(events, now=106.0)
    assert seen_bt[0].from_timestamp == at(101.0)
    assert all(q.to_inclusive == at(104.0) for q in seen_bt)


def past_empty_counts(machine: BySliceQuery, request: Request, now: float) -> Request:
    """Answer bucket counts of an empty journal (a windowed count, then one to the end)."""
    while isinstance(request, BucketsQuery):
        machine.on_buckets([])
        request = machine.next_request(now)
    return request


def test_poll_delay_adapts_to_how_full_the_last_result_was() -> None:
    machine = BySliceQuery(pekko(buffer_size=10), now=0.0)
    q = past_empty_counts(machine, machine.next_request(0.0), 0.0)
    assert isinstance(q, RowsQuery) and q.limit == 10
    for i in range(10):
        machine.on_row(row(Ev("a", i + 1, float(i), 0)), at(0), 0.0)
    machine.on_rows_done(0.0)
    # full buffer: query again at once (after a bucket recount)
    assert not isinstance(machine.next_request(0.0), Wait)


def test_notification_shortens_the_wait_to_behind_current_time() -> None:
    machine = BySliceQuery(pekko(), now=0.0)
    past_empty_counts(machine, machine.next_request(0.0), 0.0)
    machine.on_rows_done(0.0)
    wait = machine.next_request(0.0)
    assert isinstance(wait, Wait) and wait.until == pytest.approx(1.0)
    machine.on_notification(0.2)
    wait = machine.next_request(0.2)
    assert isinstance(wait, Wait)
    assert 0.2 + 0.1 <= wait.until < 0.35


def test_heartbeat_when_idle() -> None:
    machine = BySliceQuery(pekko(heartbeat_interval=2.0), heartbeats=True, now=0.0)
    out = drive(machine, Model([]), start=0.0, until=1.9)
    assert out == []
    assert isinstance(machine.next_request(2.5), HeartbeatDue)
    hb = machine.on_heartbeat(at(2.5), 2.5)
    # The last query that reached the tail was asked for at 1.0: that far, minus the lag.
    assert hb.timestamp == at(1.0) - timedelta(seconds=0.1)
    assert not isinstance(machine.next_request(2.6), HeartbeatDue)


def test_a_heartbeat_never_passes_a_row_not_yet_read() -> None:
    """A heartbeat falling due before the next poll must not claim rows written since the
    last one (a progress marker at its offset would skip them after a restart)."""
    machine = BySliceQuery(pekko(heartbeat_interval=2.0), heartbeats=True, now=0.0)
    model = Model([Ev("a", 1, 1.2, 1.2)])  # written after the poll at 1.0
    assert drive(machine, model, start=0.0, until=1.99) == []
    assert isinstance(machine.next_request(2.0), HeartbeatDue)
    hb = machine.on_heartbeat(at(2.0), 2.0)
    assert hb.timestamp < at(1.2)
    out = drive(machine, model, start=2.0, until=5.0)
    assert [o.ev for o in out] == [("a", 1)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"buffer_size": 0},
        {"refresh_interval": -1},
        {"behind_current_time": -0.1},
        {"backtracking": {"window": 5, "behind_current_time": 10}},
        {"backtracking": {"window": 0}},
        {"behind_current_time": 200.0},
    ],
)
def test_invalid_settings_are_rejected_when_built(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettings):
        if "backtracking" in kwargs:
            QuerySettings(backtracking=BacktrackingSettings(**kwargs["backtracking"]))
        else:
            QuerySettings(**kwargs)


def test_protocol_misuse_raises_a_typed_error_and_now_is_required() -> None:
    from journal.errors import JournalError, ProtocolError

    machine = BySliceQuery(fast(), now=0.0)
    with pytest.raises(ProtocolError, match="outside a RowsQuery"):
        machine.on_row(row(Ev("a", 1, 1.0, 1.0)), at(1), 1.0)
    with pytest.raises(ProtocolError):
        machine.on_rows_done(0.0)
    assert issubclass(ProtocolError, JournalError)
    with pytest.raises(TypeError):
        BySliceQuery(fast())  # type: ignore[call-arg]


def test_decisions_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.DEBUG, logger="slicejournal.journal.query")
    events = [Ev("a", 1, 1.0, 1.0), Ev("a", 2, 2.0, 3.0)]
    drive(BySliceQuery(fast(), now=0.0), Model(events), start=0.0, until=30.0, step=0.01)
    text = caplog.text
    for decision in ("catch-up bound", "waiting", "switching to backtracking", "backtracking ends"):
        assert decision in text, decision


# -- the visibility horizon ----------------------------------------------------


LONG_GAPS = st.sampled_from([0.0, 0.001, 0.05, 0.5, 2.0, 15.0])
LENGTHS = st.sampled_from([0.0, 0.002, 1.0, 7.0, 20.0, 90.0, 200.0])
IDLE = st.sampled_from([None, None, 0.5, 0.95])


@st.composite
def long_transactions(draw: st.DrawFn) -> list[Ev]:
    """Histories whose transactions stay open for any length (far past backtracking's
    10 s and its window), some idle before their first write, next to short ones."""
    n_pids = draw(st.integers(1, 6))
    events: list[Ev] = []
    seq = dict.fromkeys(range(n_pids), 0)
    busy_until = dict.fromkeys(range(n_pids), 0.0)  # one open transaction per pid at a time
    t = 0.0
    for _ in range(draw(st.integers(1, 40))):
        t += draw(LONG_GAPS)
        p = draw(st.integers(0, n_pids - 1))
        ts = max(t, busy_until[p] + 0.000001)
        length = draw(LENGTHS)
        idle = draw(IDLE)  # first write, as a fraction
        writes_from = None if idle is None else ts + idle * length
        busy_until[p] = ts + length
        for _ in range(draw(st.integers(1, 3))):
            seq[p] += 1
            events.append(Ev(f"p{p}", seq[p], ts, ts + length, writes_from))
    return events


def exact(**kw: Any) -> QuerySettings:
    return fast(horizon=HorizonSettings(margin=0.005, max_hold=3.0), **kw)


def assert_normal_envelopes_in_order(out: list[Emitted]) -> None:
    normal = [o for o in out if o.source == "query"]
    assert len({o.ev for o in normal}) == len(normal)
    last_ts = EPOCH
    for o in normal:
        assert o.offset.timestamp >= last_ts
        last_ts = o.offset.timestamp


@settings(max_examples=300, deadline=None)
@given(long_transactions(), st.sampled_from([0.0, 0.01, 0.3]))
def test_transactions_of_any_length_never_lose_an_event(events: list[Ev], step: float) -> None:
    machine = BySliceQuery(exact(), None, now=0.0)
    end = max(e.commit for e in events) + 100
    out = drive(machine, Model(events), start=0.0, until=end, step=step)
    assert {o.ev for o in out} == {(e.pid, e.seq_nr) for e in events}
    assert_normal_envelopes_in_order(out)


@settings(max_examples=200, deadline=None)
@given(long_transactions(), st.integers(1, 60), st.floats(0.0, 300.0))
def test_a_stream_resumed_while_transactions_are_open_misses_nothing(
    events: list[Ev], cut: int, stop: float
) -> None:
    """The first stream stops at any time; a new one resumes from its last offset
    while older transactions are still open: the two deliver every event.

    Except one case, which is reported, never silent: the first stream stopped
    after a transaction it had not waited for ended and before it re-read for it.
    """
    model = Model(events)
    machine = BySliceQuery(exact(), now=0.0)
    first = drive(machine, model, start=0.0, until=stop, stop_after=cut)
    offset = first[-1].offset if first else None
    end = max(stop, *(e.commit for e in events)) + 100
    resumed = drive(BySliceQuery(exact(), offset, now=stop), model, start=stop, until=end)
    missed = {(e.pid, e.seq_nr) for e in events} - {o.ev for o in first + resumed}
    if missed:
        unfinished = machine.unfinished_reread
        assert unfinished is not None
        assert all(at(e.ts) >= unfinished for e in events if (e.pid, e.seq_nr) in missed)


def test_without_the_horizon_a_long_transaction_is_missed() -> None:
    """The failure the horizon removes: a 90 s transaction commits after backtracking
    has passed its timestamp, so the query behind the clock never delivers it."""
    events = [Ev("long", 1, 1.0, 91.0)] + [Ev(f"s{i}", 1, 2.0 + i, 2.0 + i) for i in range(80)]
    delivered = {
        settings_.horizon.enabled: {
            o.ev
            for o in drive(BySliceQuery(settings_, now=0.0), Model(events), start=0.0, until=300.0)
        }
        for settings_ in (pekko(), exact())
    }
    assert ("long", 1) not in delivered[False]
    assert delivered[True] == {(e.pid, e.seq_nr) for e in events}


def first_normal_query(machine: BySliceQuery, reading: Horizon, now: float) -> RowsQuery:
    assert isinstance(machine.next_request(now), HorizonQuery)
    machine.on_horizon(reading)
    req = past_empty_counts(machine, machine.next_request(now), now)
    assert isinstance(req, RowsQuery) and not req.backtracking
    return req


def test_the_query_reads_up_to_the_oldest_open_writer_and_not_behind_the_clock() -> None:
    machine = BySliceQuery(exact(), now=0.0)
    writer = OpenTransaction(7, at(40.0), writes_journal=True)
    req = first_normal_query(machine, Horizon(at(50.0), (writer,)), 50.0)
    assert req.horizon == at(40.0) - timedelta(milliseconds=5)
    assert req.behind_current_time is None
    machine.on_rows_done(50.0)
    # Held back by an open transaction: poll again soon, not after the refresh interval.
    wait = machine.next_request(50.0)
    assert isinstance(wait, Wait) and wait.until == pytest.approx(50.0 + 0.01)
    # Nothing open: up to the clock minus the margin.
    req = first_normal_query(machine, Horizon(at(51.0)), 51.0)
    assert req.horizon == at(51.0) - timedelta(milliseconds=5)


def test_an_idle_transaction_holds_the_tail_at_most_max_hold() -> None:
    idle = OpenTransaction(3, at(10.0), writes_journal=False)
    machine = BySliceQuery(exact(), now=0.0)
    assert first_normal_query(machine, Horizon(at(12.0), (idle,)), 12.0).horizon == at(
        10.0
    ) - timedelta(milliseconds=5)
    machine.on_rows_done(12.0)
    machine.next_request(12.0)  # the wait
    late = first_normal_query(machine, Horizon(at(13.5), (idle,)), 13.5)
    assert late.horizon == at(13.5) - timedelta(milliseconds=5)  # 3.5 s open > max_hold 3 s


def test_a_blind_reading_falls_back_to_staying_behind_the_clock() -> None:
    machine = BySliceQuery(exact(), now=0.0)
    reading = Horizon(at(5.0), (), Blind("hidden roles", "no privilege"))
    req = first_normal_query(machine, reading, 5.0)
    assert req.horizon is None
    assert req.behind_current_time == timedelta(seconds=0.1)


def test_with_the_horizon_a_notification_is_read_after_the_margin() -> None:
    machine = BySliceQuery(exact(), now=0.0)
    first_normal_query(machine, Horizon(at(0.0)), 0.0)
    machine.on_rows_done(0.0)
    assert isinstance(machine.next_request(0.0), Wait)
    machine.on_notification(0.2)
    wait = machine.next_request(0.2)
    assert isinstance(wait, Wait)
    assert wait.until == pytest.approx(0.2 + 0.005 + 0.005)


def test_an_exact_heartbeat_stops_at_a_transaction_not_waited_for() -> None:
    machine = BySliceQuery(exact(heartbeat_interval=2.0), heartbeats=True, now=10.0)
    idle = OpenTransaction(3, at(1.0), writes_journal=False)
    req = first_normal_query(machine, Horizon(at(10.0), (idle,)), 10.0)
    assert req.horizon == at(10.0) - timedelta(milliseconds=5)  # not waited for: too old
    machine.on_rows_done(10.0)
    assert isinstance(machine.next_request(12.5), HeartbeatDue)
    # Not past its start: a restart from this marker must still re-read for it.
    assert machine.on_heartbeat(at(12.5), 12.5).timestamp == at(1.0)


def test_an_exact_heartbeat_reaches_the_horizon_of_the_last_tail_query() -> None:
    machine = BySliceQuery(exact(heartbeat_interval=2.0), heartbeats=True, now=10.0)
    first_normal_query(machine, Horizon(at(10.0)), 10.0)
    machine.on_rows_done(10.0)
    assert isinstance(machine.next_request(12.5), HeartbeatDue)
    assert machine.on_heartbeat(at(12.5), 12.5).timestamp == at(10.0) - timedelta(milliseconds=5)


def _read_with_look_ahead(
    machine: BySliceQuery, model: Model, now: float
) -> tuple[list[tuple[str, int]], int]:
    """Drive `machine` to its end as the driver does when it reads ahead: halfway
    through each bounded chunk, ask for the one after it, and check that the next
    request is that one. The events emitted, and how many chunks were known ahead."""
    out: list[tuple[str, int]] = []
    known_ahead = 0
    ahead: RowsQuery | None = None
    for _ in range(10_000):
        req = machine.next_request(now)
        if ahead is not None:
            assert req == ahead, "a chunk read ahead must be the one asked for next"
            known_ahead += 1
        ahead = None
        if isinstance(req, Done):
            return out, known_ahead
        if isinstance(req, Wait):
            now = req.until
        elif isinstance(req, HorizonQuery):
            machine.on_horizon(model.horizon(now))
        elif isinstance(req, BucketsQuery):
            machine.on_buckets(model.buckets(req, now, machine.settings.behind_current_time))
        elif isinstance(req, RowsQuery):
            rows = model.rows(req, now)
            half = len(rows) // 2
            for i, e in enumerate(rows):
                if i == half:
                    ahead = machine.next_chunk_if_whole(now)
                if machine.on_row(row(e), at(now), now) is not None:
                    out.append((e.pid, e.seq_nr))
            if not rows:
                ahead = machine.next_chunk_if_whole(now)
            if not machine.live and req.limit is None:
                # a chunk read ahead is never a LIMIT query: a bounded chunk, or the
                # current query's last statement, the rest up to its end
                assert ahead is None or ahead.limit is None
            machine.on_rows_done(now)
    raise AssertionError("the query did not end")


def test_the_chunk_read_ahead_is_the_one_asked_for_next() -> None:
    # 30 buckets of 25 events, buffer 10: a catch-up of many bounded chunks.
    events = [
        Ev("p", b * 25 + i + 1, b * BUCKET_SECONDS + i * 0.1, 0.0)
        for b in range(30)
        for i in range(25)
    ]
    end = events[-1].ts
    machine = BySliceQuery(fast(), live=False, end=at(end), now=0.0)
    out, known_ahead = _read_with_look_ahead(machine, Model(events), end + 1)
    assert out == [(e.pid, e.seq_nr) for e in events]
    assert known_ahead >= 5  # most chunks follow one another without a count between


def test_a_current_query_reads_a_burst_at_its_end_in_one_statement_read_ahead() -> None:
    # 29 buckets of 25 events, then a burst of 200 in the bucket holding the end, which
    # completes a chunk (buffer 10: 80 rows): its bound lies past the end and is dropped.
    events = [
        Ev("p", b * 25 + i + 1, b * BUCKET_SECONDS + i * 0.1, 0.0)
        for b in range(29)
        for i in range(25)
    ]
    events += [Ev("q", i + 1, 29 * BUCKET_SECONDS + i * 0.01, 0.0) for i in range(200)]
    end = events[-1].ts
    machine = BySliceQuery(fast(), live=False, end=at(end), now=0.0)
    out, _ = _read_with_look_ahead(machine, Model(events), end + 1)
    assert out == [(e.pid, e.seq_nr) for e in events]
    # the burst is one statement (before: one LIMIT query per 10 rows, each after a count)
    assert machine.queries <= 29 * 25 // 80 + 2
    assert machine.bucket_queries <= 2


@given(histories())
@settings(max_examples=200, deadline=None)
def test_a_chunk_read_ahead_is_always_the_next_request(events: list[Ev]) -> None:
    end = max(e.ts for e in events)
    machine = BySliceQuery(fast(buffer_size=2), live=False, end=at(end), now=0.0)
    out, _ = _read_with_look_ahead(machine, Model(events), end + 10)
    assert out == [(e.pid, e.seq_nr) for e in Model(events).events]


def test_a_live_stream_never_reads_ahead() -> None:
    events = [Ev("p", i + 1, i * 1.0, 0.0) for i in range(300)]
    machine = BySliceQuery(fast(), now=0.0)
    model = Model(events)
    now = 400.0
    for _ in range(50):
        req = machine.next_request(now)
        if isinstance(req, HorizonQuery):
            machine.on_horizon(model.horizon(now))
        elif isinstance(req, BucketsQuery):
            machine.on_buckets(model.buckets(req, now, machine.settings.behind_current_time))
        elif isinstance(req, RowsQuery):
            for e in model.rows(req, now):
                machine.on_row(row(e), at(now), now)
            assert machine.next_chunk_if_whole(now) is None
            machine.on_rows_done(now)
        else:
            now += 1.0

"""The projection core over durable state (issue #31), no database: revisions are
validated by Akka's rule (at or below the handled one: duplicate; higher: accepted, gaps
normal, nothing looked for or rejected) and a backtracking change is loaded by id, the
newest revision delivered."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from journal.durable_state import DurableStateChange
from journal.model import NOT_LOADED, TimestampOffset
from journal.query.source import EVENTS, STATE_CHANGES
from projections.core import Commit, LoadPayload, Mode, ProjectionCore, StoredOffset
from projections.offset_store import OffsetState, Record, Verdict
from projections.settings import ProjectionSettings

BASE = datetime(2025, 1, 1, tzinfo=UTC)
WINDOW = timedelta(minutes=5)


def at(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)


def change(
    pid: str, revision: int, seconds: float, *, source: str = "query", value: object = "v"
) -> DurableStateChange:
    ts = at(seconds)
    return DurableStateChange(
        pid, "T", 7, revision, ts, value if source == "query" else NOT_LOADED,
        offset=TimestampOffset(ts, ts, {pid: revision}), source=source,
    )  # fmt: skip


def test_the_sources_say_which_rule_applies() -> None:
    assert EVENTS.consecutive and not STATE_CHANGES.consecutive


def test_revisions_accept_any_higher_one_and_drop_the_rest() -> None:
    state = OffsetState(WINDOW, [Record(7, "a", 3, at(10))], consecutive=False)
    assert state.validate("a", 3, 7, at(11)).verdict is Verdict.DUPLICATE
    assert state.validate("a", 2, 7, at(11)).verdict is Verdict.DUPLICATE
    assert state.validate("a", 7, 7, at(12)).accepted  # a gap is normal
    assert state.validate("new", 5, 7, at(12)).accepted  # unknown id: no previous looked for
    events = OffsetState(WINDOW, [Record(7, "a", 3, at(10))])
    assert events.validate("a", 7, 7, at(12)).verdict is Verdict.GAP


def test_a_trimmed_store_still_looks_up_an_unknown_ids_stored_revision() -> None:
    settings = ProjectionSettings(delete_after_consumed=timedelta(days=1))
    core = ProjectionCore(Mode.EXACTLY_ONCE, settings, [7], source=STATE_CHANGES)
    core.start([Record(7, "x", 1, at(1000))])
    core.state.trimmed = True
    action = core.offer(change("a", 4, 999), 0.0)
    assert action == StoredOffset("a", 7)
    assert core.answer(Record(7, "a", 4, at(998)), 0.0) is None  # stored: a duplicate
    assert core.stats.duplicates == 1


def test_exactly_once_over_changes_never_asks_for_previous_revisions() -> None:
    core = ProjectionCore(Mode.EXACTLY_ONCE, ProjectionSettings(), [7], source=STATE_CHANGES)
    core.start([])
    first = core.offer(change("a", 3, 1), 0.0)
    assert isinstance(first, Commit) and [e.seq_nr for e in first.envelopes] == [3]
    assert core.committed(0.0) is None
    assert core.offer(change("a", 3, 1), 0.0) is None  # the same revision again
    nxt = core.offer(change("a", 9, 2), 0.0)
    assert isinstance(nxt, Commit) and nxt.events[0].seq_nr == 9
    core.committed(0.0)
    assert (core.stats.accepted, core.stats.duplicates, core.stats.rejected) == (2, 1, 0)


def test_a_backtracking_change_is_loaded_and_the_newest_revision_delivered() -> None:
    core = ProjectionCore(Mode.EXACTLY_ONCE, ProjectionSettings(), [7], source=STATE_CHANGES)
    core.start([Record(7, "a", 1, at(0))])
    back = change("a", 2, 5, source="backtracking")
    assert core.offer(back, 0.0) == LoadPayload("a", 2)
    newest = DurableStateChange("a", "T", 7, 4, at(9), "v4", source="load")
    commit = core.answer(newest, 0.0)
    assert isinstance(commit, Commit)
    (delivered,) = commit.envelopes
    assert isinstance(delivered, DurableStateChange)
    # Akka's loadEnvelope: revision and value loaded, offset and timestamp of the change.
    assert (delivered.revision, delivered.value, delivered.source) == (4, "v4", "backtracking")
    assert delivered.db_timestamp == at(5) and delivered.offset == back.offset
    assert commit.events == (Record(7, "a", 4, at(5)),)
    core.committed(0.0)
    # The query's later delivery of revision 4 is a duplicate; 5 is applied.
    assert core.offer(change("a", 4, 9), 0.0) is None
    assert isinstance(core.offer(change("a", 5, 10), 0.0), Commit)


def test_a_backtracking_change_of_an_id_without_a_row_is_dropped() -> None:
    core = ProjectionCore(Mode.GROUPED, ProjectionSettings(), [7], source=STATE_CHANGES)
    core.start([])
    assert core.offer(change("a", 2, 5, source="backtracking"), 0.0) == LoadPayload("a", 2)
    assert core.answer(None, 0.0) is None
    assert core.stats.duplicates == 1 and core.pending == ()

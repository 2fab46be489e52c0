"""A filtered projection's status and backlog agree with its filter (issue 30).

A running instance records its `EventFilter` (management's row of key '*'), so
`ProjectionManagement.event_filter`, `status` and `backlog` — and `slicejournal
status`, with a name or without, as text or `--json` — show it, and the backlog
counts only the events it lets through. Run without a filter again, the record
is cleared and every event counts.
"""

from __future__ import annotations

import json

import pytest

from journal import EventFilter, JournalSettings, SliceRange, SyncJournal
from projections import SyncProjection, SyncProjectionManagement
from slicejournal.cli import main

NAME = "vip-orders"


def _run(journal: SyncJournal, event_filter: EventFilter | None) -> int:
    seen: list[str] = []
    projection = SyncProjection.exactly_once(
        journal, name=NAME, entity_type="order", slice_range=SliceRange.FULL,
        handler=lambda conn, env: seen.append(env.persistence_id), filter=event_filter,
    )  # fmt: skip
    projection.run(until_caught_up=True)
    return len(seen)


@pytest.mark.timeout(90)
def test_status_and_backlog_follow_the_recorded_filter(
    pg_dsn: str, settings: JournalSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    vip = EventFilter(tags=("vip",), where="seq_nr > 0")
    with SyncJournal.connect(pg_dsn, settings, create_schema=True) as journal:
        journal.append("order|a", [{"n": 1}], expected_seq_nr=0, tags=("vip",))
        journal.append("order|b", [{"n": 1}], expected_seq_nr=0)
        assert _run(journal, vip) == 1
        management = SyncProjectionManagement(journal)
        assert management.event_filter(NAME) == vip
        assert management.backlog(NAME, "order", SliceRange.FULL).size == 0
        # Five more: two the filter lets through.
        journal.append("order|a", [{"n": 2}, {"n": 3}], expected_seq_nr=1, tags=("vip",))
        journal.append("order|b", [{"n": 2}, {"n": 3}, {"n": 4}], expected_seq_nr=1)
        assert management.backlog(NAME, "order", SliceRange.FULL).size == 2
        (status,) = management.status(NAME, "order")
        assert status.backlog is not None and status.backlog.size == 2

        common = ["--dsn", pg_dsn, "--schema", settings.schema]
        assert main(["status", NAME, *common]) == 0
        out = capsys.readouterr().out
        assert "filter:        tags=vip where=seq_nr > 0" in out
        assert "backlog:       2 event(s)" in out
        assert main(["status", NAME, "--json", *common]) == 0
        doc = json.loads(capsys.readouterr().out)
        expected = {"manifests": [], "tags": ["vip"], "where": "seq_nr > 0"}
        assert doc["filter"] == expected and doc["backlog_events"] == 2
        assert main(["status", *common]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split()[-1] == "filter" and table[1].endswith("tags=vip where=seq_nr > 0")
        assert main(["status", "--json", *common]) == 0
        (listed,) = json.loads(capsys.readouterr().out)
        assert listed["filter"] == expected and listed["paused"] == []

        # Pausing keeps the record (and resuming it); running unfiltered clears it.
        management.pause(NAME)
        management.resume(NAME)
        assert management.event_filter(NAME) == vip
        assert _run(journal, None) == 5  # every event not handled yet
        assert management.event_filter(NAME) is None
        journal.append("order|b", [{"n": 5}], expected_seq_nr=4)
        assert management.backlog(NAME, "order", SliceRange.FULL).size == 1
        assert main(["status", "--json", *common]) == 0
        assert json.loads(capsys.readouterr().out)[0]["filter"] is None

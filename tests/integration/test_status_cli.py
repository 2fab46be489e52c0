"""`slicejournal status` knows in-process projections: with a NAME, a projection that
no fleet worker registered (it runs in the application's own process) is shown (its
offsets, backlog, pauses and dead letters), not refused as unknown; without a NAME,
every projection is listed, fleets and in-process ones, as a table or `--json`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from psycopg import sql

from journal import JournalSettings, SliceRange, SyncJournal
from projections import SyncFleetControl, SyncProjection, UnknownProjection
from projections.fleet.status import NoFleet
from projections.tables import projection_tables
from slicejournal.cli import main


def _prepare(pg_dsn: str, settings: JournalSettings) -> None:
    """wallet-totals ran in this process (offsets stored, one event since); audit only
    dead-lettered a letter."""
    with SyncJournal.connect(pg_dsn, settings, create_schema=True) as journal:
        journal.append("wallet|w1", [{"deposit": 5}], expected_seq_nr=0)
        projection = SyncProjection.exactly_once(
            journal, name="wallet-totals", entity_type="wallet", slice_range=SliceRange.FULL,
            handler=lambda conn, env: None,
        )  # fmt: skip
        assert projection.run(until_caught_up=True).accepted == 1
        journal.append("wallet|w1", [{"deposit": 7}], expected_seq_nr=1)
        t = projection_tables(journal.tables, None)
        with journal.pool.connection() as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {d} (projection_name, projection_key, slice, persistence_id, "
                    "seq_nr, db_timestamp, error) VALUES ('audit', '0-1023', 1, 'wallet|w1', 1, "
                    "now(), 'boom')"
                ).format(d=t.dead_letter)
            )


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(60)
def test_status_shows_an_in_process_projection_after_pause(
    pg_dsn: str, settings: JournalSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    _prepare(pg_dsn, settings)
    common = ["--dsn", pg_dsn, "--schema", settings.schema]
    code, out, err = _cli(capsys, "pause", "wallet-totals", *common)
    assert code == 0, err
    code, out, err = _cli(capsys, "status", "wallet-totals", *common)
    assert code == 0, err
    assert "unknown projection" not in out + err
    assert "projection wallet-totals (entity type wallet (seen)): in-process" in out
    assert "paused:        yes" in out and "backlog:       1 event(s)" in out
    code, out, err = _cli(capsys, "status", "wallet-totals", "--json", *common)
    doc = json.loads(out)
    assert doc["kind"] == "in-process" and doc["paused"] == ["*"]
    assert doc["backlog_events"] == 1 and doc["dead_letters"] == 0
    # Known by its dead letter alone.
    code, out, err = _cli(capsys, "status", "audit", "--json", *common)
    assert code == 0, err
    assert json.loads(out)["dead_letters"] == 1
    # A name no table knows is still refused, truthfully.
    code, out, err = _cli(capsys, "status", "nobody", *common)
    assert code == 1 and "unknown projection 'nobody'" in err


@pytest.mark.timeout(60)
def test_status_without_a_name_lists_every_projection(
    pg_dsn: str, settings: JournalSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--dsn", pg_dsn, "--schema", settings.schema]
    _prepare(pg_dsn, settings)
    code, out, err = _cli(capsys, "status", *common)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["name", "kind", "entity_type"]
    assert lines[1].split()[:2] == ["audit", "in-process"]
    assert lines[2].split()[:2] == ["wallet-totals", "in-process"]
    code, out, err = _cli(capsys, "status", *common, "--json")
    docs: list[dict[str, Any]] = json.loads(out)
    assert [d["projection"] for d in docs] == ["audit", "wallet-totals"]
    assert docs[0]["dead_letters"] == 1 and docs[1]["latest_offset"] is not None
    code, out, err = _cli(capsys, "status", *common, "--watch")
    assert code == 1 and "--watch needs a projection NAME" in err


@pytest.mark.timeout(60)
def test_fleet_control_tells_an_in_process_projection_from_an_unknown_one(
    pg_dsn: str, settings: JournalSettings
) -> None:
    _prepare(pg_dsn, settings)
    with SyncJournal.connect(pg_dsn, settings) as journal:
        control = SyncFleetControl(journal)
        with pytest.raises(NoFleet, match="has no fleet") as info:
            control.status("wallet-totals")
        assert isinstance(info.value, UnknownProjection)
        assert "no stored offsets" not in str(info.value)
        with pytest.raises(UnknownProjection, match="unknown projection") as unknown:
            control.status("nobody")
        assert not isinstance(unknown.value, NoFleet)

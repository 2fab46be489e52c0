"""The CLI's reporting commands speak JSON (`--json`), `migrate --sql` prints the DDL
without applying it, `init` is a deprecated `migrate`, `--log-format json` makes the
error line JSON too, `clear-offset --dry-run` changes nothing, `retention apply` refuses
an entity type with no event, and `--keep -1s` names what is wrong with it."""

from __future__ import annotations

import json

import psycopg
import pytest

from journal import JournalSettings
from slicejournal.cli import main
from tests.integration.test_status_cli import _prepare


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _tables(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.timeout(60)
def test_migrate_sql_json_and_the_deprecated_init(
    pg_dsn: str, settings: JournalSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--dsn", pg_dsn, "--schema", settings.schema]
    code, out, err = _cli(capsys, "migrate", "--sql", *common)
    assert code == 0, err
    assert f'CREATE TABLE IF NOT EXISTS "{settings.schema}"."event_journal"' in out
    assert "pg_advisory_xact_lock" in out and "SET LOCAL lock_timeout" in out
    assert _tables(pg_dsn, settings.schema) == 0  # nothing applied
    code, out, err = _cli(capsys, "init", "--json", *common)
    assert code == 0 and "`init` is deprecated" in err and "use `migrate`" in err
    doc = json.loads(out)
    assert doc["schema"] == settings.schema and doc["applied"] == len(doc["steps"]) > 0
    code, out, err = _cli(capsys, "migrate", "--json", "--dry-run", *common)
    assert (code, err) == (0, "") and json.loads(out)["pending"] == 0
    code, out, err = _cli(capsys, "migrate", "--sql", *common)
    assert "0 pending step(s)" in out and "CREATE" not in out


@pytest.mark.timeout(60)
def test_operators_commands_report_json_and_clear_offset_dry_runs(
    pg_dsn: str, settings: JournalSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    _prepare(pg_dsn, settings)
    common = ["--dsn", pg_dsn, "--schema", settings.schema]
    for command in ("pause", "resume"):
        code, out, err = _cli(
            capsys, command, "wallet-totals", "--range", "0-511", "--json", *common
        )
        assert code == 0, err
        doc = json.loads(out)
        assert (doc["command"], doc["range"]) == (command, "0-511")
    code, out, err = _cli(capsys, "clear-offset", "wallet-totals", "--dry-run", "--json", *common)
    doc = json.loads(out)
    assert doc["dry_run"] and doc["offset_rows"] >= 1
    code, out, err = _cli(capsys, "status", "wallet-totals", "--json", *common)
    assert json.loads(out)["latest_offset"] is not None  # the dry run cleared nothing
    code, out, err = _cli(
        capsys, "set-offset", "wallet-totals", "2024-01-01T00:00:00+00:00", "--json", *common
    )
    assert json.loads(out)["timestamp"] == "2024-01-01T00:00:00+00:00"
    code, out, err = _cli(capsys, "clear-offset", "wallet-totals", "--json", *common)
    assert json.loads(out)["dry_run"] is False
    code, out, err = _cli(capsys, "status", "wallet-totals", "--json", *common)
    assert json.loads(out)["latest_offset"] is None


@pytest.mark.timeout(60)
def test_retention_apply_json_unknown_entity_type_and_negative_keep(
    pg_dsn: str, settings: JournalSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    _prepare(pg_dsn, settings)
    common = ["--dsn", pg_dsn, "--schema", settings.schema]
    apply = ["retention", "apply", *common, "--keep", "1d"]
    code, out, err = _cli(capsys, *apply, "--entity-type", "wallet", "--json", "--dry-run")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["dry_run"] and doc["entity_type"] == "wallet" and len(doc["ranges"]) == 8
    code, out, err = _cli(capsys, *apply, "--entity-type", "walet")
    assert code == 1 and "no event of entity type 'walet'" in err
    with pytest.raises(SystemExit) as exit_:
        main(["retention", "apply", *common, "--entity-type", "wallet", "--keep", "-1s"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "expected one argument" not in err and "'-1s'" in err


@pytest.mark.timeout(60)
def test_the_error_line_is_json_with_log_format_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _out, err = _cli(
        capsys, "--log-format", "json", "migrate", "--dsn", "postgresql://u:Xq7/Zr9@127.0.0.1:1/db"
    )
    assert code == 1
    entry = json.loads(err)
    assert entry["level"] == "error" and entry["error"] == "InvalidArgument"
    assert "Xq7" not in err and "Zr9" not in err


@pytest.mark.timeout(60)
def test_server_status_json(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = _cli(capsys, "server", "status", "--json", "--data-dir", str(tmp_path))
    assert code == 3
    doc = json.loads(out)
    assert doc["running"] is False and doc["dsn"] is None

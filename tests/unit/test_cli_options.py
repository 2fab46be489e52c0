"""The CLI's options on their own: `--log-level` / `--log-format` before or after the
subcommand, numeric options refused in one line (`migrate --lock-timeout` too), the JSON
log formatter's fields, and the events/s `status --watch` derives from two backlog
readings."""

from __future__ import annotations

import argparse
import json
import logging
from datetime import UTC, datetime, timedelta

import pytest

from journal import InvalidSettings, JournalSettings
from projections.backlog import Backlog
from slicejournal.cli import build_parser
from slicejournal.fleet_cli import events_per_second, positive_float
from slicejournal.logs import JsonFormatter


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("argv", "level", "form"),
    [
        (["status", "x"], "warning", "text"),
        (["--log-level", "info", "status", "x"], "info", "text"),
        (["status", "x", "--log-level", "INFO"], "info", "text"),
        (["--log-format", "json", "status", "x", "--log-level", "debug"], "debug", "json"),
        (["--log-level", "debug", "worker", "m:f", "--log-format", "json"], "debug", "json"),
        (["--log-level", "info", "dead-letters", "x", "--log-level", "error"], "error", "text"),
        (["server", "status", "--log-format", "json"], "warning", "json"),
        (["--log-format", "json", "migrate"], "warning", "json"),
    ],
)
def test_log_options_are_accepted_before_and_after_the_subcommand(
    argv: list[str], level: str, form: str
) -> None:
    args = build_parser().parse_args(argv)
    assert (args.log_level, args.log_format) == (level, form)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", ["-1", "0", "nan", "inf", "-0.5"])
def test_positive_float_says_what_it_got(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as error:
        positive_float(text)
    assert str(error.value) == f"must be positive, got {text}"
    assert positive_float("0.25") == 0.25


@pytest.mark.timeout(10)
def test_json_formatter_carries_the_extra_fields() -> None:
    record = logging.LogRecord(
        "slicejournal.projections.fleet", logging.INFO, __file__, 1, "worker %s claimed %s",
        ("w1", "0-511"), None,
    )  # fmt: skip
    for key, value in {"projection": "p", "range": "0-511", "worker": "w1", "epoch": 7}.items():
        setattr(record, key, value)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "worker w1 claimed 0-511"
    assert line["level"] == "info"
    assert line["logger"] == "slicejournal.projections.fleet"
    assert (line["projection"], line["range"], line["worker"], line["epoch"]) == (
        "p", "0-511", "w1", 7,
    )  # fmt: skip
    assert "args" not in line and "msg" not in line and "lineno" not in line
    datetime.fromisoformat(line["time"])


def _backlog(size: int, at: float, capped: bool = False) -> Backlog:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    return Backlog(timedelta(seconds=1), size, capped, None, t0 + timedelta(seconds=at))


@pytest.mark.timeout(10)
def test_events_per_second_from_two_backlog_readings() -> None:
    # 10 waited, 30 arrived, 5 wait now: 35 handled in 2 s.
    assert events_per_second(_backlog(10, 0), _backlog(5, 2), 30) == 17.5
    assert events_per_second(_backlog(0, 0), _backlog(0, 4), 0) == 0.0
    assert events_per_second(_backlog(0, 0), _backlog(0, 0), 3) is None  # no time passed
    assert events_per_second(_backlog(10, 0, capped=True), _backlog(5, 2), 30) is None


@pytest.mark.timeout(10)
def test_migrate_lock_timeout_is_seconds_above_zero(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    default = JournalSettings().migration_lock_timeout.total_seconds()
    assert parser.parse_args(["migrate"]).lock_timeout == default
    assert parser.parse_args(["init", "--lock-timeout", "0.25"]).lock_timeout == 0.25
    for text in ("0", "-1", "nan", "inf", "3e6", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["migrate", "--lock-timeout", text])
        assert "--lock-timeout" in capsys.readouterr().err
    # As PostgreSQL's lock_timeout takes it: whole ms, rounded up, never 0 (no limit).
    ms = [JournalSettings(migration_lock_timeout=s).migration_lock_timeout_ms
          for s in (0.3, 5, 0.0001, 1.0005, 10**8)]  # fmt: skip
    assert ms == [300, 5000, 1, 1001, 2**31 - 1]
    with pytest.raises(InvalidSettings):
        JournalSettings(migration_lock_timeout=0)

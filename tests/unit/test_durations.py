"""Durations are typed one way: every duration setting takes a timedelta, seconds, or
the string forms `RetentionPolicy.keep` and `--keep` take ("500ms", "30s", "15m",
"12h", "7d"), through the one parser, and a bad value is an `InvalidSettings` naming
the field."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import attrs
import pytest
from mypy import api

import projections.retention
from journal import (
    BacktrackingSettings,
    HorizonSettings,
    InvalidArgument,
    InvalidSettings,
    JournalSettings,
    QuerySettings,
    parse_duration,
)
from journal.durations import format_duration
from projections import (
    ProjectionSettings,
    RecoveryStrategy,
    RetentionPolicy,
    RetentionSettings,
    WorkerSettings,
)

SETTINGS = (
    JournalSettings,
    QuerySettings,
    BacktrackingSettings,
    HorizonSettings,
    ProjectionSettings,
    RetentionSettings,
    RecoveryStrategy,
    WorkerSettings,
)


def duration_fields(cls: type) -> list[str]:
    return [
        f.name
        for f in attrs.fields(cls)
        if isinstance(f.default, timedelta) or f.name == "delete_after_consumed"
    ]


def test_the_parser_lives_in_the_journal_and_keeps_its_old_home() -> None:
    assert projections.retention.parse_duration is parse_duration
    assert parse_duration("500ms") == timedelta(milliseconds=500)
    assert parse_duration(" 7d ") == timedelta(days=7)
    with pytest.raises(InvalidArgument, match="500ms, 30s"):
        parse_duration("0ms")


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_every_duration_setting_takes_every_form(cls: type) -> None:
    names = duration_fields(cls)
    assert names, cls
    twenty = timedelta(seconds=20)  # within every pairing rule (windows >= delays)
    for name in names:
        for value in ("20s", "20000ms", 20, 20.0, twenty):
            assert getattr(cls(**{name: value}), name) == twenty, (cls.__name__, name, value)


def test_the_examples_of_the_issue() -> None:
    s = ProjectionSettings(group_after_duration="500ms", management_poll_interval="200ms")
    assert s.group_after_duration == timedelta(milliseconds=500)
    assert s.management_poll_interval == timedelta(milliseconds=200)
    assert ProjectionSettings(delete_after_consumed="0s").delete_after_consumed == timedelta(0)
    assert ProjectionSettings(delete_after_consumed=None).delete_after_consumed is None
    journal = JournalSettings(connect_timeout="3s", query=QuerySettings(refresh_interval="250ms"))
    assert journal.query.refresh_interval == timedelta(milliseconds=250)
    assert RetentionPolicy("A", keep="1500ms").keep == timedelta(seconds=1.5)
    assert RecoveryStrategy.retry_and_skip(2, "50ms").backoff == timedelta(milliseconds=50)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("500 millis", "group_after_duration: expected a duration such as 500ms"),
        ("1.5s", "group_after_duration: expected a duration such as 500ms"),
        ("-1s", "group_after_duration: expected a duration such as 500ms"),
        ([1], "group_after_duration: expected a timedelta, seconds or a duration"),
        (True, "group_after_duration: expected a timedelta, seconds"),
        (float("nan"), "group_after_duration: expected a finite number of seconds"),
        (-1, "group_after_duration must not be negative"),
    ],
)
def test_a_bad_duration_names_the_field(value: object, message: str) -> None:
    with pytest.raises(InvalidSettings, match=message):
        ProjectionSettings(group_after_duration=value)  # type: ignore[arg-type]


def test_errors_name_the_field_in_every_settings_class() -> None:
    with pytest.raises(InvalidSettings, match=r"^connect_timeout: "):
        JournalSettings(connect_timeout="soon")
    with pytest.raises(InvalidSettings, match=r"^refresh_interval: "):
        QuerySettings(refresh_interval="3 s")
    with pytest.raises(InvalidSettings, match=r"^keep: "):
        RetentionPolicy("A", keep="1w")
    with pytest.raises(InvalidSettings, match="time_window must be positive"):
        ProjectionSettings(time_window="0s")


@pytest.mark.timeout(120)
def test_a_type_checker_accepts_every_form(tmp_path: Path) -> None:
    program = tmp_path / "settings_program.py"
    program.write_text(
        "from datetime import timedelta\n"
        "from journal import JournalSettings, QuerySettings\n"
        "from projections import ProjectionSettings\n"
        "s = ProjectionSettings(time_window=300, group_after_duration='500ms',\n"
        "    cleanup_interval=timedelta(seconds=30), delete_after_consumed=None)\n"
        "window: timedelta = s.time_window\n"
        "j = JournalSettings(connect_timeout='2s', query=QuerySettings(refresh_interval=0.5))\n"
        "bad = ProjectionSettings(time_window=[1])\n"
    )
    out, _, status = api.run(
        [str(program), "--strict", "--no-incremental", "--cache-dir=/dev/null"]
    )
    assert status == 1, out
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "settings_program.py:8:" in errors[0], out


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(days=7), "7d"),
        (timedelta(hours=36), "36h"),
        (timedelta(minutes=90), "90m"),
        (timedelta(seconds=30), "30s"),
        (timedelta(milliseconds=1500), "1500ms"),
        (timedelta(microseconds=5), "0:00:00.000005"),
        (timedelta(0), "0:00:00"),
        (timedelta(days=-1), "-1 day, 0:00:00"),
        (timedelta(milliseconds=1_000_000_001), "11 days, 13:46:40.001000"),
    ],
)
def test_a_duration_is_written_as_it_is_read(value: timedelta, text: str) -> None:
    """Reports (`RetentionPolicy.describe`, the retention CLI) write a duration the way
    `--keep` takes it, in its largest exact unit, and it reads back as the same value."""
    assert format_duration(value) == text
    if text[-1].isalpha():  # written in a unit: it reads back
        assert parse_duration(text) == value


def test_a_retention_policy_describes_its_keep_as_typed() -> None:
    assert "keep newer than 7d" in RetentionPolicy("Account", keep="7d").describe()

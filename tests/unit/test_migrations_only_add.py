"""A migration only adds: no shipped step drops, truncates, deletes or rewrites data, and
every component's steps are numbered 1..n with their placeholders all known."""

from __future__ import annotations

import re

import pytest

from journal.schema import components
from journal.settings import JournalSettings
from journal.tables import Tables

DESTRUCTIVE = re.compile(
    r"\b(DROP\s+(TABLE|SCHEMA|COLUMN|INDEX)|TRUNCATE|DELETE\s+FROM|UPDATE\s+\S+\s+SET"
    r"|ALTER\s+TABLE\s+\S+\s+ALTER\s+COLUMN\s+\S+\s+TYPE)\b",
    re.IGNORECASE,
)
STEPS = [m for c in components() for m in c.migrations()]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("step", STEPS, ids=str)
def test_no_migration_drops_or_rewrites_data(step: object) -> None:
    text = re.sub(r"--[^\n]*", "", step.text)  # type: ignore[attr-defined]
    assert DESTRUCTIVE.search(text) is None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("step", STEPS, ids=str)
def test_every_placeholder_is_bound(step: object) -> None:
    tables = step.component.tables(Tables(JournalSettings()))  # type: ignore[attr-defined]
    statement = step.statement(tables)  # type: ignore[attr-defined]
    assert "{" not in statement.as_string(None).replace("{body}", "")


@pytest.mark.timeout(30)
def test_both_components_are_installed_and_numbered() -> None:
    assert [c.name for c in components()] == ["journal", "projections"]
    assert all(c.head >= 1 for c in components())
    assert Tables(JournalSettings()).ddl_names()  # the names the steps are filled with

"""Names the library checks before anything reaches a database: identifier limits count
bytes (PostgreSQL's 63), and a persistence id may be exactly 255 characters long."""

from __future__ import annotations

import pytest

from journal import InvalidPersistenceId, InvalidSettings, JournalSettings


def test_identifier_limit_counts_bytes_not_characters() -> None:
    assert JournalSettings(schema="x" * 63).schema == "x" * 63
    assert JournalSettings(journal_table="é" * 31 + "x").journal_table == "é" * 31 + "x"
    with pytest.raises(InvalidSettings, match="63"):
        JournalSettings(journal_table="é" * 32)


def test_persistence_id_length_limit_is_inclusive() -> None:
    from journal.slices import validate_persistence_id

    ok = "A|" + "x" * 253
    assert len(ok) == 255
    assert validate_persistence_id(ok) == ok
    with pytest.raises(InvalidPersistenceId):
        validate_persistence_id(ok + "x")

"""Where the DSN comes from: an empty one is an error, never the embedded server."""

from __future__ import annotations

import pytest

from journal import InvalidArgument
from journal.dsn import DSN_ENV, resolve_dsn


def test_an_explicit_dsn_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DSN_ENV, "postgresql://env/db")
    assert resolve_dsn("postgresql://arg/db") == "postgresql://arg/db"
    assert resolve_dsn(None) == "postgresql://env/db"


def test_no_dsn_anywhere_means_the_default_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    assert resolve_dsn(None) is None


@pytest.mark.parametrize("empty", ["", " ", "\t\n"])
def test_an_empty_dsn_is_invalid(empty: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    with pytest.raises(InvalidArgument, match="the DSN is empty"):
        resolve_dsn(empty)
    monkeypatch.setenv(DSN_ENV, empty)
    with pytest.raises(InvalidArgument, match=f"{DSN_ENV} is set but empty"):
        resolve_dsn(None)

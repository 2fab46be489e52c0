"""`Journal.connect(...)` is a context manager; awaiting it, or using it as the journal,
says how to use it (and how to keep a journal open for an application's lifetime)
instead of a bare "can't be used in 'await' expression". Nothing connects here."""

from __future__ import annotations

import contextlib

import pytest

from journal import Journal, SyncJournal

DSN = "postgresql://nobody@127.0.0.1:1/none"


async def test_awaiting_connect_says_how_to_use_it() -> None:
    with pytest.raises(TypeError, match=r"not awaitable: use `async with Journal.connect") as e:
        await Journal.connect(DSN)  # type: ignore[misc]
    assert "AsyncExitStack" in str(e.value)


def test_using_connect_as_the_journal_says_how_to_use_it() -> None:
    with pytest.raises(AttributeError, match=r"no 'append'.*`async with Journal.connect"):
        Journal.connect(DSN).append  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError, match=r"no 'append'.*`with SyncJournal.connect") as e:
        SyncJournal.connect(DSN).append  # type: ignore[attr-defined]  # noqa: B018
    assert "contextlib.ExitStack" in str(e.value)
    assert not hasattr(SyncJournal.connect(DSN), "__probe__")  # hasattr stays safe


def test_it_is_a_context_manager_of_each_flavour() -> None:
    assert isinstance(Journal.connect(DSN), contextlib.AbstractAsyncContextManager)
    assert isinstance(SyncJournal.connect(DSN), contextlib.AbstractContextManager)

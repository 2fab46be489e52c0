"""A journal used after `close()` (or before `open()`) raises `JournalClosed`, not
`ConnectionLost` (whose meaning is "a write's outcome is unknown"): nothing was sent.
And a `connect_timeout` in the DSN wins over the settings' (it was overridden)."""

from __future__ import annotations

import pytest
from psycopg.conninfo import make_conninfo

from journal import (
    ConnectionLost,
    Journal,
    JournalClosed,
    JournalError,
    JournalSettings,
    SerializerRegistry,
    SyncJournal,
)
from journal.aio.pool import JournalPool
from journal.connection import pool_kwargs


@pytest.mark.timeout(60)
async def test_a_closed_journal_says_it_is_closed(pg_dsn: str, settings: JournalSettings) -> None:
    async with Journal.connect(pg_dsn, settings, create_schema=True) as journal:
        await journal.append("acct|a", [{"opened": 1}], expected_seq_nr=0)
    for call in (
        lambda: journal.append("acct|a", [{"again": 1}], expected_seq_nr=1),
        lambda: journal.highest_seq_nr("acct|a"),
    ):
        with pytest.raises(JournalClosed, match="the journal is closed: nothing was sent") as info:
            await call()
        assert not isinstance(info.value, ConnectionLost)
        assert isinstance(info.value, JournalError) and isinstance(info.value, RuntimeError)
    with pytest.raises(JournalClosed):
        async for _ in journal.current_events_by_persistence_id("acct|a"):
            pass


@pytest.mark.timeout(60)
async def test_a_journal_never_opened_says_so(pg_dsn: str, settings: JournalSettings) -> None:
    journal = Journal(pg_dsn, settings, SerializerRegistry())
    with pytest.raises(JournalClosed, match="not open yet"):
        await journal.highest_seq_nr("acct|a")


@pytest.mark.timeout(60)
def test_the_sync_journal_says_it_is_closed_too(pg_dsn: str, settings: JournalSettings) -> None:
    with SyncJournal.connect(pg_dsn, settings, create_schema=True) as journal:
        journal.append("acct|a", [{"opened": 1}], expected_seq_nr=0)
    with pytest.raises(JournalClosed, match="closed"):
        journal.highest_seq_nr("acct|a")


@pytest.mark.timeout(60)
async def test_the_dsns_connect_timeout_wins(pg_dsn: str, settings: JournalSettings) -> None:
    dsn = make_conninfo(pg_dsn, connect_timeout=17)
    assert "connect_timeout" not in pool_kwargs(settings, "p", None, dsn)["kwargs"]
    assert pool_kwargs(settings, "p", None, pg_dsn)["kwargs"]["connect_timeout"] == (
        settings.connect_timeout_seconds
    )
    async with Journal.connect(dsn, settings, create_schema=True) as journal:
        async with journal.pool.connection() as conn:
            assert "connect_timeout=17" in conn.info.dsn
        assert isinstance(journal.pool, JournalPool)

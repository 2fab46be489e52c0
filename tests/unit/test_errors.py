"""Errors raised before any database answers are typed `JournalError`s with a one-line
message naming what was wrong: unreachable servers (a closed port on 127.0.0.1, or a
local socket that never answers), malformed DSNs, bad settings and arguments, and no
DSN without the embedded server. The rest, on the real server or through the CLI, are
in tests/integration/test_errors.py.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from journal import (
    ConnectionFailed,
    InvalidArgument,
    InvalidSettings,
    Journal,
    JournalError,
    JournalSettings,
    SerializerRegistry,
    SliceRange,
    slice_ranges,
)
from journal.dsn import display_dsn
from tests.support.errors import MALFORMED, PASSWORD, assert_one_line_without_password, closed_port

# -- connection failures ---------------------------------------------------------------------


@pytest.mark.timeout(30)
async def test_an_unreachable_server_is_connection_failed_naming_host_and_port() -> None:
    port = closed_port()
    dsn = f"postgresql://nobody:{PASSWORD}@127.0.0.1:{port}/x"
    with pytest.raises(ConnectionFailed) as info:
        async with Journal.connect(dsn):
            pass
    message = assert_one_line_without_password(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "refused" in message.lower()
    # Journal.open() directly, key=value form.
    j = Journal(
        f"host=127.0.0.1 port={port} password={PASSWORD}", JournalSettings(), SerializerRegistry()
    )
    with pytest.raises(ConnectionFailed, match=f"127.0.0.1:{port}") as info:
        await j.open()
    assert_one_line_without_password(info.value)


@pytest.mark.timeout(30)
async def test_a_server_that_never_answers_fails_within_the_connect_timeout() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # keep the socket open, never reply

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        settings = JournalSettings(connect_timeout=timedelta(seconds=2))
        dsn = f"postgresql://nobody:{PASSWORD}@127.0.0.1:{port}/x"
        with pytest.raises(ConnectionFailed, match=f"127.0.0.1:{port}") as info:
            async with Journal.connect(dsn, settings):
                pass
        assert_one_line_without_password(info.value)
        assert accepted, "the client never reached the silent server"
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


def test_connect_timeout_is_validated() -> None:
    for bad in (0, -1, "5"):
        with pytest.raises(InvalidSettings, match=r"connect_timeout|timedelta"):
            JournalSettings(connect_timeout=bad)  # type: ignore[arg-type]
    assert JournalSettings(connect_timeout=timedelta(seconds=0.5)).connect_timeout_seconds == 2
    assert JournalSettings(connect_timeout=timedelta(seconds=7.2)).connect_timeout_seconds == 8


@pytest.mark.timeout(30)
@pytest.mark.parametrize("dsn", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_dsn_is_invalid_argument_with_the_password_masked(dsn: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid DSN") as info:
        async with Journal.connect(dsn):
            pass
    assert isinstance(info.value, ValueError)
    assert_one_line_without_password(info.value)


def test_display_dsn_masks_the_password() -> None:
    shown = display_dsn(f"postgresql://alice:{PASSWORD}@db.example:6543/ledger")
    assert PASSWORD not in shown
    assert shown == "postgresql://alice:***@db.example:6543/ledger"
    assert PASSWORD not in display_dsn(MALFORMED["url missing a slash"])


# -- argument errors ---------------------------------------------------------------------------


def test_slice_ranges_and_slice_range_errors_are_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="got 3") as info:
        slice_ranges(3)
    assert isinstance(info.value, JournalError) and isinstance(info.value, ValueError)
    with pytest.raises(InvalidArgument, match="str"):
        slice_ranges("4")  # type: ignore[arg-type]
    for bad in (("0", 5), (0, 1024), (-1, 5), (5, 4), (0.0, 5)):
        with pytest.raises(InvalidArgument) as info:
            SliceRange(*bad)
        assert isinstance(info.value, JournalError)


# -- no database configured -------------------------------------------------------------------


def test_no_dsn_and_no_embedded_server_installed_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import journal.dsn

    monkeypatch.delenv("SLICEJOURNAL_DSN", raising=False)
    monkeypatch.setattr(journal.dsn, "entry_points", lambda group: [])
    with (
        pytest.raises(ConnectionFailed, match=r"slicejournal\[embedded\]") as caught,
        journal.dsn.database(None),
    ):
        pass
    assert isinstance(caught.value, JournalError)

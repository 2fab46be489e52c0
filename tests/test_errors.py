"""Every public error is a typed `JournalError` with a one-line message naming what was wrong:
unreachable servers, malformed DSNs, a schema never initialised (or dropped later), bad
arguments and unknown projections. Runs on the real server; the unreachable ones use a
closed port on 127.0.0.1 or a local socket that never answers.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import (
    ConnectionFailed,
    InvalidArgument,
    InvalidSettings,
    Journal,
    JournalError,
    JournalSettings,
    SchemaNotInitialized,
    SerializerRegistry,
    SliceRange,
    UnknownProjection,
    slice_ranges,
)
from journal.dsn import display_dsn
from projections import Projection, ProjectionManagement
from projections.names import validate_name
from tests.conftest import drop_test_schema

PASSWORD = "s3cr3t-Pa55w0rd"


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def assert_one_line_without_password(error: BaseException) -> str:
    assert isinstance(error, JournalError)
    message = str(error)
    assert "\n" not in message
    assert PASSWORD not in message
    return message


async def handler(conn: Any, env: Any) -> None:
    pass


# -- the hierarchy -----------------------------------------------------------------------------

LIBRARY_PACKAGES = ("journal", "projections", "slicejournal")


def test_every_exception_the_library_defines_is_a_journal_error() -> None:
    # In a fresh interpreter: every module of the library imported (Spark's too), then
    # every public `Exception` class defined in one of them (a `BaseException` such as the
    # sync flavour's `CancelledError` is a control-flow signal, as asyncio's, not an error).
    code = (
        "import importlib, inspect, json, pkgutil\n"
        "from journal.errors import JournalError\n"
        "stray = []\n"
        f"for name in {LIBRARY_PACKAGES!r}:\n"
        "    package = importlib.import_module(name)\n"
        "    prefix = name + '.'\n"
        "    for info in pkgutil.walk_packages(package.__path__, prefix):\n"
        "        if info.name.endswith('__main__'):\n"
        "            continue\n"
        "        module = importlib.import_module(info.name)\n"
        "        for attr, value in vars(module).items():\n"
        "            if (not attr.startswith('_') and inspect.isclass(value)\n"
        "                    and issubclass(value, Exception)\n"
        "                    and value.__module__ == info.name\n"
        "                    and not issubclass(value, JournalError)):\n"
        "                stray.append(f'{info.name}.{attr}')\n"
        "print(json.dumps(sorted(stray)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(result.stdout) == []


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


MALFORMED = {
    "url missing a slash": f"postgresql:/nobody:{PASSWORD}@localhost/x?",
    "key without =": f"host=127.0.0.1 password={PASSWORD} bogus",
    "unknown query parameter": f"postgresql://nobody:{PASSWORD}@localhost/x?frobnicate=1",
    "unknown option": f"host=127.0.0.1 password={PASSWORD} frobnicate=1",
}


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


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slicejournal.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(60)
def test_cli_init_with_an_unreachable_server_prints_one_line() -> None:
    port = closed_port()
    result = run_cli("init", "--dsn", f"postgresql://nobody:{PASSWORD}@127.0.0.1:{port}/x")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("slicejournal: error: cannot connect to PostgreSQL")
    assert f"127.0.0.1:{port}" in lines[0]
    assert "Traceback" not in result.stderr
    assert PASSWORD not in result.stderr + result.stdout


@pytest.mark.timeout(60)
def test_cli_init_with_a_malformed_dsn_prints_one_line() -> None:
    result = run_cli("init", "--dsn", MALFORMED["url missing a slash"])
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("slicejournal: error: invalid DSN")
    assert PASSWORD not in result.stderr + result.stdout


# -- missing schema ----------------------------------------------------------------------------


async def test_a_schema_never_initialised_is_reported_on_open(
    pg_dsn: str, settings: JournalSettings
) -> None:
    with pytest.raises(SchemaNotInitialized) as info:
        async with Journal.connect(pg_dsn, settings):  # a DSN: create_schema defaults to False
            pass
    message = str(info.value)
    assert isinstance(info.value, JournalError)
    assert "slicejournal init" in message and f"--schema {settings.schema}" in message
    assert "create_schema=True" in message
    # The schema exists but holds no journal table: the same.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(settings.schema)))
    with pytest.raises(SchemaNotInitialized, match="event_journal"):
        async with Journal.connect(pg_dsn, settings):
            pass
    # Check skipped (a caller that creates the schema itself): first use says the same.
    async with Journal.connect(pg_dsn, settings, check_schema=False) as j:
        with pytest.raises(SchemaNotInitialized, match="slicejournal init"):
            await j.highest_seq_nr("Bank|a")
        await j.create_schema()
        assert await j.highest_seq_nr("Bank|a") == 0


def drop_table(pg_dsn: str, schema: str, table: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")  # the journal's idle pooled connections hold none
        conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(sql.Identifier(schema, table)))


async def test_a_table_dropped_later_is_schema_not_initialized(
    pg_dsn: str, journal: Journal
) -> None:
    await journal.append("Bank|a", [{"amount": 1}], expected_seq_nr=0)
    drop_table(pg_dsn, journal.settings.schema, "event_journal")
    with pytest.raises(SchemaNotInitialized, match="slicejournal init") as info:
        await journal.append("Bank|a", [{"amount": 2}], expected_seq_nr=1)
    assert isinstance(info.value, JournalError)
    with pytest.raises(SchemaNotInitialized, match="event_journal"):
        async for _ in journal.current_events_by_slices("Bank", 0, 1023):
            pass
    # A missing table that is not the journal's own (a handler's read model) is untouched.
    with pytest.raises(psycopg.errors.UndefinedTable):
        async with journal.pool.connection() as conn:
            await conn.execute(
                sql.SQL("SELECT 1 FROM {}").format(
                    sql.Identifier(journal.settings.schema, "event_journal_read_model")
                )
            )


ODD_NAMES = [('we"ird.sch ema', 'ev.ent "journal'), ("Ünïcødé", "Tabelle ü")]


@pytest.mark.parametrize(("schema_name", "table"), ODD_NAMES)
async def test_the_schema_check_and_translation_hold_for_odd_names(
    pg_dsn: str, schema_name: str, table: str
) -> None:
    settings = JournalSettings(schema=schema_name, journal_table=table)
    try:
        async with Journal.connect(pg_dsn, settings, create_schema=True):
            pass
        async with Journal.connect(pg_dsn, settings) as j:  # initialised: the check passes
            await j.append("Odd|1", [{"a": 1}], expected_seq_nr=0)
            drop_table(pg_dsn, schema_name, table)
            with pytest.raises(SchemaNotInitialized, match=re.escape(f"{schema_name}.{table}")):
                await j.highest_seq_nr("Odd|1")
        with pytest.raises(SchemaNotInitialized, match="slicejournal init"):
            async with Journal.connect(pg_dsn, settings):
                pass
    finally:
        drop_test_schema(pg_dsn, schema_name)


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


async def test_projection_argument_errors_are_invalid_argument(journal: Journal) -> None:
    with pytest.raises(InvalidArgument, match="projection name") as info:
        validate_name("")
    assert isinstance(info.value, JournalError)
    with pytest.raises(InvalidArgument, match="projection name"):
        Projection.exactly_once(
            journal, name="", entity_type="Bank", slice_range=SliceRange(0, 1023), handler=handler
        )
    with pytest.raises(InvalidArgument, match="SliceRange, got tuple") as info:
        Projection.exactly_once(
            journal,
            name="p",
            entity_type="Bank",
            slice_range=(0, 255),  # type: ignore[arg-type]
            handler=handler,
        )
    assert isinstance(info.value, JournalError)
    with pytest.raises(InvalidArgument, match="handler"):
        Projection.at_least_once(
            journal,
            name="p",
            entity_type="Bank",
            slice_range=SliceRange(0, 1023),
            handler=42,  # type: ignore[arg-type]
        )
    mgmt = ProjectionManagement(journal)
    await mgmt.pause("p")
    with pytest.raises(InvalidArgument, match="SliceRange, got tuple"):
        await mgmt.status("p", "Bank", ranges=[(0, 1023)])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="positive divisor"):
        await mgmt.status("p", "Bank", ranges=3)


# -- unknown projection ------------------------------------------------------------------------


async def test_status_of_an_unknown_projection_is_unknown_projection(journal: Journal) -> None:
    mgmt = ProjectionManagement(journal)
    with pytest.raises(UnknownProjection, match="'nope'") as info:
        await mgmt.status("nope", "Bank")
    assert isinstance(info.value, JournalError)
    # Reads that have a natural empty answer keep it; pausing before the first start works.
    assert await mgmt.dead_letters("nope") == []
    assert not await mgmt.is_paused("nope", SliceRange(0, 1023))
    await mgmt.pause("nope")
    [status] = await mgmt.status("nope", "Bank")
    assert status.paused and status.latest_offset is None


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

"""Every public error is a typed `JournalError` with a one-line message naming what was wrong:
unreachable servers, malformed DSNs, a schema never initialised (or dropped later), bad
arguments and unknown projections. Runs on the real server and through the CLI; the
errors raised before any server answers are in tests/unit/test_errors.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from psycopg import sql

from journal import (
    InvalidArgument,
    Journal,
    JournalError,
    JournalSettings,
    SchemaNotInitialized,
    SliceRange,
)
from projections import Projection, ProjectionManagement, UnknownProjection
from projections.names import validate_name
from tests.support.errors import MALFORMED, PASSWORD, closed_port
from tests.support.pg import drop_test_schema


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
    result = run_cli("migrate", "--dsn", f"postgresql://nobody:{PASSWORD}@127.0.0.1:{port}/x")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("slicejournal: error: cannot connect to PostgreSQL")
    assert f"127.0.0.1:{port}" in lines[0]
    assert "Traceback" not in result.stderr
    assert PASSWORD not in result.stderr + result.stdout


@pytest.mark.timeout(60)
def test_cli_init_with_a_malformed_dsn_prints_one_line() -> None:
    result = run_cli("migrate", "--dsn", MALFORMED["url missing a slash"])
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
    assert "slicejournal migrate" in message and f"--schema {settings.schema}" in message
    assert "create_schema=True" in message
    # The schema exists but holds no journal table: the same.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(settings.schema)))
    with pytest.raises(SchemaNotInitialized, match="event_journal"):
        async with Journal.connect(pg_dsn, settings):
            pass
    # Check skipped (a caller that creates the schema itself): first use says the same.
    async with Journal.connect(pg_dsn, settings, check_schema=False) as j:
        with pytest.raises(SchemaNotInitialized, match="slicejournal migrate"):
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
    with pytest.raises(SchemaNotInitialized, match="slicejournal migrate") as info:
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


async def test_a_projection_table_dropped_later_is_schema_not_initialized(
    pg_dsn: str, journal: Journal
) -> None:
    """The journal's pool knows only the journal's tables; the projections name theirs."""
    await journal.append("Bank|a", [{"amount": 1}], expected_seq_nr=0)
    drop_table(pg_dsn, journal.settings.schema, "projection_timestamp_offset_store")
    where = re.escape(f"{journal.settings.schema}.projection_timestamp_offset_store")
    with pytest.raises(SchemaNotInitialized, match=where) as info:
        await ProjectionManagement(journal).clear_offset("p")
    assert "slicejournal migrate" in str(info.value)
    projection = Projection.exactly_once(
        journal, name="p", entity_type="Bank", slice_range=SliceRange(0, 1023), handler=handler
    )
    with pytest.raises(SchemaNotInitialized, match=where):
        await projection.run(until_caught_up=True)
    assert await journal.highest_seq_nr("Bank|a") == 1  # the journal itself still works


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
        with pytest.raises(SchemaNotInitialized, match="slicejournal migrate"):
            async with Journal.connect(pg_dsn, settings):
                pass
    finally:
        drop_test_schema(pg_dsn, schema_name)


# -- argument errors ---------------------------------------------------------------------------


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

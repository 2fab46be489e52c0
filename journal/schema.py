"""Applying the DDL in `sql/` to a database, idempotently.

The drivers run `schema_script` (`journal/aio/pool.py`, `apply_schema`). The
files ship inside the wheel (as `journal/ddl/`); in a source checkout they
are read from the top-level `sql/` folder. Placeholders are filled with quoted
identifiers from the settings, and the whole script runs in one transaction
under an advisory lock, so two services starting at once cannot race on
`CREATE ... IF NOT EXISTS`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from psycopg import sql

from journal.settings import JournalSettings
from journal.tables import Tables

DDL_FILES = ("journal.sql", "projections.sql")
_INIT_LOCK_KEY = 0x5_1CE_70_0A  # arbitrary, constant: serialises concurrent `init`s


def ddl_text(name: str) -> str:
    """The text of one DDL file, from the installed package or the source tree."""
    packaged = resources.files("journal").joinpath("ddl", name)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    source = Path(__file__).resolve().parent.parent / "sql" / name
    return source.read_text(encoding="utf-8")


def ddl_statements(settings: JournalSettings) -> list[sql.Composed]:
    """The DDL scripts with every placeholder bound to a quoted identifier."""
    names = Tables(settings).ddl_names()
    return [sql.SQL(ddl_text(name)).format(**names) for name in DDL_FILES]


def schema_script(
    settings: JournalSettings,
) -> list[tuple[sql.SQL | sql.Composed, tuple[int, ...]]]:
    """The statements (with parameters) that apply the schema, to run in one transaction."""
    lock: tuple[sql.SQL | sql.Composed, tuple[int, ...]] = (
        sql.SQL("SELECT pg_advisory_xact_lock(%s)"),
        (_INIT_LOCK_KEY,),
    )
    return [lock, *((statement, ()) for statement in ddl_statements(settings))]

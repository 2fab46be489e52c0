"""The `slicejournal` command: `init` applies the schema, `demo` runs the showcase."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from journal.embedded import EmbeddedPostgres
from journal.errors import JournalError
from journal.journal import resolve_dsn
from journal.settings import JournalSettings


async def _init(dsn: str, settings: JournalSettings) -> None:
    import psycopg

    from journal.schema import apply_schema

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await apply_schema(conn, settings)


def _settings(args: argparse.Namespace) -> JournalSettings:
    return JournalSettings(schema=args.schema)


def cmd_init(args: argparse.Namespace) -> int:
    settings = _settings(args)
    dsn = resolve_dsn(args.dsn)
    if dsn is None:
        with EmbeddedPostgres() as embedded_dsn:
            asyncio.run(_init(embedded_dsn, settings))
            where = "the embedded server (.slicejournal/)"
    else:
        asyncio.run(_init(dsn, settings))
        where = "the configured database"
    print(f"schema {settings.schema!r} is ready in {where}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from journal.demo import run_demo

    return asyncio.run(run_demo(resolve_dsn(args.dsn), _settings(args), args))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slicejournal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dsn", help="PostgreSQL DSN (default: $SLICEJOURNAL_DSN, else embedded)")
    common.add_argument("--schema", default="public", help="schema name (default: public)")
    p_init = sub.add_parser("init", parents=[common], help="create tables (idempotent)")
    p_init.set_defaults(func=cmd_init)
    p_demo = sub.add_parser("demo", parents=[common], help="run the bank-account demo")
    p_demo.add_argument("--accounts", type=int, default=200)
    p_demo.add_argument("--events", type=int, default=4000)
    p_demo.add_argument("--writers", type=int, default=8)
    p_demo.set_defaults(func=cmd_demo)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except JournalError as e:
        print(f"slicejournal: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

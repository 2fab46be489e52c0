"""The `slicejournal` command: `migrate` brings the schema to this release (`init` is
its deprecated name), `demo` runs the showcase, `server` manages the embedded
PostgreSQL, `worker` runs a share of a projection fleet and `scale`, `status`, `pause`,
`resume`, `set-offset`, `clear-offset` and `dead-letters` operate it; `retention apply`
deletes old events no projection still needs and `projections list | register |
retire` manage what holds it."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import attrs

from journal.dsn import database, resolve_dsn
from journal.errors import JournalError
from journal.schema import Migration
from journal.settings import JournalSettings
from slicejournal import __version__
from slicejournal.fleet_cli import add_fleet_parsers
from slicejournal.logs import add_log_options, configure_logging
from slicejournal.retention_cli import add_retention_parsers, check_rules
from slicejournal.server_cli import add_server_parser

DEMO_SCHEMA = "slicejournal_demo"
SPARK_DEMO_SCHEMA = "slicejournal_spark_demo"
# PostgreSQL's largest lock_timeout (2^31 - 1 ms), in whole seconds.
MAX_LOCK_TIMEOUT_SECONDS = 2_147_483


async def _migrate(
    dsn: str, settings: JournalSettings, *, dry_run: bool, quiet: bool = False
) -> list[Migration]:
    import psycopg

    from journal.aio.migrate import migrate
    from journal.aio.pool import connect
    from journal.connection import describe, one_line

    # `connect` fails within settings.connect_timeout with a one-line ConnectionFailed
    # (or InvalidArgument for a malformed DSN), password masked.
    async with await connect(dsn, connect_timeout=settings.connect_timeout_seconds) as conn:
        try:
            return await migrate(
                conn,
                settings,
                dry_run=dry_run,
                on_step=None if quiet else lambda m: print(f"applied {m}", flush=True),
            )
        except psycopg.Error as e:  # e.g. no CREATE privilege
            raise JournalError(
                f"cannot migrate schema {settings.schema!r} in {describe(conn)}: {one_line(e)}"
            ) from None


async def _migration_sql(dsn: str, settings: JournalSettings) -> str:
    """The SQL `migrate` would run for the pending steps, as text (nothing applied): each
    step's DDL and the row recording its version, each in a transaction of its own."""
    from journal.aio.migrate import read_versions
    from journal.aio.pool import connect
    from journal.schema import installation, migration_script, pending
    from journal.tables import Tables

    tables = Tables(settings)
    async with await connect(dsn, connect_timeout=settings.connect_timeout_seconds) as conn:
        steps = pending(await read_versions(conn, tables) or {}, installation(tables))
    header = (
        f"-- slicejournal {__version__}: {len(steps)} pending step(s) for schema "
        f"{settings.schema!r} (nothing was applied)"
    )
    return migration_script(
        tables, steps, lock_timeout_ms=settings.migration_lock_timeout_ms, header=header
    ).rstrip("\n")


def _settings(args: argparse.Namespace) -> JournalSettings:
    return JournalSettings(schema=args.schema)


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an int in [low, high], else a one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def _positive_seconds(text: str) -> float:
    """An argparse type: a duration in seconds (> 0), else a one-line usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_LOCK_TIMEOUT_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be above 0 and at most {MAX_LOCK_TIMEOUT_SECONDS} seconds, got {text}"
        )
    return value


def cmd_migrate(args: argparse.Namespace) -> int:
    if args.command == "init":
        note = "`init` is deprecated (removed in 0.4.0): use `migrate`"
        print(f"slicejournal: note: {note}, the same command", file=sys.stderr)
    settings = attrs.evolve(_settings(args), migration_lock_timeout=args.lock_timeout)
    if args.sql:
        with database(args.dsn) as (dsn, _):
            print(asyncio.run(_migration_sql(dsn, settings)), flush=True)
        return 0
    with database(args.dsn) as (dsn, is_default):
        steps = asyncio.run(_migrate(dsn, settings, dry_run=args.dry_run, quiet=args.json))
    where = "the embedded server" if is_default else "the configured database"
    if args.json:
        print(json.dumps({
            "schema": settings.schema,
            "database": "embedded" if is_default else "configured",
            "dry_run": args.dry_run,
            "steps": [str(step) for step in steps],
            "pending" if args.dry_run else "applied": len(steps),
        }), flush=True)  # fmt: skip
    elif args.dry_run:
        for step in steps:
            print(f"would apply {step}")
        print(f"schema {settings.schema!r} in {where}: {len(steps)} step(s) pending")
    else:
        print(f"schema {settings.schema!r} is ready in {where} ({len(steps)} step(s) applied)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from slicejournal.demo import run_demo

    return asyncio.run(run_demo(resolve_dsn(args.dsn), _settings(args), args))


def cmd_spark_demo(args: argparse.Namespace) -> int:
    from slicejournal.spark_demo import run_spark_demo

    return asyncio.run(run_spark_demo(resolve_dsn(args.dsn), _settings(args), args))


def _add_demo_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    dsn: argparse.ArgumentParser,
    name: str,
    func: Callable[[argparse.Namespace], int],
    *,
    schema: str,
    events: int,
    events_help: str,
    help: str,
    description: str,
) -> None:
    """A demo command: its own schema, and how many accounts, events and writers."""
    p = sub.add_parser(name, parents=[dsn], help=help, description=description)
    p.add_argument(
        "--schema",
        default=schema,
        help=f"the demo's own schema (default: {schema}); created by the demo, "
        "reset on every run, any other existing schema is refused",
    )
    p.add_argument("--accounts", type=_bounded_int(1, 100_000), default=200,
                   help="number of accounts (1..100000, default 200)")  # fmt: skip
    p.add_argument("--events", type=_bounded_int(10, 1_000_000), default=events,
                   help=events_help)  # fmt: skip
    p.add_argument("--writers", type=_bounded_int(1, 64), default=8,
                   help="concurrent writers (1..64, default 8)")  # fmt: skip
    p.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    """The `slicejournal` command's parser, every subcommand registered."""
    parser = argparse.ArgumentParser(prog="slicejournal", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_log_options(parser, top_level=True)
    logs = argparse.ArgumentParser(add_help=False)
    add_log_options(logs)
    dsn = argparse.ArgumentParser(add_help=False, parents=[logs])
    dsn.add_argument("--dsn", help="PostgreSQL DSN (default: $SLICEJOURNAL_DSN, else embedded)")
    for name, help_text in (
        ("migrate", "create the schema's tables or bring them to this release (idempotent, "
         "safe to run concurrently); the canonical command"),
        ("init", "deprecated: the same as migrate (removed in 0.4.0)"),
    ):  # fmt: skip
        p_migrate = sub.add_parser(
            name,
            parents=[dsn],
            help=help_text,
            description="Applies every pending numbered migration of the schema, one "
            "transaction per step under an advisory lock; a migration only adds, it never "
            "drops or rewrites data. Run it before starting workers of a new release. "
            + ("`init` is a deprecated name of `migrate`." if name == "init" else ""),
        )
        p_migrate.add_argument("--schema", default="public", help="schema name (default: public)")
        what = p_migrate.add_mutually_exclusive_group()
        what.add_argument("--dry-run", action="store_true",
                          help="list the pending steps, apply nothing")  # fmt: skip
        what.add_argument("--sql", action="store_true",
                          help="print the SQL the pending steps would run (DDL and version "
                          "bookkeeping), apply nothing: for a DBA's review")  # fmt: skip
        p_migrate.add_argument("--json", action="store_true",
                               help="one JSON object: schema, steps, how many applied or "
                               "pending")  # fmt: skip
        default_wait = JournalSettings().migration_lock_timeout.total_seconds()
        p_migrate.add_argument(
            "--lock-timeout", type=_positive_seconds, default=default_wait, metavar="SECONDS",
            help="how long a step may wait for a lock on a table it changes (writes to that "
            "table queue behind it meanwhile) before it gives up, applying nothing of that "
            f"step; run again later to retry (default: {default_wait:g})",
        )  # fmt: skip
        p_migrate.set_defaults(func=cmd_migrate)
    _add_demo_parser(
        sub, dsn, "demo", cmd_demo, schema=DEMO_SCHEMA, events=4000,
        events_help="events to write (10..1000000, default 4000)",
        help="run the bank-account demo",
        description="Writes bank-account events while a projection keeps a balances table, "
        "rescaled 4 -> 8 -> 2, then verifies it. Runs only in a schema of its own, which it "
        "creates and resets on every run; it refuses any other schema.",
    )  # fmt: skip
    _add_demo_parser(
        sub, dsn, "spark-demo", cmd_spark_demo, schema=SPARK_DEMO_SCHEMA, events=20_000,
        events_help="events, half before Spark runs (default 20000)",
        help="run the bank-account demo on a local Apache Spark (needs slicejournal[spark])",
        description="Backfills the balances projection on local Spark (exactly once), rebuilds "
        "it on Spark and swaps it in, then hands it to the in-process runner while more events "
        "are written, and verifies the read model. Runs only in a schema of its own.",
    )  # fmt: skip
    add_server_parser(sub)
    add_fleet_parsers(sub, dsn, _bounded_int)
    common = argparse.ArgumentParser(add_help=False, parents=[dsn])
    common.add_argument("--schema", default="public", help="schema name (default: public)")
    add_retention_parsers(sub, common, _bounded_int)
    return parser


# Options whose value may start with "-" ("--keep -1s"): argparse would take the value
# for an option and say "expected one argument"; joined as "--keep=-1s", the option's
# own check names what is wrong with it.
_VALUE_OPTIONS = frozenset({"--keep", "--keep-last", "--batch-size", "--ranges", "--timeout",
                            "--interval", "--count", "--lease-ttl", "--lock-timeout",
                            "--instances", "--accounts", "--events", "--writers"})  # fmt: skip


def _join_dash_values(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if item in _VALUE_OPTIONS and i + 1 < len(items) and items[i + 1][:2].startswith("-"):
            following = items[i + 1]
            if len(following) > 1 and (following[1].isdigit() or following[1] == "."):
                out.append(f"{item}={following}")
                i += 2
                continue
        out.append(item)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_dash_values(sys.argv[1:] if argv is None else argv))
    check_rules(parser, args)
    configure_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args))
    except JournalError as e:
        message = " ".join(line.strip() for line in str(e).splitlines())
        if args.log_format == "json":  # the error line too, as the log pipeline reads it
            print(json.dumps({"time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                              "level": "error", "logger": "slicejournal", "message": message,
                              "error": type(e).__name__}), file=sys.stderr)  # fmt: skip
        else:
            print(f"slicejournal: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

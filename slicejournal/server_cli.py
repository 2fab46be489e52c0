"""`slicejournal server start|stop|status`: the embedded PostgreSQL, kept running between runs.

`start` starts the server of a data directory (or adopts the running one) and
leaves it running when the command exits; programs that connect with no DSN
then use it and leave it running too. `stop` stops it, whoever is using it.
`status` exits 0 if a server runs in the data directory, 3 if not.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from journal.dsn import DSN_ENV, display_dsn
from slicejournal.embedded import DATA_DIR_ENV, EmbeddedPostgres, ServerStatus
from slicejournal.logs import add_log_options

NOT_RUNNING = 3  # the exit status of `status` when no server runs (as `pg_ctl status`)


def add_server_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `server` and its `start`, `stop` and `status` subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"the server's data directory (default: ${DATA_DIR_ENV}, else .slicejournal/pgdata)",
    )
    add_log_options(common)
    p_server = sub.add_parser(
        "server",
        help="start, stop or inspect the embedded PostgreSQL",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = p_server.add_subparsers(dest="server_command", required=True)
    p_start = commands.add_parser(
        "start",
        parents=[common],
        help="start the embedded PostgreSQL and leave it running",
        description="Start the embedded PostgreSQL of the data directory, or adopt the one "
        "already running there, and leave it running (until `slicejournal server stop`). "
        "Prints its DSN, for psql and SLICEJOURNAL_DSN.",
    )
    p_start.add_argument("--dsn-only", action="store_true", help="print only the DSN")
    p_start.set_defaults(func=cmd_server_start)
    p_stop = commands.add_parser(
        "stop",
        parents=[common],
        help="stop the embedded PostgreSQL",
        description="Stop the embedded PostgreSQL of the data directory, even if other "
        "processes are recorded as using it. Exits 0 whether or not one was running.",
    )
    p_stop.set_defaults(func=cmd_server_stop)
    p_status = commands.add_parser(
        "status",
        parents=[common],
        help="is the embedded PostgreSQL running? (exit 0 if so, 3 if not)",
        description="Report whether the embedded PostgreSQL of the data directory runs: "
        "its pid and DSN. Starts nothing. Exits 0 if it runs, 3 if not.",
    )
    p_status.add_argument(
        "--dsn-only", action="store_true", help="print only the DSN (nothing if not running)"
    )
    p_status.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: running, pid, ready, persistent, users, data_dir, dsn",
    )
    p_status.set_defaults(func=cmd_server_status)


def cmd_server_start(args: argparse.Namespace) -> int:
    server = EmbeddedPostgres(args.data_dir, persistent=True)
    before = server.status()
    dsn = server.start()
    server.stop()  # this command no longer uses it; `persistent` keeps it running
    if args.dsn_only:
        print(display_dsn(dsn))
        return 0
    after = server.status()
    if before.running:
        print(f"already running  pid {after.pid} in {after.data_dir}; it now stays running")
    else:
        print(f"started          pid {after.pid} in {after.data_dir}")
    _print_dsn_lines(display_dsn(dsn))
    print(f"stop it with     slicejournal server stop{_data_dir_arg(args, after)}")
    return 0


def cmd_server_stop(args: argparse.Namespace) -> int:
    server = EmbeddedPostgres(args.data_dir)
    before = server.status()
    pid = server.shutdown()
    if pid is None:
        print(f"not running      no embedded PostgreSQL runs in {server.data_dir}; nothing to stop")
        return 0
    others = [user for user in before.users if user != pid]
    note = f" ({len(others)} other process(es) were using it: {others})" if others else ""
    print(f"stopped          pid {pid} in {server.data_dir}{note}")
    return 0


def cmd_server_status(args: argparse.Namespace) -> int:
    status = EmbeddedPostgres(args.data_dir).status()
    if args.json:
        print(json.dumps({
            "running": status.running,
            "pid": status.pid if status.running else None,
            "ready": bool(status.running and status.ready),
            "persistent": bool(status.running and status.persistent),
            "users": len(status.users) if status.running else 0,
            "data_dir": str(status.data_dir),
            "dsn": display_dsn(status.dsn) if status.running and status.dsn else None,
        }))  # fmt: skip
        return 0 if status.running else NOT_RUNNING
    if not status.running:
        where = "" if status.data_dir.exists() else " (the directory does not exist)"
        message = f"not running      no embedded PostgreSQL runs in {status.data_dir}{where}"
        print(message, file=sys.stderr if args.dsn_only else sys.stdout)
        return NOT_RUNNING
    dsn = display_dsn(status.dsn) if status.dsn else "(unknown: postmaster.pid names no socket)"
    if args.dsn_only:
        print(dsn)
        return 0
    state = "accepting connections" if status.ready else "not ready (starting or stopping)"
    if status.persistent:
        owner = "stays running until `slicejournal server stop`"
    else:
        owner = f"stops when its last user exits ({len(status.users)} running)"
    print(f"running          pid {status.pid}, {state}; {owner}")
    print(f"data dir         {status.data_dir}")
    _print_dsn_lines(dsn)
    return 0


def _print_dsn_lines(dsn: str) -> None:
    quoted = shlex.quote(dsn)
    print(f"dsn              {dsn}")
    print(f"connect with     psql {quoted}")
    print(f"use it with      export {DSN_ENV}={quoted}")


def _data_dir_arg(args: argparse.Namespace, status: ServerStatus) -> str:
    return f" --data-dir {shlex.quote(str(status.data_dir))}" if args.data_dir else ""

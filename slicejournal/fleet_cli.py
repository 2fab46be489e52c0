"""`slicejournal worker | scale | status | pause | resume | set-offset | clear-offset |
dead-letters`: running and operating a projection fleet from the command line.

`worker MODULE:ATTR` imports a factory `(journal, slice_range) -> Projection`
(or a `WorkerApp`: the factory and the serializers its journal needs) and
runs this process's share of its ranges until SIGTERM or SIGINT (then it
finishes its batches, saves offsets, releases its leases and exits 0). The
operators' commands work from any machine against a live fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.conninfo import make_conninfo

from journal import InvalidArgument, Journal, JournalSettings, SerializerRegistry, SliceRange
from journal.connection import parse_dsn
from journal.dsn import resolve_dsn
from projections.aio.fleet_control import FleetControl
from projections.aio.management import ProjectionManagement
from projections.backlog import Backlog
from projections.fleet.status import FleetStatus, LeaseStatus, orphan_message

_log = logging.getLogger("slicejournal.projections.fleet")

ORPHANED = 3  # the exit status of `status` when a range has had no owner for > 2 x TTL


def slice_range_argument(text: str) -> SliceRange:
    """`--range`: "0-255" -> SliceRange(0, 255); a usage error (exit 2) otherwise."""
    try:
        return SliceRange.parse(text)
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 timestamp with a time zone, got {text!r}"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"the timestamp needs a time zone (+00:00), got {text!r}")
    return value


def load_target(spec: str) -> Any:
    """Import `MODULE:ATTR` (the working directory is importable, as with `python -m`)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(
            f"expected MODULE:ATTR (e.g. myapp.read_models:balances), got {spec!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidArgument(f"cannot import {module_name!r}: {e}") from None
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(factory) and not hasattr(factory, "factory"):
        raise InvalidArgument(
            f"{spec} is neither a factory (journal, slice_range) -> Projection nor a WorkerApp"
        )
    return factory


def _journal_settings(args: argparse.Namespace) -> JournalSettings:
    return JournalSettings(schema=args.schema, pool_max_size=20)


async def _with_journal(
    args: argparse.Namespace,
    body: Callable[[Journal], Coroutine[Any, Any, int]],
    application_name: str = "slicejournal",
    serializers: SerializerRegistry | None = None,
) -> int:
    dsn = with_application_name(resolve_dsn(args.dsn), application_name)
    async with Journal.connect(dsn, _journal_settings(args), serializers=serializers) as journal:
        return await body(journal)


def with_application_name(dsn: str | None, name: str) -> str | None:
    """The DSN with `application_name` set (unless it sets one): `pg_stat_activity` then
    shows which connections are whose."""
    if dsn is None:
        return None
    params = parse_dsn(dsn)
    if "application_name" in params:
        return dsn
    return make_conninfo(dsn, application_name=name[:63])


# -- worker ------------------------------------------------------------------------------


def worker_argv(
    target: str, *, dsn: str, schema: str, worker_id: str, lease_ttl: float, **options: object
) -> list[str]:
    """The command that starts `slicejournal worker TARGET` with this Python (demo, tests
    and benchmarks start theirs this way); `options` are further flags (`instances=4` ->
    `--instances 4`)."""
    argv = [sys.executable, "-m", "slicejournal", "worker", target, "--dsn", dsn, "--schema"]
    argv += [schema, "--worker-id", worker_id, "--lease-ttl", repr(lease_ttl)]
    for flag, value in options.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    return argv


def cmd_worker(args: argparse.Namespace) -> int:
    from journal.telemetry import use_telemetry
    from projections.fleet.worker import FleetWorker, WorkerApp, WorkerSettings

    target = load_target(args.factory)
    app = target if isinstance(target, WorkerApp) else WorkerApp(target)
    settings = WorkerSettings(
        worker_id=args.worker_id or WorkerSettings().worker_id,
        instances=args.instances,
        lease_ttl=timedelta(seconds=args.lease_ttl),
    )

    async def body(journal: Journal) -> int:
        server = None
        if args.metrics_port is not None:
            from projections.fleet.metrics import serve_http
            from projections.telemetry_prometheus import PrometheusTelemetry

            # Installed before the worker exists: every instance its factory builds, and
            # every append of the handlers, reports to it.
            telemetry = PrometheusTelemetry()
            telemetry.watch_pools(journal.pool, journal.read_pool)
            use_telemetry(telemetry)
        worker = FleetWorker(journal, app.factory, settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        if args.metrics_port is not None:

            def live() -> str | None:
                """The worker's event loop still runs callbacks (within 5 s)."""
                probe = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop)
                try:
                    probe.result(timeout=5)
                except Exception:
                    probe.cancel()
                    return "the worker's event loop did not answer within 5 s"
                return None

            server = serve_http(args.metrics_port, args.metrics_addr, live=live, ready=worker.ready)
            print(f"metrics, health on http://{server.host}:{server.port}/metrics "
                  "/healthz /readyz", flush=True)  # fmt: skip
        print(f"worker {worker.me} runs projection {worker.name}; SIGTERM to stop", flush=True)
        try:
            await worker.run()
        finally:
            if server is not None:
                server.close()
            use_telemetry(None)
        return 0

    name = f"slicejournal worker {settings.worker_id}"
    return asyncio.run(_with_journal(args, body, name, app.serializers))


# -- operators ---------------------------------------------------------------------------


def cmd_scale(args: argparse.Namespace) -> int:
    async def body(journal: Journal) -> int:
        control = FleetControl(journal)
        changed = await control.scale(args.name, args.instances)
        print(f"projection {args.name}: {args.instances} instances"
              f"{'' if changed else ' (unchanged)'}", flush=True)  # fmt: skip
        if args.no_wait:
            return 0
        last: list[str] = []

        def progress(status: FleetStatus) -> None:
            line = _progress_line(status)
            if line != (last[-1] if last else None):
                last.append(line)
                print(line, flush=True)

        await control.wait_converged(args.name, timeout=args.timeout, progress=progress)
        print(f"projection {args.name}: converged on {args.instances} ranges", flush=True)
        return 0

    return asyncio.run(_with_journal(args, body))


def _progress_line(status: FleetStatus) -> str:
    running = sum(1 for r in status.ranges if r.running)
    old = f", {len(status.leftovers)} old range(s) still held" if status.leftovers else ""
    return (f"  {running}/{len(status.ranges)} ranges running on {len(status.workers)} "
            f"worker(s){old}")  # fmt: skip


def aligned(rows: Sequence[tuple[str, ...]], indent: str = "") -> list[str]:
    """Rows as left-aligned columns (the fleet tables of `status` and the demo)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def owner_cell(r: LeaseStatus, none: str = "(none)") -> str:
    """Who runs a range, and whether its instance is still starting."""
    if r.owner is None:
        return none
    return r.owner if r.running else f"{r.owner} (starting)"


def backlog_cells(backlog: Backlog | None) -> tuple[str, str]:
    """The backlog's age and size as `status` shows them ("-": not known)."""
    if backlog is None:
        return "-", "-"
    return f"{backlog.age_seconds:.1f}s", f"{backlog.size}{'+' if backlog.capped else ''}"


def format_status(status: FleetStatus) -> str:
    head = ("range", "owner", "epoch", "backlog_age", "backlog", "paused", "resume_from",
            "restarts", "last_error")  # fmt: skip
    rows: list[tuple[str, ...]] = [head]
    for r in status.ranges:
        age, size = backlog_cells(r.backlog)
        resume = "-" if r.resume_from is None else r.resume_from.isoformat(timespec="milliseconds")
        owner = owner_cell(r, f"(none for {r.unowned_for:.0f}s)")
        # Whole (the last column, it widens no other), on one line: a handler's failure
        # reads "ProjectionError: projection NAME RANGE failed on PID seq_nr N ...: CAUSE".
        error = " ".join((r.last_error or "-").split())
        rows.append((str(r.slice_range), owner, str(r.epoch or "-"), age, size,
                     "yes" if r.paused else "no", resume, str(r.restarts), error))  # fmt: skip
    lines = [
        f"projection {status.name} (entity type {status.entity_type}): {status.instances} "
        f"ranges, {len(status.workers)} live worker(s), lease TTL {status.lease_ttl:g}s"
    ]
    lines += aligned(rows)
    if status.leftovers:
        lines.append("old ranges still held: " + ", ".join(map(str, status.leftovers)))
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    async def body(journal: Journal) -> int:
        status = await FleetControl(journal).status(args.name)
        print(format_status(status))
        problem = orphan_message(status)
        if problem is not None:
            print(f"slicejournal: {problem}", file=sys.stderr)
            return ORPHANED
        return 0

    return asyncio.run(_with_journal(args, body))


def _management_command(
    action: Callable[[Journal, argparse.Namespace], Coroutine[Any, Any, str]],
) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        async def body(journal: Journal) -> int:
            await ProjectionManagement(journal).require_known(args.name)
            print(await action(journal, args))
            return 0

        return asyncio.run(_with_journal(args, body))

    return command


def _scope(args: argparse.Namespace) -> str:
    return "all ranges" if args.range is None else f"range {args.range}"


async def _pause(journal: Journal, args: argparse.Namespace) -> str:
    await ProjectionManagement(journal).pause(args.name, args.range)
    return f"projection {args.name}: paused ({_scope(args)})"


async def _resume(journal: Journal, args: argparse.Namespace) -> str:
    await ProjectionManagement(journal).resume(args.name, args.range)
    return f"projection {args.name}: resumed ({_scope(args)})"


async def _set_offset(journal: Journal, args: argparse.Namespace) -> str:
    await FleetControl(journal).set_offset(args.name, args.timestamp, args.range or SliceRange.FULL)
    return (f"projection {args.name}: resumes at {args.timestamp.isoformat()} "
            f"({_scope(args)}); running instances restart from there")  # fmt: skip


async def _clear_offset(journal: Journal, args: argparse.Namespace) -> str:
    await FleetControl(journal).clear_offset(args.name, args.range or SliceRange.FULL)
    return (f"projection {args.name}: offsets cleared ({_scope(args)}); "
            "it restarts from the beginning of the journal")  # fmt: skip


async def _dead_letters(journal: Journal, args: argparse.Namespace) -> str:
    letters = await ProjectionManagement(journal).dead_letters(args.name)
    if not letters:
        return f"projection {args.name}: no dead letters"
    return "\n".join(
        f"{d.failed_at.isoformat(timespec='seconds')}  {d.persistence_id}  seq_nr {d.seq_nr}  "
        f"slice {d.slice}  {d.error}"
        for d in letters
    )


def add_fleet_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    dsn: argparse.ArgumentParser,
    bounded_int: Callable[[int, int], Callable[[str], int]],
) -> None:
    """Register the worker and the operators' commands."""
    common = argparse.ArgumentParser(add_help=False, parents=[dsn])
    common.add_argument("--schema", default="public", help="schema name (default: public)")

    p = sub.add_parser(
        "worker",
        parents=[common],
        help="run this process's share of a projection's slice ranges",
        description="Imports MODULE:ATTR, a factory (journal, slice_range) -> Projection, and "
        "runs the ranges this worker leases, sharing them with every other worker of the same "
        "projection through PostgreSQL. SIGTERM/SIGINT: finish batches, save offsets, release "
        "leases, exit 0.",
    )
    p.add_argument("factory", metavar="MODULE:ATTR")
    p.add_argument("--instances", type=int, default=4,
                   help="instance count used when none is stored yet (default 4)")  # fmt: skip
    p.add_argument("--worker-id", default=None, help="this worker's id (default host:pid)")
    p.add_argument("--lease-ttl", type=float, default=10.0,
                   help="seconds a lease lasts without renewal (default 10)")  # fmt: skip
    p.add_argument("--metrics-port", type=bounded_int(0, 65535), default=None,
                   help="serve /metrics, /healthz and /readyz on this port")  # fmt: skip
    p.add_argument("--metrics-addr", default="127.0.0.1",
                   help="the address the metrics port binds (default 127.0.0.1, this host "
                   "only; 0.0.0.0 for every interface)")  # fmt: skip
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser(
        "scale",
        parents=[common],
        help="rescale a running fleet",
        description="Stores the desired instance count (a divisor of 1024) and waits until "
        "every range of the new split is owned and running.",
    )
    p.add_argument("name")
    p.add_argument("instances", type=int)
    p.add_argument("--no-wait", action="store_true", help="return at once")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for convergence (default 120)")  # fmt: skip
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("status", parents=[common], help="ranges, owners, epochs, backlog",
                       description="One line per range of the current split. Exits 3 if a "
                       "range has had no owner for longer than twice the lease TTL.")  # fmt: skip
    p.add_argument("name")
    p.set_defaults(func=cmd_status)

    ranged = argparse.ArgumentParser(add_help=False, parents=[common])
    ranged.add_argument("name")
    ranged.add_argument("--range", type=slice_range_argument, default=None,
                        help="only this slice range, e.g. 0-255 (default: all)")  # fmt: skip
    for name, action, text in (
        ("pause", _pause, "pause a projection (or one slice range) on every worker"),
        ("resume", _resume, "resume what pause paused"),
        ("clear-offset", _clear_offset, "restart a projection from the beginning"),
    ):
        p = sub.add_parser(name, parents=[ranged], help=text)
        p.set_defaults(func=_management_command(action))
    p = sub.add_parser("set-offset", parents=[ranged], help="resume a projection at a timestamp")
    p.add_argument("timestamp", type=parse_timestamp, help="ISO 8601 with time zone")
    p.set_defaults(func=_management_command(_set_offset))
    p = sub.add_parser("dead-letters", parents=[common], help="events a projection skipped")
    p.add_argument("name")
    p.set_defaults(func=_management_command(_dead_letters))

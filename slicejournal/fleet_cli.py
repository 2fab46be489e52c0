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
import inspect
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
from psycopg import sql
from psycopg.conninfo import make_conninfo

from journal import InvalidArgument, Journal, JournalSettings, SerializerRegistry, SliceRange
from journal.connection import parse_dsn
from journal.dsn import resolve_dsn
from journal.errors import JournalError
from journal.filter import EventFilter
from journal.query.sql import filter_condition
from projections.aio.fleet_control import FleetControl
from projections.aio.management import ProjectionManagement
from projections.backlog import Backlog
from projections.fleet.status import FleetStatus, LeaseStatus, NoFleet, orphan_message
from projections.management_sql import filter_from_json

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
    except Exception as e:  # not only ImportError: the module's own code may fail
        raise InvalidArgument(f"cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(factory) and not hasattr(factory, "factory"):
        raise InvalidArgument(
            f"{spec} is neither a factory (journal, slice_range) -> Projection nor a WorkerApp"
        )
    check_factory_signature(spec, getattr(factory, "factory", factory))
    return factory


def check_factory_signature(spec: str, factory: Callable[..., Any]) -> None:
    """`InvalidArgument` unless `factory` can be called as `factory(journal, slice_range)`."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin or C callable: its call will tell
    try:
        signature.bind(None, None)
    except TypeError:
        raise InvalidArgument(
            f"{spec} must take (journal, slice_range) and return a Projection; "
            f"its signature is {signature}"
        ) from None


def positive_float(text: str) -> float:
    """An argparse type for seconds and other quantities: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


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

            try:
                server = serve_http(
                    args.metrics_port, args.metrics_addr, live=live, ready=worker.ready
                )
            except OSError as e:  # the port is taken, the address is not this host's, ...
                raise JournalError(
                    f"cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: "
                    f"{e.strerror or e}"
                ) from None
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


def filter_cell(event_filter: EventFilter | None) -> str:
    """A projection's filter as `status` prints it ("-": none)."""
    if event_filter is None:
        return "-"
    parts = []
    if event_filter.manifests:
        parts.append("manifests=" + ",".join(event_filter.manifests))
    if event_filter.tags:
        parts.append("tags=" + ",".join(event_filter.tags))
    if event_filter.where is not None:
        parts.append(f"where={event_filter.where}")
    return " ".join(parts)


def filter_document(event_filter: EventFilter | None) -> dict[str, Any] | None:
    """A projection's filter in `status --json` (null: none)."""
    if event_filter is None:
        return None
    return {
        "manifests": list(event_filter.manifests),
        "tags": list(event_filter.tags),
        "where": event_filter.where,
    }


def format_status(
    status: FleetStatus,
    rates: Mapping[SliceRange, float | None] | None = None,
    *,
    event_filter: EventFilter | None = None,
) -> str:
    """The table `status` prints; with `rates` (`--watch`), an events/s column too;
    `event_filter`: the one the projection's instances recorded (the backlog counts
    only the events it lets through)."""
    head = ["range", "owner", "epoch", "backlog_age", "backlog", "paused", "resume_from",
            "restarts", "last_error"]  # fmt: skip
    if rates is not None:
        head.insert(5, "events/s")
    rows: list[tuple[str, ...]] = [tuple(head)]
    for r in status.ranges:
        age, size = backlog_cells(r.backlog)
        resume = "-" if r.resume_from is None else r.resume_from.isoformat(timespec="milliseconds")
        owner = owner_cell(r, f"(none for {r.unowned_for:.0f}s)")
        # Whole (the last column, it widens no other), on one line: a handler's failure
        # reads "ProjectionError: projection NAME RANGE failed on PID seq_nr N ...: CAUSE".
        error = " ".join((r.last_error or "-").split())
        row = [str(r.slice_range), owner, str(r.epoch or "-"), age, size,
               "yes" if r.paused else "no", resume, str(r.restarts), error]  # fmt: skip
        if rates is not None:
            rate = rates.get(r.slice_range)
            row.insert(5, "-" if rate is None else f"{rate:.1f}")
        rows.append(tuple(row))
    lines = [
        f"projection {status.name} (entity type {status.entity_type}): {status.instances} "
        f"ranges, {len(status.workers)} live worker(s), lease TTL {status.lease_ttl:g}s"
    ]
    if event_filter is not None:
        lines.append(f"filter: {filter_cell(event_filter)}")
    lines += aligned(rows)
    if status.leftovers:
        lines.append("old ranges still held: " + ", ".join(map(str, status.leftovers)))
    return "\n".join(lines)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def status_document(
    status: FleetStatus,
    rates: Mapping[SliceRange, float | None] | None = None,
    *,
    event_filter: EventFilter | None = None,
) -> dict[str, Any]:
    """`status --json`: the fleet as one JSON object (seconds as numbers, times ISO 8601,
    null where not known); with `rates` (`--watch`), each range's events_per_second;
    `filter`: the projection's (null: none)."""
    ranges = []
    for r in status.ranges:
        b = r.backlog
        entry: dict[str, Any] = {
            "range": r.slice_range.key,
            "min_slice": r.slice_range.min_slice,
            "max_slice": r.slice_range.max_slice,
            "owner": r.owner,
            "running": r.running,
            "epoch": r.epoch,
            "unowned_for_seconds": r.unowned_for,
            "backlog_age_seconds": None if b is None else b.age_seconds,
            "backlog_events": None if b is None else b.size,
            "backlog_capped": None if b is None else b.capped,
            "oldest_unhandled": None if b is None else _iso(b.oldest_unhandled),
            "paused": r.paused,
            "resume_from": _iso(r.resume_from),
            "restarts": r.restarts,
            "last_error": r.last_error,
        }
        if rates is not None:
            entry["events_per_second"] = rates.get(r.slice_range)
        ranges.append(entry)
    return {
        "projection": status.name,
        "entity_type": status.entity_type,
        "instances": status.instances,
        "lease_ttl_seconds": status.lease_ttl,
        "filter": filter_document(event_filter),
        "workers": list(status.workers),
        "converged": status.converged,
        "orphaned": [r.slice_range.key for r in status.orphaned],
        "leftovers": [r.key for r in status.leftovers],
        "ranges": ranges,
    }


def events_per_second(before: Backlog, after: Backlog, appended: int) -> float | None:
    """A range's throughput between two backlog readings: what waited before, plus what
    was appended between them, less what waits now, over the time between them. None
    when it cannot be told (a capped count, a reading without its time)."""
    if before.capped or after.capped or before.measured_at is None or after.measured_at is None:
        return None
    seconds = (after.measured_at - before.measured_at).total_seconds()
    if seconds <= 0:
        return None
    return max(0, before.size + appended - after.size) / seconds


async def _appended_between(
    journal: Journal,
    entity_type: str,
    r: SliceRange,
    since: datetime,
    until: datetime,
    event_filter: EventFilter | None = None,
) -> int:
    """Events of the range stored with since < db_timestamp <= until (index probes per
    slice, as the backlog's reading); with `event_filter`, those it lets through."""
    condition: sql.Composable = sql.SQL("")
    filter_params: dict[str, Any] = {}
    if event_filter is not None:
        matched, filter_params = filter_condition(event_filter)
        condition = sql.SQL(" AND ") + matched
    query = sql.SQL(
        "SELECT count(*) FROM generate_series(%(lo)s::int, %(hi)s::int) AS s(slice), "
        "LATERAL (SELECT 1 FROM {j} WHERE slice = s.slice AND entity_type = %(et)s "
        "AND db_timestamp > %(since)s AND db_timestamp <= %(until)s AND NOT deleted{c}) AS e"
    ).format(j=journal.tables.journal, c=condition)
    params = {"lo": r.min_slice, "hi": r.max_slice, "et": entity_type, "since": since,
              "until": until, **filter_params}  # fmt: skip
    async with journal.pool.connection() as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _rates(
    journal: Journal,
    before: FleetStatus,
    after: FleetStatus,
    event_filter: EventFilter | None = None,
) -> dict[SliceRange, float | None]:
    """events/s per range of `after` since `before` (None for a range new since then)."""
    earlier = {r.slice_range: r.backlog for r in before.ranges}
    rates: dict[SliceRange, float | None] = {}
    for r in after.ranges:
        b0, b1 = earlier.get(r.slice_range), r.backlog
        if b0 is None or b1 is None or b0.measured_at is None or b1.measured_at is None:
            rates[r.slice_range] = None
            continue
        appended = await _appended_between(
            journal, after.entity_type, r.slice_range, b0.measured_at, b1.measured_at,
            event_filter,
        )  # fmt: skip
        rates[r.slice_range] = events_per_second(b0, b1, appended)
    return rates


def _show(
    status: FleetStatus,
    args: argparse.Namespace,
    rates: Any = None,
    event_filter: EventFilter | None = None,
) -> None:
    if args.json:
        print(json.dumps(status_document(status, rates, event_filter=event_filter)), flush=True)
        return
    if args.watch and sys.stdout.isatty():
        print("\x1b[H\x1b[2J", end="")  # a refreshing screen, as top's
    print(format_status(status, rates, event_filter=event_filter), flush=True)
    if args.watch:
        print(flush=True)


# Every projection name the tables know (a fleet's, an in-process one's, a registered
# or retired one's), with what `status` shows of each.
_OVERVIEW = """
WITH names AS (
  SELECT projection_name FROM {o} UNION SELECT projection_name FROM {m}
  UNION SELECT projection_name FROM {d} UNION SELECT projection_name FROM {f}
  UNION SELECT projection_name FROM {r})
SELECT n.projection_name, f.instances, coalesce(f.entity_type, g.entity_type),
  (SELECT count(*) FROM {w} AS w WHERE w.projection_name = n.projection_name
     AND w.expires_at > now()),
  (SELECT array_agg(m.projection_key ORDER BY m.projection_key) FROM {m} AS m
     WHERE m.projection_name = n.projection_name AND m.paused),
  (SELECT max(timestamp_offset) FROM {o} AS o WHERE o.projection_name = n.projection_name),
  (SELECT count(*) FROM {d} AS d WHERE d.projection_name = n.projection_name),
  coalesce(g.retired, false),
  (SELECT array_agg(DISTINCT split_part(o.persistence_id, '|', 1)) FROM {o} AS o
     WHERE o.projection_name = n.projection_name AND o.persistence_id <> %(progress_pid)s),
  (SELECT m.event_filter FROM {m} AS m
     WHERE m.projection_name = n.projection_name AND m.projection_key = '*')
FROM names AS n
LEFT JOIN {f} AS f USING (projection_name)
LEFT JOIN {r} AS g USING (projection_name)
{where}
ORDER BY 1"""


@attrs.frozen
class Overview:
    """One projection as `status` lists it."""

    name: str
    instances: int | None  # None: no fleet (it runs in-process)
    entity_type: str | None  # the fleet's or the registry's; None if neither knows
    seen_entity_types: tuple[str, ...]  # those of the ids in its offset rows
    live_workers: int
    paused: tuple[str, ...]  # "*" (all ranges) or "min-max"
    latest_offset: datetime | None
    dead_letters: int
    retired: bool
    event_filter: EventFilter | None = None  # the one its instances recorded

    @property
    def kind(self) -> str:
        """ "fleet" (run by `slicejournal worker`) or "in-process"."""
        return "in-process" if self.instances is None else "fleet"

    @property
    def known_entity_type(self) -> str | None:
        """The entity type, or the only one its offsets show; None if not one."""
        if self.entity_type is not None:
            return self.entity_type
        return self.seen_entity_types[0] if len(self.seen_entity_types) == 1 else None


async def overview(journal: Journal, name: str | None = None) -> list[Overview]:
    """Every projection the tables know (or only `name`), fleets and in-process alike."""
    from projections.offset_store import PROGRESS_PID
    from projections.tables import projection_tables

    t = projection_tables(journal.tables, None)
    where = sql.SQL("WHERE n.projection_name = %(name)s" if name is not None else "")
    query = sql.SQL(_OVERVIEW).format(
        o=t.offset_store, m=t.management, d=t.dead_letter, f=t.fleet, r=t.registry,
        w=t.fleet_worker, where=where,
    )  # fmt: skip
    async with journal.pool.connection() as conn:
        cur = await conn.execute(query, {"progress_pid": PROGRESS_PID, "name": name})
        rows = await cur.fetchall()
    return [
        Overview(
            n,
            inst,
            et,
            tuple(sorted(seen or ())),
            int(workers),
            tuple(paused or ()),
            latest,
            int(dead),
            bool(retired),
            filter_from_json(event_filter),
        )
        for n, inst, et, workers, paused, latest, dead, retired, seen, event_filter in rows
    ]


def _entity_cell(o: Overview) -> str:
    if o.entity_type is not None:
        return o.entity_type
    return ",".join(o.seen_entity_types) + " (seen)" if o.seen_entity_types else "?"


def _paused_cell(o: Overview) -> str:
    if not o.paused:
        return "no"
    return "yes" if ALL_PAUSED in o.paused else "ranges " + ",".join(o.paused)


ALL_PAUSED = "*"


def format_overview(rows: Sequence[Overview]) -> str:
    """The table `status` prints without a name."""
    if not rows:
        return "no projections: none has stored an offset, been paused, registered or run"
    table: list[tuple[str, ...]] = [
        ("name", "kind", "entity_type", "instances", "workers", "latest_offset", "paused",
         "dead_letters", "filter")
    ]  # fmt: skip
    for o in rows:
        kind = o.kind + (" (retired)" if o.retired else "")
        latest = (
            "-" if o.latest_offset is None else o.latest_offset.isoformat(timespec="milliseconds")
        )
        instances = "-" if o.instances is None else str(o.instances)
        table.append((o.name, kind, _entity_cell(o), instances, str(o.live_workers), latest,
                      _paused_cell(o), str(o.dead_letters),
                      filter_cell(o.event_filter)))  # fmt: skip
    return "\n".join(aligned(table))


def overview_document(o: Overview) -> dict[str, Any]:
    """One projection of `status --json` without a name."""
    return {
        "projection": o.name,
        "kind": o.kind,
        "entity_type": o.entity_type,
        "seen_entity_types": list(o.seen_entity_types),
        "instances": o.instances,
        "live_workers": o.live_workers,
        "paused": list(o.paused),
        "latest_offset": _iso(o.latest_offset),
        "dead_letters": o.dead_letters,
        "retired": o.retired,
        "filter": filter_document(o.event_filter),
    }


async def in_process_status(journal: Journal, o: Overview) -> dict[str, Any]:
    """`status NAME --json` of a projection with no fleet: what the tables know of it
    (the backlog too, when its entity type is known)."""
    doc = overview_document(o)
    doc.update(resume_from=None, journal_head=None, backlog_age_seconds=None,
               backlog_events=None, backlog_capped=None)  # fmt: skip
    entity_type = o.known_entity_type
    if entity_type is not None:
        (r,) = await ProjectionManagement(journal).status(o.name, entity_type, 1)
        b = r.backlog
        doc.update(
            resume_from=_iso(r.resume_from),
            journal_head=_iso(r.journal_head),
            backlog_age_seconds=None if b is None else b.age_seconds,
            backlog_events=None if b is None else b.size,
            backlog_capped=None if b is None else b.capped,
        )
    return doc


def format_in_process(doc: Mapping[str, Any]) -> str:
    """`status NAME` of a projection with no fleet."""
    entity = doc["entity_type"] or (
        ",".join(doc["seen_entity_types"]) + " (seen)" if doc["seen_entity_types"] else "unknown"
    )
    paused = doc["paused"]
    lines = [
        f"projection {doc['projection']} (entity type {entity}): in-process, no fleet worker "
        "registered it" + (" (retired)" if doc["retired"] else ""),
        f"  latest offset: {doc['latest_offset'] or '-'}",
        f"  resumes from:  {doc['resume_from'] or '-'}",
    ]
    if doc["backlog_events"] is not None:
        capped = "+" if doc["backlog_capped"] else ""
        lines.append(f"  backlog:       {doc['backlog_events']}{capped} event(s), the oldest "
                     f"waiting {doc['backlog_age_seconds']:.1f}s")  # fmt: skip
    else:
        lines.append("  backlog:       - (entity type not known)")
    shown = (
        "no" if not paused else ("yes" if ALL_PAUSED in paused else "ranges " + ",".join(paused))
    )
    lines.append(f"  paused:        {shown}")
    lines.append(f"  filter:        {_filter_line(doc['filter'])}")
    letters = doc["dead_letters"]
    tail = f" (slicejournal dead-letters {doc['projection']})" if letters else ""
    lines.append(f"  dead letters:  {letters}{tail}")
    return "\n".join(lines)


def _filter_line(document: Mapping[str, Any] | None) -> str:
    if document is None:
        return "-"
    return filter_cell(filter_from_json(document))


def cmd_status(args: argparse.Namespace) -> int:
    if args.name is None:
        return cmd_status_all(args)

    async def body(journal: Journal) -> int:
        control = FleetControl(journal)
        try:
            status = await control.status(args.name)
        except NoFleet:
            (o,) = await overview(journal, args.name)
            doc = await in_process_status(journal, o)
            print(json.dumps(doc) if args.json else format_in_process(doc), flush=True)
            return 0
        event_filter = await ProjectionManagement(journal).event_filter(args.name)
        _show(status, args, {} if args.watch else None, event_filter)
        refreshes = 1
        while args.watch and (args.count is None or refreshes < args.count):
            await asyncio.sleep(args.interval)
            previous, status = status, await control.status(args.name)
            _show(status, args, await _rates(journal, previous, status, event_filter), event_filter)
            refreshes += 1
        problem = orphan_message(status)
        if problem is not None:
            print(f"slicejournal: {problem}", file=sys.stderr)
            return ORPHANED
        return 0

    try:
        return asyncio.run(_with_journal(args, body))
    except KeyboardInterrupt:  # Ctrl-C ends --watch: that is how it is meant to stop
        return 0


def cmd_status_all(args: argparse.Namespace) -> int:
    """`status` without a name: every projection, fleets and in-process ones."""
    if args.watch:
        raise InvalidArgument("status --watch needs a projection NAME")

    async def body(journal: Journal) -> int:
        rows = await overview(journal)
        if args.json:
            print(json.dumps([overview_document(o) for o in rows]), flush=True)
        else:
            print(format_overview(rows), flush=True)
        return 0

    return asyncio.run(_with_journal(args, body))


def _management_command(
    action: Callable[[Journal, argparse.Namespace], Coroutine[Any, Any, str]],
) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        prepare = getattr(args, "prepare", None)
        if prepare is not None:
            prepare(args)  # reads the positional words; `InvalidArgument` before connecting

        async def body(journal: Journal) -> int:
            await ProjectionManagement(journal).require_known(args.name)
            result = await action(journal, args)
            if getattr(args, "json", False) and args.command != "dead-letters":
                document: dict[str, Any] = {
                    "projection": args.name,
                    "command": args.command,
                    "range": None if args.range is None else args.range.key,
                    "dry_run": getattr(args, "dry_run", False),
                    "message": result,
                }
                if args.command == "set-offset":
                    document["timestamp"] = args.timestamp.isoformat()
                if args.command == "clear-offset":
                    document["offset_rows"] = args.offset_rows
                result = json.dumps(document)
            print(result, flush=True)
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


async def _offset_rows(journal: Journal, name: str, r: SliceRange) -> int:
    from projections.tables import projection_tables

    t = projection_tables(journal.tables, None)
    query = sql.SQL(
        "SELECT count(*) FROM {o} WHERE projection_name = %s AND slice BETWEEN %s AND %s"
    ).format(o=t.offset_store)
    async with journal.pool.connection() as conn:
        cur = await conn.execute(query, (name, r.min_slice, r.max_slice))
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _clear_offset(journal: Journal, args: argparse.Namespace) -> str:
    args.offset_rows = await _offset_rows(journal, args.name, args.range or SliceRange.FULL)
    if args.dry_run:
        return (f"projection {args.name}: would clear {args.offset_rows} offset row(s) "
                f"({_scope(args)}); nothing changed (dry run)")  # fmt: skip
    await FleetControl(journal).clear_offset(args.name, args.range or SliceRange.FULL)
    return (f"projection {args.name}: offsets cleared ({_scope(args)}); "
            "it restarts from the beginning of the journal")  # fmt: skip


async def _dead_letters(journal: Journal, args: argparse.Namespace) -> str:
    if args.replay:
        return await _replay_dead_letters(journal, args)
    letters = await ProjectionManagement(journal).dead_letters(args.name)
    if args.json:
        return json.dumps(
            [
                {"persistence_id": d.persistence_id, "seq_nr": d.seq_nr, "slice": d.slice,
                 "db_timestamp": d.db_timestamp.isoformat(), "error": d.error,
                 "failed_at": d.failed_at.isoformat(), "status": d.status,
                 "replayed_at": d.replayed_at and d.replayed_at.isoformat(),
                 "replay_failures": d.replay_failures}
                for d in letters
            ]
        )  # fmt: skip
    if not letters:
        return f"projection {args.name}: no dead letters"
    return "\n".join(
        f"{d.failed_at.isoformat(timespec='seconds')}  {d.persistence_id}  seq_nr {d.seq_nr}  "
        f"slice {d.slice}  {d.status}  {d.error}"
        for d in letters
    )


async def _replay_dead_letters(journal: Journal, args: argparse.Namespace) -> str:
    asked = await ProjectionManagement(journal).replay_dead_letters(args.name, args.letters)
    if args.json:
        return json.dumps(
            {"projection": args.name, "command": "dead-letters replay",
             "requested": [{"persistence_id": p, "seq_nr": n} for p, n in asked]}
        )  # fmt: skip
    if not asked:
        return f"projection {args.name}: no dead letter to replay (none parked, or replayed)"
    return (f"projection {args.name}: replay requested for {len(asked)} letter(s); the "
            "running instances that own their slices replay them within their management "
            "poll interval (`dead-letters NAME` shows each letter's status)")  # fmt: skip


def _dead_letter_words(args: argparse.Namespace) -> None:
    """`dead-letters NAME` or `dead-letters replay NAME (--all | PID:SEQ_NR ...)`."""
    words: list[str] = args.words
    args.replay = len(words) > 1 and words[0] == "replay"
    if not args.replay:
        if len(words) != 1:
            raise InvalidArgument(
                "usage: dead-letters NAME, or dead-letters replay NAME (--all | PID:SEQ_NR ...)"
            )
        args.name, args.letters = words[0], None
        return
    args.name, ids = words[1], words[2:]
    if bool(ids) == args.all:
        raise InvalidArgument("dead-letters replay: give --all or the letters (PID:SEQ_NR ...)")
    letters = []
    for text in ids:
        pid, _, seq = text.rpartition(":")
        if not pid or not seq.isdigit():
            raise InvalidArgument(f"dead-letters replay: {text!r} is not PID:SEQ_NR")
        letters.append((pid, int(seq)))
    args.letters = None if args.all else letters


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
    p.add_argument("factory", metavar="MODULE:ATTR",
                   help="(journal, slice_range) -> Projection, or a WorkerApp")  # fmt: skip
    p.add_argument("--instances", type=bounded_int(1, 1024), default=4,
                   help="instance count used when none is stored yet (default 4)")  # fmt: skip
    p.add_argument("--worker-id", default=None, help="this worker's id (default host:pid)")
    p.add_argument("--lease-ttl", type=positive_float, default=10.0,
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
    p.add_argument("name", help="the projection's name")
    p.add_argument("instances", type=bounded_int(1, 1024),
                   help="the new instance count (a divisor of 1024)")  # fmt: skip
    p.add_argument("--no-wait", action="store_true", help="return at once")
    p.add_argument("--timeout", type=positive_float, default=120.0,
                   help="seconds to wait for convergence (default 120)")  # fmt: skip
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("status", parents=[common],
                       help="every projection; or one: ranges, owners, epochs, backlog",
                       description="Without NAME: one line per projection the schema knows "
                       "(fleets and in-process ones: kind, entity type, latest offset, paused, "
                       "dead letters). With NAME: one line per range of a fleet's current "
                       "split (exits 3 if a range has had no owner for longer than twice the "
                       "lease TTL), or, for a projection that runs in-process, its offsets, "
                       "backlog, pauses and dead letters.")  # fmt: skip
    p.add_argument("name", nargs="?", default=None,
                   help="the projection's name (default: list every projection)")  # fmt: skip
    p.add_argument("--json", action="store_true",
                   help="one JSON object (with --watch: one per refresh, a line each)")  # fmt: skip
    p.add_argument("--watch", action="store_true",
                   help="refresh until Ctrl-C, with each range's events/s since the last "
                   "refresh")  # fmt: skip
    p.add_argument("--interval", type=positive_float, default=2.0,
                   help="seconds between --watch refreshes (default 2)")  # fmt: skip
    p.add_argument("--count", type=bounded_int(1, 1_000_000), default=None,
                   help="with --watch: stop after this many refreshes")  # fmt: skip
    p.set_defaults(func=cmd_status)

    ranged = argparse.ArgumentParser(add_help=False, parents=[common])
    ranged.add_argument("name", help="the projection's name")
    ranged.add_argument("--range", type=slice_range_argument, default=None,
                        help="only this slice range, e.g. 0-255 (default: all)")  # fmt: skip
    ranged.add_argument("--json", action="store_true",
                        help="one JSON object: projection, command, range, message")  # fmt: skip
    for name, action, text in (
        ("pause", _pause, "pause a projection (or one slice range) on every worker"),
        ("resume", _resume, "resume what pause paused"),
        ("clear-offset", _clear_offset, "restart a projection from the beginning"),
    ):
        p = sub.add_parser(name, parents=[ranged], help=text, description=text[0].upper()
                           + text[1:] + "; running instances notice within their poll "
                           "interval.")  # fmt: skip
        if name == "clear-offset":
            p.add_argument("--dry-run", action="store_true",
                           help="count the offset rows it would clear, change nothing")  # fmt: skip
        p.set_defaults(func=_management_command(action))
    p = sub.add_parser("set-offset", parents=[ranged], help="resume a projection at a timestamp",
                       description="Makes the projection resume at TIMESTAMP (events before "
                       "it are skipped); a fleet's instances restart from there.")  # fmt: skip
    p.add_argument("timestamp", type=parse_timestamp, help="ISO 8601 with time zone")
    p.set_defaults(func=_management_command(_set_offset))
    p = sub.add_parser("dead-letters", parents=[common], help="events a projection skipped",
                       usage="%(prog)s [options] NAME | replay NAME (--all | PID:SEQ_NR ...)",
                       description="The envelopes a projection skipped after its retries ran "
                       "out, with their errors and replay status. `dead-letters replay NAME` "
                       "asks the running instances to hand the letters (every parked one "
                       "with --all, or the ones named PID:SEQ_NR) to the handler again; a "
                       "replay that fails stays parked with the new error.")  # fmt: skip
    p.add_argument("words", nargs="+", metavar="NAME",
                   help="the projection's name, or `replay NAME [PID:SEQ_NR ...]`")  # fmt: skip
    p.add_argument("--all", action="store_true", help="replay: every letter not replayed yet")
    p.add_argument("--json", action="store_true",
                   help="the dead letters as a JSON array (replay: those requested)")  # fmt: skip
    p.set_defaults(func=_management_command(_dead_letters), prepare=_dead_letter_words)

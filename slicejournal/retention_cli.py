"""`slicejournal retention apply` and `slicejournal projections list | register | retire`:
deleting old events without taking one from a projection that has not consumed it,
and managing the projections that hold retention back.

Every argument is checked by argparse before a connection is opened (a bad
`--keep` is a usage error, exit 2, and nothing is written); the work itself is
`Retention`'s (`projections/aio/retention.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from psycopg import sql

from journal import InvalidArgument, Journal
from journal.errors import InvalidPersistenceId
from journal.slices import NUMBER_OF_SLICES, validate_entity_type
from projections.aio.retention import Retention
from projections.retention import (
    Holder,
    ProjectionInfo,
    RetentionPolicy,
    RetentionProgress,
    RetentionReport,
    RetentionSettings,
    parse_duration,
)
from slicejournal.fleet_cli import _with_journal, aligned, slice_range_argument


def duration_argument(text: str) -> Any:
    """`--keep`: 500ms, 30s, 15m, 12h, 7d; a usage error (exit 2) otherwise."""
    try:
        return parse_duration(text)
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def entity_type_argument(text: str) -> str:
    """`--entity-type`: what a persistence id's part before "|" can be."""
    try:
        return validate_entity_type(text)
    except InvalidPersistenceId as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def ranges_argument(text: str) -> int:
    """`--ranges`: how many slice ranges the report has (a divisor of 1024)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= value <= NUMBER_OF_SLICES or NUMBER_OF_SLICES % value:
        raise argparse.ArgumentTypeError(f"must divide {NUMBER_OF_SLICES}, got {value}")
    return value


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="milliseconds")


def _holder(h: Holder) -> str:
    where = "no offset yet" if h.latest is None else f"offset {_time(h.latest)}"
    return f"{h.projection} ({where}{', paused' if h.paused else ''})"


def format_report(report: RetentionReport) -> str:
    """What `retention apply` prints: per slice range, the events gone (or that would
    go) and the projections holding the rest back, at their earliest offset there."""
    verb = "would go" if report.dry_run else "deleted"
    lines = [report.policy.describe() + (" (dry run: nothing deleted)" if report.dry_run else "")]
    rows: list[tuple[str, ...]] = [("range", f"events {verb}", "held back", "held back by")]
    for r in report.ranges:
        holders = ", ".join(_holder(h) for h in r.held_by) or "-"
        rows.append((str(r.slice_range), str(r.events), str(r.held), holders))
    lines += aligned(rows)
    lines.append(
        f"total: {report.events} event(s) {verb}, {report.held} held back by projections; "
        f"offset rows of retired projections {verb}: {report.retired_offsets}"
    )
    return "\n".join(lines)


async def _has_events(journal: Journal, entity_type: str) -> bool:
    """Whether any slice holds an event of the entity type (one index probe per slice)."""
    query = sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM generate_series(0, %(last)s) AS s(slice) WHERE EXISTS "
        "(SELECT 1 FROM {j} WHERE slice = s.slice AND entity_type = %(et)s))"
    ).format(j=journal.tables.journal)
    async with journal.pool.connection() as conn:
        cur = await conn.execute(query, {"last": NUMBER_OF_SLICES - 1, "et": entity_type})
        row = await cur.fetchone()
    return bool(row and row[0])


def report_document(report: RetentionReport) -> dict[str, Any]:
    """`retention apply --json`: the report as one JSON object."""
    return {
        "policy": report.policy.describe(),
        "entity_type": report.policy.entity_type,
        "dry_run": report.dry_run,
        "events": report.events,
        "held": report.held,
        "retired_offsets": report.retired_offsets,
        "ranges": [
            {
                "range": r.slice_range.key,
                "events": r.events,
                "held": r.held,
                "held_by": [
                    {"projection": h.projection, "latest": _iso(h.latest), "paused": h.paused}
                    for h in r.held_by
                ],
            }
            for r in report.ranges
        ],
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def print_progress(progress: RetentionProgress) -> None:
    """`retention apply`'s progress: a line on stderr per slice range done (not with
    `--json` or `--quiet`), so that a long run shows how far it has got."""
    print(progress.describe(), file=sys.stderr, flush=True)


def cmd_retention_apply(args: argparse.Namespace) -> int:
    policy = RetentionPolicy(
        args.entity_type, keep=args.keep, keep_last=args.keep_last, keep_snapshot=args.keep_snapshot
    )
    settings = RetentionSettings(batch_size=args.batch_size)

    async def body(journal: Journal) -> int:
        if not await _has_events(journal, args.entity_type):
            raise InvalidArgument(
                f"the journal holds no event of entity type {args.entity_type!r} (check the "
                "name: it is the part of a persistence id before '|'); nothing was deleted"
            )
        retention = Retention(journal, settings)
        report = await retention.apply(
            policy,
            dry_run=args.dry_run,
            ranges=args.ranges,
            progress=None if args.json or args.quiet else print_progress,
        )
        if args.json:
            print(json.dumps(report_document(report)), flush=True)
        else:
            print(format_report(report), flush=True)
        return 0

    return asyncio.run(_with_journal(args, body, "slicejournal retention"))


def projection_document(info: ProjectionInfo) -> dict[str, Any]:
    """One projection of `projections list --json`."""
    return {
        "name": info.name,
        "registration": info.registration.value,
        "entity_type": info.entity_type,
        "seen_entity_types": list(info.seen_entity_types),
        "slices": None if info.slice_range is None else info.slice_range.key,
        "slices_with_offsets": info.slices_with_offsets,
        "min_offset": None if info.min_offset is None else info.min_offset.isoformat(),
        "paused": info.paused,
    }


def format_projections(infos: list[ProjectionInfo]) -> str:
    """The table `projections list` prints."""
    if not infos:
        return "no projections: none has stored an offset or been registered"
    rows: list[tuple[str, ...]] = [
        ("name", "registration", "entity_type", "slices", "min_offset", "paused")
    ]
    for i in infos:
        entity = i.entity_type or (
            ",".join(i.seen_entity_types) + " (seen)" if i.seen_entity_types else "?"
        )
        rows.append((i.name, i.registration.value, entity, i.slices_text, _time(i.min_offset),
                     "yes" if i.paused else "no"))  # fmt: skip
    return "\n".join(aligned(rows))


def _projections_command(
    action: Callable[[Retention, argparse.Namespace], Any],
) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        async def body(journal: Journal) -> int:
            print(await action(Retention(journal), args), flush=True)
            return 0

        return asyncio.run(_with_journal(args, body))

    return command


async def _list(retention: Retention, args: argparse.Namespace) -> str:
    infos = await retention.projections()
    if args.json:
        return json.dumps([projection_document(i) for i in infos])
    return format_projections(infos)


async def _register(retention: Retention, args: argparse.Namespace) -> str:
    await retention.register(args.name, args.entity_type, args.range)
    return (f"projection {args.name}: registered for {args.entity_type} slices {args.range}; "
            "retention keeps what it has not consumed")  # fmt: skip


async def _retire(retention: Retention, args: argparse.Namespace) -> str:
    await retention.retire(args.name)
    return (f"projection {args.name}: retired; it no longer holds retention back, and the "
            "next retention apply deletes its offsets")  # fmt: skip


def add_retention_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    bounded_int: Callable[[int, int], Callable[[str], int]],
) -> None:
    """Register `retention apply` and `projections list | register | retire`."""
    p = sub.add_parser("retention", help="delete old events no projection still needs")
    actions = p.add_subparsers(dest="retention_command", required=True)
    p = actions.add_parser(
        "apply",
        parents=[common],
        help="delete what the policy lets go and every projection has consumed",
        description="Deletes the events of one entity type that the policy lets go (every "
        "rule given: older than --keep, not among the --keep-last newest of their id, "
        "covered by their id's snapshot) and that every projection holding their slice has "
        "consumed, slice by slice in short batches; each id keeps its highest deleted event "
        "as a deletion marker. Offset rows of retired projections go too.",
    )
    p.add_argument("--entity-type", required=True, type=entity_type_argument,
                   help="the entity type whose events go (the part of a persistence id "
                   "before '|')")  # fmt: skip
    p.add_argument("--keep", type=duration_argument, default=None,
                   help="keep events newer than this: 500ms, 30s, 15m, 12h, 7d")  # fmt: skip
    p.add_argument("--keep-last", type=bounded_int(1, 2**31 - 1), default=None,
                   help="keep the newest N events of each persistence id")  # fmt: skip
    p.add_argument("--keep-snapshot", action="store_true",
                   help="keep the events after each id's snapshot (all, without one)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="delete nothing: print what would go and what holds it back")  # fmt: skip
    p.add_argument("--batch-size", type=bounded_int(1, 100_000), default=1000,
                   help="events examined per transaction (default 1000)")  # fmt: skip
    p.add_argument("--ranges", type=ranges_argument, default=8,
                   help="slice ranges the report sums into (divides 1024; default 8)")  # fmt: skip
    p.add_argument("--json", action="store_true",
                   help="the report as one JSON object (and no progress lines)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr (default: one per range done)")  # fmt: skip
    p.set_defaults(func=cmd_retention_apply, needs_rule=True)

    p = sub.add_parser("projections", help="the projections that hold retention back")
    actions = p.add_subparsers(dest="projections_command", required=True)
    p = actions.add_parser(
        "list",
        parents=[common],
        help="every projection with offsets or registered",
        description="Name, how it holds retention (registered, implicit: it stored offsets, "
        "retired), entity type, slices covered, its earliest offset (where it would resume) "
        "and whether it is paused.",
    )
    p.add_argument("--json", action="store_true", help="a JSON array")
    p.set_defaults(func=_projections_command(_list))
    p = actions.add_parser(
        "register",
        parents=[common],
        help="make a projection hold retention back (before it starts, or again)",
    )
    p.add_argument("name", help="the projection's name")
    p.add_argument("--entity-type", required=True, type=entity_type_argument,
                   help="the entity type it projects")  # fmt: skip
    p.add_argument("--range", type=slice_range_argument, default="0-1023",
                   help="the slices it covers (default 0-1023)")  # fmt: skip
    p.set_defaults(func=_projections_command(_register))
    p = actions.add_parser(
        "retire", parents=[common], help="stop an abandoned projection from holding retention"
    )
    p.add_argument("name", help="the projection's name")
    p.set_defaults(func=_projections_command(_retire))


def check_rules(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`retention apply` needs at least one keep rule: a usage error (exit 2) otherwise."""
    if getattr(args, "needs_rule", False) and (
        args.keep is None and args.keep_last is None and not args.keep_snapshot
    ):
        parser.error("retention apply needs --keep, --keep-last or --keep-snapshot")

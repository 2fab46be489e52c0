"""Retention that waits for projections: what may be deleted, decided without I/O.

A journal grows forever unless something deletes old events, and the one
thing a deletion must never do is take an event away from a projection that
has not consumed it yet. This module decides, per slice, which events of an
entity type may go; `projections/aio/retention.py` (and its generated sync
twin) only reads the facts and executes the statements of
`projections/retention_sql.py`, one short transaction per batch.

An event may go when **every** rule allows it:

* the `RetentionPolicy` (each of its keep rules would let it go: older than
  `keep`, not among the `keep_last` newest of its id, at or below its id's
  snapshot with `keep_snapshot`), and
* every projection that *holds* its slice has consumed it. A projection has
  consumed an event of slice s when its newest offset row of that persistence
  id is at or above the event (seq_nr and timestamp: the per-event record every
  accepted envelope leaves covers every lower seq_nr of the same lifetime of
  the id), or when the event
  is older than what the projection itself treats as handled in s: its
  latest row there minus its time window (the offset store drops such an
  event as a duplicate) or its start marker (`set_offset`: skipped).
  A projection with no row in a slice it holds has consumed nothing there.

Which projections hold a slice of an entity type (`ProjectionInfo.holds`,
`covers`): an explicitly registered one over its registered range; an
implicit one (it stored offsets, never registered) over every slice, for its
entity type as far as it is known (fleet, or the ids in its rows), else for
every entity type; a retired one holds nothing. A slice no projection holds is
retained by the policy alone.

Deletability is downward closed per persistence id (every rule above is
monotone in seq_nr: timestamps grow with seq_nr and an offset row covers all
lower seq_nrs), so a batch deletes "seq_nr < target" per id and turns the row
at `target` into the deletion marker, exactly as `delete_events_to` does.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from journal.durations import (
    format_duration,
    name_duration_fields,
    positive,
    to_optional_timedelta,
    to_timedelta,
)
from journal.durations import parse_duration as parse_duration  # its old home; re-exported
from journal.errors import InvalidSettings
from journal.settings import _positive_int
from journal.slices import SliceRange, validate_entity_type
from projections.settings import ProjectionSettings

MAX_BATCH_SIZE = 100_000


def _keep_last(instance: Any, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


def _entity_type(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    validate_entity_type(value)


@attrs.frozen(field_transformer=name_duration_fields)
class RetentionPolicy:
    """What to keep of one entity type's events; everything else may be deleted once
    every projection holding its slice has consumed it.

    Each keep rule keeps an event on its own (an event goes only if no rule keeps
    it); at least one is required:

    * `keep`: events newer than this (a timedelta, seconds, or "500ms", "30s", "15m",
      "12h", "7d");
    * `keep_last`: the newest N events of each persistence id;
    * `keep_snapshot`: what recovering from the id's snapshot needs, the events
      after it (an id without a snapshot keeps everything).
    """

    entity_type: str = attrs.field(validator=_entity_type)
    keep: timedelta | None = attrs.field(
        default=None, converter=to_optional_timedelta, validator=positive
    )
    keep_last: int | None = attrs.field(default=None, validator=_keep_last)
    keep_snapshot: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        if self.keep is None and self.keep_last is None and not self.keep_snapshot:
            raise InvalidSettings(
                "a retention policy needs at least one rule: keep, keep_last or keep_snapshot"
            )

    def cutoff(self, now: datetime) -> datetime | None:
        """Events stored before this may go by the time rule (None: no time rule)."""
        return None if self.keep is None else now - self.keep

    def describe(self) -> str:
        """The rules in words, for reports."""
        rules = []
        if self.keep is not None:
            rules.append(f"newer than {format_duration(self.keep)}")
        if self.keep_last is not None:
            rules.append(f"the last {self.keep_last} per id")
        if self.keep_snapshot:
            rules.append("what the latest snapshot needs")
        return f"{self.entity_type}: keep " + ", ".join(rules)


def _batch_size(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    _positive_int(instance, attribute, value)
    if value > MAX_BATCH_SIZE:
        raise InvalidSettings(f"batch_size must be at most {MAX_BATCH_SIZE}, got {value}")


@attrs.frozen(field_transformer=name_duration_fields)
class RetentionSettings:
    """How retention runs: the batch size (events examined per transaction) and the
    projections' time window it assumes (at least the longest `time_window` of their
    `ProjectionSettings`: older events count as handled, as the offset store has it)."""

    batch_size: int = attrs.field(default=1000, validator=_batch_size)
    time_window: timedelta = attrs.field(
        default=ProjectionSettings().time_window, converter=to_timedelta, validator=positive
    )


class Registration(enum.Enum):
    """How a projection came to hold retention."""

    EXPLICIT = "registered"  # `register`: entity type and slice range known
    IMPLICIT = "implicit"  # it stored offsets and was never registered
    RETIRED = "retired"  # `retire`: holds nothing; its offsets go at the next apply


@attrs.frozen
class ProjectionInfo:
    """One projection as retention sees it (`slicejournal projections list`)."""

    name: str
    registration: Registration
    # Registered, or the fleet's; None if not known.
    entity_type: str | None
    # The entity types of the persistence ids in its offset rows.
    seen_entity_types: tuple[str, ...]
    # Registered range; None: every slice (an implicit projection).
    slice_range: SliceRange | None
    # Slices with at least one offset row, and the earliest of their latest rows.
    slices_with_offsets: int
    min_offset: datetime | None
    paused: bool

    def holds(self, entity_type: str) -> bool:
        """Whether its offsets hold back the deletion of this entity type's events."""
        if self.registration is Registration.RETIRED:
            return False
        if self.entity_type is not None:
            return self.entity_type == entity_type
        return not self.seen_entity_types or entity_type in self.seen_entity_types

    def covers(self, slice_: int) -> bool:
        """Whether it holds this slice (of an entity type it holds)."""
        if self.registration is Registration.RETIRED:
            return False
        return self.slice_range is None or slice_ in self.slice_range

    @property
    def slices_text(self) -> str:
        """The slices covered, as `list` prints them."""
        if self.registration is Registration.RETIRED:
            return "-"
        if self.slice_range is None:
            return f"all (offsets in {self.slices_with_offsets})"
        return str(self.slice_range)


@attrs.frozen
class Holder:
    """A projection holding one slice: its latest offset row there (None: no row, it has
    consumed nothing of the slice) and its start marker (`set_offset`), if any."""

    projection: str
    latest: datetime | None
    start: datetime | None = None
    paused: bool = False

    def handled_before(self, window: timedelta) -> datetime | None:
        """Events before this count as consumed without a record: the offset store takes
        them as handled (older than latest - window) or skips them (start marker)."""
        if self.latest is None:
            return None
        bound = self.latest - window
        return bound if self.start is None or self.start < bound else self.start


@attrs.frozen
class SlicePlan:
    """What one batch of a slice may delete."""

    slice: int
    # The policy's time rule: only db_timestamp < cutoff (None: no time rule).
    cutoff: datetime | None
    # The projections' bound: only db_timestamp <= upper (None: no projection holds it).
    upper: datetime | None
    # A projection holds the slice without having consumed anything: nothing may go.
    blocked: bool
    # (projection, handled_before): an event at or after that bound needs an offset row
    # of that projection at or above its seq_nr.
    checks: tuple[tuple[str, datetime], ...]
    # The projection holding back the most (the earliest latest row), for reports.
    binding: Holder | None


def plan_slice(
    policy: RetentionPolicy,
    slice_: int,
    now: datetime,
    holders: Sequence[Holder],
    window: timedelta,
) -> SlicePlan:
    """The bounds of one slice's deletion, from the projections holding it."""
    cutoff = policy.cutoff(now)
    binding = min(holders, key=_holding, default=None)
    if any(h.latest is None for h in holders):
        return SlicePlan(slice_, cutoff, None, True, (), binding)
    upper = min((h.latest for h in holders if h.latest is not None), default=None)
    # The newest event a batch can consider; a projection that counts everything up to
    # it as handled needs no per-event check.
    newest = _earliest(cutoff, upper)
    checks = []
    for h in holders:
        before = h.handled_before(window)
        assert before is not None
        if newest is None or before <= newest:
            checks.append((h.projection, before))
    return SlicePlan(slice_, cutoff, upper, False, tuple(checks), binding)


def _holding(h: Holder) -> tuple[int, datetime]:
    return (0, datetime.min) if h.latest is None else (1, h.latest.replace(tzinfo=None))


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def deletable(
    plan: SlicePlan,
    policy: RetentionPolicy,
    *,
    seq_nr: int,
    timestamp: datetime,
    highest: int,
    snapshot_seq_nr: int | None,
    consumed: Mapping[str, tuple[int, datetime]],
) -> bool:
    """The verdict on one event, as the statements of `retention_sql.py` compute it in
    SQL (their specification). `consumed` maps a projection to its newest offset row
    of the event's persistence id: (seq_nr, timestamp)."""
    if plan.blocked:
        return False
    if plan.cutoff is not None and timestamp >= plan.cutoff:
        return False
    if plan.upper is not None and timestamp > plan.upper:
        return False
    if policy.keep_last is not None and seq_nr > highest - policy.keep_last:
        return False
    if policy.keep_snapshot and (snapshot_seq_nr is None or seq_nr > snapshot_seq_nr):
        return False
    return all(
        timestamp < before or _covers(consumed.get(name), seq_nr, timestamp)
        for name, before in plan.checks
    )


def _covers(row: tuple[int, datetime] | None, seq_nr: int, timestamp: datetime) -> bool:
    """An offset row at or above the event, in the same lifetime of the id (a reset id's
    new events are newer than every row of its earlier lifetime)."""
    return row is not None and row[0] >= seq_nr and row[1] >= timestamp


@attrs.frozen
class SliceOutcome:
    """What retention did (or would do) in one slice."""

    slice: int
    # Events deleted (or, in a dry run, that would be).
    events: int
    # Events the policy lets go that a projection has not consumed: every one in a dry
    # run; applying, those examined plus up to a batch past the projections' bound.
    held: int
    binding: Holder | None
    blocked: bool


@attrs.frozen
class RetentionProgress:
    """How far a `Retention.apply` run has got, handed to its `progress` callback each
    time it has finished the slices of one of the report's slice ranges."""

    # The report range just finished (only ranges with a slice to examine are reported).
    slice_range: SliceRange
    # Slices examined so far, of the slices the run examines (those with an event the
    # time rule lets go).
    slices_done: int
    slices_total: int
    # Events deleted (in a dry run: that would be) and held back so far.
    events: int
    held: int
    dry_run: bool

    def describe(self) -> str:
        """One line, as `slicejournal retention apply` prints it on stderr."""
        verb = "would go" if self.dry_run else "deleted"
        return (
            f"retention: slices {self.slice_range} done ({self.slices_done}/"
            f"{self.slices_total} slices examined): {self.events} event(s) {verb}, "
            f"{self.held} held back so far"
        )


@attrs.frozen
class RangeReport:
    """One slice range's part of a report: events gone and what holds the rest back."""

    slice_range: SliceRange
    events: int
    held: int
    # Projections holding events back here, each at its earliest offset in the range
    # (None: it has no offset in some slice of the range).
    held_by: tuple[Holder, ...]


@attrs.frozen
class RetentionReport:
    """The outcome of `Retention.apply` (or of its dry run)."""

    policy: RetentionPolicy
    dry_run: bool
    ranges: tuple[RangeReport, ...]
    # Offset rows of retired projections deleted (or that would be).
    retired_offsets: int

    @property
    def events(self) -> int:
        """Events deleted, or that would be."""
        return sum(r.events for r in self.ranges)

    @property
    def held(self) -> int:
        """Events the policy lets go that projections still hold back."""
        return sum(r.held for r in self.ranges)


def summarize(
    outcomes: Iterable[SliceOutcome], ranges: Sequence[SliceRange]
) -> tuple[RangeReport, ...]:
    """Slice outcomes folded into the report's slice ranges."""
    by_range: dict[SliceRange, list[SliceOutcome]] = {r: [] for r in ranges}
    for outcome in outcomes:
        for r in ranges:
            if outcome.slice in r:
                by_range[r].append(outcome)
                break
    out = []
    for r, items in by_range.items():
        holding: dict[str, Holder] = {}
        for o in items:
            if o.binding is None or (o.held == 0 and not o.blocked):
                continue
            known = holding.get(o.binding.projection)
            if known is None or _holding(o.binding) < _holding(known):
                holding[o.binding.projection] = o.binding
        out.append(
            RangeReport(
                r,
                sum(o.events for o in items),
                sum(o.held for o in items),
                tuple(sorted(holding.values(), key=lambda h: h.projection)),
            )
        )
    return tuple(out)

"""The data source's options, parsed and checked before Spark plans anything.

Spark hands a Python data source its options as strings in a case-insensitive
map (`dict(options)` has lowercased keys), and it builds the source on the
driver when `load()` is called. Parsing everything there, into one frozen
value that pickles, means a bad option is one clear error at `load()` — never
a task failure minutes into a job — and every reader (the driver's and the
executors') works from the same checked values. Pure: no Spark, no psycopg.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import attrs

from journal.errors import InvalidArgument
from journal.filter import EventFilter
from journal.settings import JournalSettings, QuerySettings
from journal.slices import SliceRange, validate_entity_type

_DEFAULT_QUERY = QuerySettings()
DEFAULT_PARTITIONS = 4


def backtracking_window(settings: JournalSettings) -> timedelta:
    """How far below a stream offset rows are re-read when nobody knows what was open
    there: the slice query's backtracking window plus its lag, as the in-process
    runners use."""
    backtracking = settings.query.backtracking
    return backtracking.window + backtracking.behind_current_time


DEFAULT_WINDOW = backtracking_window(JournalSettings())
# The values of option `read`: the journal's events, or each id's durable state.
EVENTS = "events"
DURABLE_STATE = "durableState"
READS = (EVENTS, DURABLE_STATE)
# Rows per Arrow batch a partition reader yields (and fetches per round trip).
DEFAULT_BATCH_ROWS = 10_000

# Spark lowercases option keys; these are the spellings users write (and the docs show).
OPTIONS = (
    "dsn",
    "schema",
    "journalTable",
    "snapshotTable",
    "durableStateTable",
    "read",
    "entityType",
    "minSlice",
    "maxSlice",
    "numPartitions",
    "fromTimestamp",
    "toTimestamp",
    "maxEventsPerTrigger",
    "behindCurrentTime",
    "backtrackingWindow",
    "startingTimestamp",
    "batchRows",
    "ordered",
    "manifests",
    "tags",
    "where",
    "filteredEnvelopes",
    "fromSnapshots",
)
_BY_LOWER = {name.lower(): name for name in OPTIONS}


class SourceOptionError(InvalidArgument):
    """A `slicejournal` data source option is missing or invalid (raised at `load()`)."""


@attrs.frozen
class SourceOptions:
    """Everything a reader needs, checked; travels to executors inside each partition."""

    dsn: str
    settings: JournalSettings
    entity_type: str
    slice_range: SliceRange
    num_partitions: int = DEFAULT_PARTITIONS
    from_timestamp: datetime | None = None
    to_timestamp: datetime | None = None
    max_events_per_trigger: int | None = None
    behind_current_time: timedelta = _DEFAULT_QUERY.behind_current_time
    backtracking_window: timedelta = DEFAULT_WINDOW
    starting_timestamp: datetime | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    ordered: bool = True
    # `manifests` / `tags` / `where`: the rows read (None: every row). With
    # `filteredEnvelopes`, a row it leaves out is read as its key only (what `project`
    # reads: its offset store needs every seq_nr); without, it is not read at all.
    event_filter: EventFilter | None = None
    filtered_envelopes: bool = False
    # Each id's snapshot in place of its events up to the snapshot's seq_nr (batch
    # reads: `rebuild(from_snapshots=True)`); a `from_snapshot` column says which rows.
    from_snapshots: bool = False
    # What to read: the journal's events, or the durable state store's rows (`READS`).
    read: str = EVENTS

    def partition_ranges(self) -> list[SliceRange]:
        """The slice range cut into `num_partitions` contiguous sub-ranges (a pid's slice
        lies in exactly one), as even as the count allows."""
        return self.slice_range.split(self.num_partitions)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check the raw options (any key case) and build `SourceOptions`, or raise
    `SourceOptionError` naming the option."""
    raw: dict[str, str] = {}
    for key, value in options.items():
        name = _BY_LOWER.get(str(key).lower())
        if name is None:
            known = ", ".join(OPTIONS)
            raise SourceOptionError(f"slicejournal source: unknown option {key!r} (known: {known})")
        raw[name] = str(value)
    for required in ("dsn", "entityType"):
        if not raw.get(required):
            raise SourceOptionError(f"slicejournal source: option {required!r} is required")
    try:
        settings = JournalSettings(
            schema=raw.get("schema", "public"),
            journal_table=raw.get("journalTable", "event_journal"),
            snapshot_table=raw.get("snapshotTable", "snapshot"),
            durable_state_table=raw.get("durableStateTable", "durable_state"),
        )
    except ValueError as error:
        raise SourceOptionError(f"slicejournal source: {error}") from None
    try:
        entity_type = validate_entity_type(raw["entityType"])
    except ValueError as error:
        raise SourceOptionError(f"slicejournal source: option 'entityType': {error}") from None
    lo = _int(raw, "minSlice", SliceRange.FULL.min_slice)
    hi = _int(raw, "maxSlice", SliceRange.FULL.max_slice)
    try:
        slice_range = SliceRange(lo, hi)
    except ValueError as error:
        raise SourceOptionError(f"slicejournal source: minSlice/maxSlice: {error}") from None
    from_ts = _timestamp(raw, "fromTimestamp")
    to_ts = _timestamp(raw, "toTimestamp")
    if from_ts is not None and to_ts is not None and from_ts > to_ts:
        raise SourceOptionError(
            f"slicejournal source: fromTimestamp {from_ts.isoformat()} is after "
            f"toTimestamp {to_ts.isoformat()}"
        )
    max_events = _int(raw, "maxEventsPerTrigger", 0) or None
    behind = _seconds(raw, "behindCurrentTime", _DEFAULT_QUERY.behind_current_time)
    window = _seconds(raw, "backtrackingWindow", DEFAULT_WINDOW)
    event_filter = _event_filter(raw)
    from_snapshots = _bool(raw, "fromSnapshots", False)
    if from_snapshots and event_filter is not None:
        raise SourceOptionError(
            "slicejournal source: option 'fromSnapshots' cannot be combined with "
            "'manifests', 'tags' or 'where': a snapshot stands for every event before it, "
            "which a filter would judge one by one"
        )
    read = _read(raw, event_filter, from_snapshots)
    return SourceOptions(
        dsn=raw["dsn"],
        settings=settings,
        entity_type=entity_type,
        slice_range=slice_range,
        num_partitions=_int(raw, "numPartitions", DEFAULT_PARTITIONS),
        from_timestamp=from_ts,
        to_timestamp=to_ts,
        max_events_per_trigger=max_events,
        behind_current_time=behind,
        backtracking_window=window,
        starting_timestamp=_timestamp(raw, "startingTimestamp"),
        batch_rows=_int(raw, "batchRows", DEFAULT_BATCH_ROWS),
        ordered=_bool(raw, "ordered", True),
        event_filter=event_filter,
        filtered_envelopes=_bool(raw, "filteredEnvelopes", False),
        from_snapshots=from_snapshots,
        read=read,
    )


def _read(raw: Mapping[str, str], event_filter: EventFilter | None, from_snapshots: bool) -> str:
    """Option `read` (any case), checked against the options that apply to events only."""
    given = raw.get("read", EVENTS)
    read = next((r for r in READS if r.lower() == given.lower()), None)
    if read is None:
        raise SourceOptionError(
            f"slicejournal source: option 'read' must be one of {', '.join(READS)}, not {given!r}"
        )
    if read == DURABLE_STATE and (event_filter is not None or from_snapshots):
        raise SourceOptionError(
            "slicejournal source: options 'manifests', 'tags', 'where' and 'fromSnapshots' "
            "read events; they do not apply to read=durableState"
        )
    return read


def _event_filter(raw: Mapping[str, str]) -> EventFilter | None:
    """The `EventFilter` of options `manifests`, `tags` (each a JSON list of strings, or
    comma-separated) and `where` (a SQL expression); None if none is given."""
    try:
        event_filter = EventFilter(
            manifests=_names(raw, "manifests"),
            tags=_names(raw, "tags"),
            where=raw["where"] if raw.get("where", "").strip() else None,
        )
    except InvalidArgument as error:
        raise SourceOptionError(f"slicejournal source: {error}") from None
    return None if event_filter.is_empty else event_filter


def _names(raw: Mapping[str, str], name: str) -> tuple[str, ...]:
    text = raw.get(name, "").strip()
    if not text:
        return ()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise SourceOptionError(
                f"slicejournal source: option {name!r} must be a JSON list of non-empty "
                f"strings or comma-separated names, got {text!r}"
            )
        return tuple(value)
    return tuple(part.strip() for part in text.split(",") if part.strip())


def filter_options(event_filter: EventFilter | None) -> dict[str, str]:
    """The source options that carry `event_filter` (none for None): the lists as JSON,
    so a name with a comma survives."""
    if event_filter is None:
        return {}
    options = {}
    if event_filter.manifests:
        options["manifests"] = json.dumps(list(event_filter.manifests))
    if event_filter.tags:
        options["tags"] = json.dumps(list(event_filter.tags))
    if event_filter.where is not None:
        options["where"] = event_filter.where
    return options


def _int(raw: Mapping[str, str], name: str, default: int) -> int:
    if name not in raw:
        return default
    text = raw[name].strip()
    try:
        value = int(text)
    except ValueError:
        raise SourceOptionError(
            f"slicejournal source: option {name!r} must be an integer, got {text!r}"
        ) from None
    if name not in ("minSlice", "maxSlice") and value < 1:
        raise SourceOptionError(f"slicejournal source: option {name!r} must be >= 1, got {value}")
    return value


def _bool(raw: Mapping[str, str], name: str, default: bool) -> bool:
    if name not in raw:
        return default
    text = raw[name].strip().lower()
    if text not in ("true", "false"):
        raise SourceOptionError(
            f"slicejournal source: option {name!r} must be 'true' or 'false', got {raw[name]!r}"
        )
    return text == "true"


def _timestamp(raw: Mapping[str, str], name: str) -> datetime | None:
    if name not in raw:
        return None
    return parse_timestamp(raw[name], f"option {name!r}")


def parse_timestamp(text: str, what: str) -> datetime:
    """An ISO 8601 timestamp with a UTC offset (a naive one is ambiguous: refused)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SourceOptionError(
            f"slicejournal source: {what} must be an ISO 8601 timestamp, got {text!r}"
        ) from None
    if value.tzinfo is None:
        raise SourceOptionError(
            f"slicejournal source: {what} needs a UTC offset (e.g. '+00:00'), got {text!r}"
        )
    return value.astimezone(UTC)


def _seconds(raw: Mapping[str, str], name: str, default: timedelta) -> timedelta:
    if name not in raw:
        return default
    text = raw[name].strip()
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses NaN
        raise SourceOptionError(
            f"slicejournal source: option {name!r} must be seconds >= 0, got {text!r}"
        )
    return timedelta(seconds=value)

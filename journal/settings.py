"""Settings objects, validated when built.

A bad value (a negative duration, a window shorter than the delay it must
cover, a table name PostgreSQL would silently truncate) is rejected here, when
the service starts, not hours later inside a query. Defaults are Pekko
Persistence R2DBC's, named in DESIGN.md.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
import warnings
from datetime import timedelta
from typing import Any, Literal

import attrs

from journal.durations import (
    name_duration_fields,
    non_negative,
    positive,
    to_timedelta,
)
from journal.errors import InvalidArgument, InvalidSettings

MAX_IDENTIFIER_BYTES = 63


# The validators under the names the other settings modules import.
_non_negative = non_negative
_positive_duration = positive


def _positive_int(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSettings(f"{attribute.name} must be an int >= 1, got {value!r}")


def _append_statements(
    instance: Any, attribute: attrs.Attribute[Any], value: int | str | None
) -> None:
    if value is not None and value != "auto":
        if isinstance(value, str):
            raise InvalidSettings(
                f"{attribute.name} must be an int >= 1, None or 'auto', got {value!r}"
            )
        _positive_int(instance, attribute, value)


def _identifier(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidSettings(f"{attribute.name} must be a non-empty str, got {value!r}")
    if "\x00" in value:
        raise InvalidSettings(f"{attribute.name} must not contain NUL: {value!r}")
    if "%" in value:
        # psycopg reads `%` as a placeholder even inside a quoted identifier, so
        # such a name would break (or redirect) every parameterised statement.
        raise InvalidSettings(f"{attribute.name} must not contain '%': {value!r}")
    if attribute.name == "schema" and value.lower().startswith("pg_"):
        raise InvalidSettings(f"schema {value!r}: names starting with pg_ are reserved")
    if len(value.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        raise InvalidSettings(
            f"{attribute.name} {value!r} is longer than PostgreSQL's "
            f"{MAX_IDENTIFIER_BYTES}-byte identifier limit"
        )


def duration_field(default: timedelta, *, allow_zero: bool = True) -> Any:
    """An attrs field holding a validated duration (see `journal.durations`).

    Type checkers take a field's `__init__` type from a literal `attrs.field(converter=...)`
    only, so public settings declare theirs that way (`Duration` in, `timedelta` out);
    this helper is for fields whose class is not built by users' code.
    """
    return attrs.field(
        default=default,
        converter=to_timedelta,
        validator=non_negative if allow_zero else positive,
    )


@attrs.frozen(field_transformer=name_duration_fields)
class BacktrackingSettings:
    """How far back the slice query re-reads to catch events that committed late."""

    enabled: bool = True
    window: timedelta = attrs.field(
        default=timedelta(minutes=2), converter=to_timedelta, validator=positive
    )
    behind_current_time: timedelta = attrs.field(
        default=timedelta(seconds=10), converter=to_timedelta, validator=non_negative
    )

    def __attrs_post_init__(self) -> None:
        if self.window < self.behind_current_time:
            raise InvalidSettings(
                f"backtracking window ({self.window}) must not be shorter than "
                f"backtracking behind_current_time ({self.behind_current_time})"
            )


@attrs.frozen(field_transformer=name_duration_fields)
class HorizonSettings:
    """The exact visibility horizon of live slice queries (see `journal.query.horizon`).

    PostgreSQL knows which transactions are still open, so a live query reads
    only up to the start of the oldest one that may still write to the journal
    instead of guessing with `behind_current_time`.
    """

    # Read pg_stat_activity before each live query; off means Pekko's behaviour
    # (stay behind_current_time behind the clock, backtracking catches late commits).
    enabled: bool = True
    # How far behind the horizon the query stays: covers the instant between a
    # transaction taking its start time and PostgreSQL publishing it.
    margin: timedelta = attrs.field(
        default=timedelta(milliseconds=5), converter=to_timedelta, validator=non_negative
    )
    # How long the tail waits for an open transaction that has not written to the
    # journal (yet): an idle-in-transaction session holds it back at most this
    # long. After that the stream moves on and, once that transaction ends,
    # re-reads from its start (backtracking), so a late write is still delivered.
    max_hold: timedelta = attrs.field(
        default=timedelta(seconds=10), converter=to_timedelta, validator=positive
    )


@attrs.frozen(field_transformer=name_duration_fields)
class QuerySettings:
    """Tuning of `events_by_slices` (Pekko's `query` section)."""

    buffer_size: int = attrs.field(default=1000, validator=_positive_int)
    refresh_interval: timedelta = attrs.field(
        default=timedelta(seconds=3), converter=to_timedelta, validator=positive
    )
    behind_current_time: timedelta = attrs.field(
        default=timedelta(milliseconds=100), converter=to_timedelta, validator=non_negative
    )
    backtracking: BacktrackingSettings = attrs.field(factory=BacktrackingSettings)
    horizon: HorizonSettings = attrs.field(factory=HorizonSettings)
    # Bucket counts (10 s each) used to bound catch-up scans; how many to fetch at once.
    bucket_limit: int = attrs.field(default=10_000, validator=_positive_int)
    # Emit heartbeat envelopes after this long without events (projection runners ask for them).
    heartbeat_interval: timedelta = attrs.field(
        default=timedelta(seconds=3), converter=to_timedelta, validator=positive
    )
    # Use LISTEN/NOTIFY wake-ups; polling alone stays correct.
    notifications: bool = True

    def __attrs_post_init__(self) -> None:
        if self.backtracking.enabled and self.backtracking.window < self.behind_current_time:
            raise InvalidSettings(
                f"backtracking window ({self.backtracking.window}) must not be shorter than "
                f"behind_current_time ({self.behind_current_time})"
            )


def _default_writer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"[:255]


@attrs.frozen(field_transformer=name_duration_fields)
class JournalSettings:
    """Where the journal lives and how it talks to PostgreSQL."""

    schema: str = attrs.field(default="public", validator=_identifier)
    journal_table: str = attrs.field(default="event_journal", validator=_identifier)
    snapshot_table: str = attrs.field(default="snapshot", validator=_identifier)
    # The durable state store's table (`DurableStateStore`), in the same schema.
    durable_state_table: str = attrs.field(default="durable_state", validator=_identifier)
    # Of each of the journal's two pools (writes, reads). A query that is not live
    # (`current_events_by_slices`) takes a second read connection to start its next
    # catch-up chunk early, only while the read pool keeps room for one more request
    # (so never with `pool_max_size` 2 or less).
    pool_min_size: int = attrs.field(default=1, validator=_positive_int)
    pool_max_size: int = attrs.field(default=10, validator=_positive_int)
    writer_id: str = attrs.field(factory=_default_writer)
    # Send a NOTIFY hint after each committed append (coalesced; see journal/notifications.py).
    notify: bool = True
    # Page size of current_persistence_ids and events_by_persistence_id.
    page_size: int = attrs.field(default=1000, validator=_positive_int)
    query: QuerySettings = attrs.field(factory=QuerySettings)
    # How long opening one connection may take before `ConnectionFailed` (also bounds the
    # wait for the pools to fill in `Journal.open`). PostgreSQL counts whole seconds, at
    # least 2; a `connect_timeout` in the DSN wins over it.
    connect_timeout: timedelta = attrs.field(
        default=timedelta(seconds=5), converter=to_timedelta, validator=positive
    )
    # How long a migration step (`slicejournal migrate`, `create_schema`) waits for a lock
    # on a table it changes before it gives up with `LockTimeout` (nothing applied; retry
    # later). While it waits, writes to that table queue behind it: this bounds that too.
    migration_lock_timeout: timedelta = attrs.field(
        default=timedelta(seconds=5), converter=to_timedelta, validator=positive
    )
    # Group commit: at most this many appends run at once on the journal's own
    # connections, each its own statement; appends that arrive while they run wait, and
    # each time one ends, those waiting go together as one statement and transaction
    # (each append still all or nothing, with its own outcome; one append per
    # persistence id in a group). A lone writer waits for nothing. None: every append is
    # its own statement, up to `pool_max_size` at once. Appends in a caller's
    # transaction (`conn=`) are never grouped. "auto": 2 for the asyncio `Journal`,
    # None for the blocking `SyncJournal` (its threads, held back by the GIL, gained
    # nothing from grouping when measured).
    append_statements: int | Literal["auto"] | None = attrs.field(
        default="auto", validator=_append_statements
    )

    def append_statements_for(self, asynchronous: bool) -> int | None:
        """`append_statements` for the asyncio (`asynchronous`) or the blocking journal."""
        if self.append_statements == "auto":
            return 2 if asynchronous else None
        return self.append_statements

    @property
    def migration_lock_timeout_ms(self) -> int:
        """`migration_lock_timeout` as PostgreSQL's `lock_timeout` takes it: whole
        milliseconds, rounded up, at least 1 (0 would mean no limit), at most 2^31 - 1
        (PostgreSQL's largest, about 24.8 days)."""
        ms = -(-self.migration_lock_timeout // timedelta(milliseconds=1))
        return min(2**31 - 1, max(1, ms))

    @property
    def connect_timeout_seconds(self) -> int:
        """`connect_timeout` as libpq takes it: whole seconds, rounded up, at least 2."""
        return max(2, math.ceil(self.connect_timeout.total_seconds()))

    def __attrs_post_init__(self) -> None:
        if self.pool_min_size > self.pool_max_size:
            raise InvalidSettings(
                f"pool_min_size ({self.pool_min_size}) exceeds pool_max_size ({self.pool_max_size})"
            )


def renamed_query_settings(
    query_settings: QuerySettings | None, settings: QuerySettings | None
) -> QuerySettings | None:
    """A slice query's `query_settings`, or its deprecated `settings=` (with a warning:
    one name, one thing; `settings` is a `JournalSettings` everywhere else)."""
    if settings is None:
        return query_settings
    warnings.warn(
        "settings= of a slice query is deprecated: pass query_settings= (a QuerySettings)",
        DeprecationWarning,
        stacklevel=3,
    )
    if query_settings is not None:
        raise InvalidArgument("pass query_settings= only (settings= is its deprecated name)")
    return settings

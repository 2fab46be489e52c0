"""slicejournal's journal: event-sourced writes and slice queries on PostgreSQL.

The public API; everything not re-exported here is private.

    async with Journal.connect() as journal:          # embedded PostgreSQL
        await journal.append("Account|1", [{"deposited": 10}], expected_seq_nr=0)
        async for env in journal.current_events_by_slices("Account", 0, 1023):
            ...

Every error it raises is a `JournalError`: `ConnectionFailed` (server unreachable or
refusing, within `JournalSettings.connect_timeout`), `SchemaNotInitialized` (run
`slicejournal init`), `InvalidArgument` / `InvalidSettings` / `InvalidPersistenceId`
(also `ValueError`s), `ConcurrencyError`, the
(de)serialization and embedded-server errors, and `ProtocolError` (a driver bug: a
state machine driven out of order). The projections' errors derive from it too.
"""

from typing import TYPE_CHECKING

from journal._lazy import lazy_attributes
from journal.durable_state import DurableState, DurableStateChange
from journal.durations import Duration, parse_duration
from journal.errors import (
    ConcurrencyError,
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    DeserializationError,
    InvalidArgument,
    InvalidPersistenceId,
    InvalidSettings,
    JournalClosed,
    JournalError,
    LockTimeout,
    PoolExhausted,
    ProtocolError,
    QueryCancelled,
    SchemaNotInitialized,
    SchemaOutdated,
    SchemaTooNew,
    SerializationError,
)
from journal.filter import EventFilter
from journal.model import (
    NOT_LOADED,
    UNDECODABLE,
    EventEnvelope,
    SerializedPayload,
    Snapshot,
    TimestampOffset,
)
from journal.serialization import (
    BytesSerializer,
    JsonSerializer,
    Serializer,
    SerializerRegistry,
)
from journal.settings import (
    BacktrackingSettings,
    HorizonSettings,
    JournalSettings,
    QuerySettings,
)
from journal.slices import (
    NUMBER_OF_SLICES,
    PersistenceId,
    SliceRange,
    entity_type_of,
    slice_for,
    slice_ranges,
)

# The drivers load psycopg and asyncio: imported on first use (see journal/_lazy.py).
# `journal.sync` is generated from `journal.aio` (tools/async_to_sync.py).
if TYPE_CHECKING:
    from journal.aggregate import Loaded
    from journal.aio.aggregate import AggregateRepository
    from journal.aio.durable_state import DurableStateStore
    from journal.aio.journal import Journal
    from journal.sync.aggregate import SyncAggregateRepository
    from journal.sync.durable_state import SyncDurableStateStore
    from journal.sync.journal import SyncJournal
    from journal.telemetry import WriteTelemetry, use_telemetry

__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "AggregateRepository": "journal.aio.aggregate",
        "Loaded": "journal.aggregate",
        "DurableStateStore": "journal.aio.durable_state",
        "SyncDurableStateStore": "journal.sync.durable_state",
        "Journal": "journal.aio.journal",
        "SyncAggregateRepository": "journal.sync.aggregate",
        "SyncJournal": "journal.sync.journal",
        **dict.fromkeys(("WriteTelemetry", "use_telemetry"), "journal.telemetry"),
    },
)

__all__ = [
    "NOT_LOADED",
    "NUMBER_OF_SLICES",
    "UNDECODABLE",
    "AggregateRepository",
    "BacktrackingSettings",
    "BytesSerializer",
    "ConcurrencyError",
    "ConnectionFailed",
    "ConnectionLost",
    "DatabaseError",
    "DeserializationError",
    "DurableState",
    "DurableStateChange",
    "DurableStateStore",
    "Duration",
    "EventEnvelope",
    "EventFilter",
    "HorizonSettings",
    "InvalidArgument",
    "InvalidPersistenceId",
    "InvalidSettings",
    "Journal",
    "JournalClosed",
    "JournalError",
    "JournalSettings",
    "JsonSerializer",
    "Loaded",
    "LockTimeout",
    "PersistenceId",
    "PoolExhausted",
    "ProtocolError",
    "QueryCancelled",
    "QuerySettings",
    "SchemaNotInitialized",
    "SchemaOutdated",
    "SchemaTooNew",
    "SerializationError",
    "SerializedPayload",
    "Serializer",
    "SerializerRegistry",
    "SliceRange",
    "Snapshot",
    "SyncAggregateRepository",
    "SyncDurableStateStore",
    "SyncJournal",
    "TimestampOffset",
    "WriteTelemetry",
    "entity_type_of",
    "parse_duration",
    "slice_for",
    "slice_ranges",
    "use_telemetry",
]

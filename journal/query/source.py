"""What the slice query reads: a source of rows, as Pekko's `BySliceQuery[Row, Envelope]`
reads through its `Dao`.

The machine (`by_slice.py`) never sees a table: it decides `RowsQuery`,
`BucketsQuery` and `HorizonQuery` requests and reads each returned row at three
positions (`journal.rows`: id, seq_nr, db_timestamp; the read time last). A
`RowSource` answers those requests for one kind of row: it builds the
statements for its table and turns the rows the machine emits into envelopes.
The journal's events are one source (`EVENTS`), the durable state's changes
another (`STATE_CHANGES`, the revision in the seq_nr position), and the one
driver per flavour (`journal/aio/slice_reader.py`) runs either, so the horizon,
buckets, backtracking and heartbeats are the same code for both.

Sources are frozen values without a database handle; the statements are
`psycopg.sql` compositions the driver executes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeVar

import attrs
from psycopg import sql

from journal.durable_state import DurableStateChange, heartbeat_change, rows_to_changes
from journal.filter import EventFilter
from journal.model import SNAPSHOT_SOURCE, EventEnvelope, TimestampOffset, heartbeat_envelope
from journal.query import sql as q
from journal.query.by_slice import BucketsQuery, RowsQuery
from journal.query.state_sql import state_rows
from journal.rows import SNAPSHOT_FLAG, Row, RowOffset, iter_envelopes
from journal.serialization import SerializerRegistry
from journal.tables import Tables

E = TypeVar("E", covariant=True)
Statement = tuple[sql.Composed, dict[str, Any]]


class RowSource(Protocol, Generic[E]):
    """One kind of row the slice query reads: its statements and its envelopes."""

    @property
    def kind(self) -> str:
        """What the rows are, for messages ("events", "durable state changes")."""
        ...

    @property
    def consecutive(self) -> bool:
        """True if an id's seq_nrs come one by one (events: a gap means rows not seen
        yet); False if only its latest revision is read (durable state: gaps are normal)."""
        ...

    def rows(
        self,
        tables: Tables,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        query: RowsQuery,
        event_filter: EventFilter | None,
    ) -> Statement:
        """The SELECT answering `query`: the machine's positions, the read time last."""
        ...

    def buckets(
        self,
        tables: Tables,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        query: BucketsQuery,
        behind: timedelta,
    ) -> Statement:
        """Row counts per bucket (`journal.query.sql.slice_buckets` over the table)."""
        ...

    def horizon(self, tables: Tables, reader_application: str) -> Statement:
        """The open transactions that may write to the table (`journal.query.horizon`)."""
        ...

    def decode(
        self,
        rows: Iterable[tuple[Row, RowOffset]],
        registry: SerializerRegistry,
        *,
        source: str,
        skip_filtered: bool,
    ) -> Iterable[E]:
        """The envelopes of the rows the machine emitted, each with its offset, in order
        (the slice query makes a list of each part's: `PART` rows at most)."""
        ...

    def heartbeat(self, entity_type: str, min_slice: int, offset: TimestampOffset) -> E:
        """An idle progress marker at `offset`."""
        ...


@attrs.frozen
class EventRows:
    """The journal's events (`EventEnvelope`s)."""

    kind: str = "events"
    consecutive: bool = True

    def rows(
        self,
        tables: Tables,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        query: RowsQuery,
        event_filter: EventFilter | None,
    ) -> Statement:
        return q.slice_rows(tables, entity_type, min_slice, max_slice, query, event_filter)

    def buckets(
        self,
        tables: Tables,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        query: BucketsQuery,
        behind: timedelta,
    ) -> Statement:
        return q.slice_buckets(tables, entity_type, min_slice, max_slice, query, behind)

    def horizon(self, tables: Tables, reader_application: str) -> Statement:
        return q.horizon(tables, reader_application)

    def decode(
        self,
        rows: Iterable[tuple[Row, RowOffset]],
        registry: SerializerRegistry,
        *,
        source: str,
        skip_filtered: bool,
    ) -> Iterable[EventEnvelope]:
        return iter_envelopes(rows, registry, source=source, skip_filtered=skip_filtered)

    def heartbeat(self, entity_type: str, min_slice: int, offset: TimestampOffset) -> EventEnvelope:
        return heartbeat_envelope(entity_type, min_slice, offset)


@attrs.frozen
class SnapshotStartRows(EventRows):
    """The journal's events with each id's snapshot in place of its events up to the
    snapshot's seq_nr (`journal.query.sql.snapshot_rows`): what a projection that starts
    from snapshots needs, shipped instead of every event. Backtracking reads the events
    alone (their keys): a re-delivered event the snapshot covers is a duplicate."""

    def rows(
        self,
        tables: Tables,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        query: RowsQuery,
        event_filter: EventFilter | None,
    ) -> Statement:
        if event_filter is not None:  # pragma: no cover - refused where the stream starts
            raise ValueError("an EventFilter does not combine with snapshots")
        return q.slice_rows(tables, entity_type, min_slice, max_slice, query, from_snapshots=True)

    def decode(
        self,
        rows: Iterable[tuple[Row, RowOffset]],
        registry: SerializerRegistry,
        *,
        source: str,
        skip_filtered: bool,
    ) -> Iterable[EventEnvelope]:
        # One decoder run over the rows (its decoder lookups shared), one envelope per
        # row: a snapshot row (flagged; backtracking rows have no flag) is relabelled.
        pairs = list(rows)
        for (row, _), envelope in zip(
            pairs, iter_envelopes(pairs, registry, source=source), strict=True
        ):
            if len(row) > SNAPSHOT_FLAG + 1 and row[SNAPSHOT_FLAG]:
                yield envelope._replace(source=SNAPSHOT_SOURCE)
            else:
                yield envelope


@attrs.frozen
class StateChangeRows:
    """The durable state's changes (`DurableStateChange`s): the latest revision of each
    changed id, in the positions of an event's seq_nr."""

    kind: str = "durable state changes"
    consecutive: bool = False

    def rows(
        self,
        tables: Tables,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        query: RowsQuery,
        event_filter: EventFilter | None,
    ) -> Statement:
        return state_rows(tables, entity_type, min_slice, max_slice, query)

    def buckets(
        self,
        tables: Tables,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        query: BucketsQuery,
        behind: timedelta,
    ) -> Statement:
        return q.slice_buckets(
            tables, entity_type, min_slice, max_slice, query, behind, tables.durable_state
        )

    def horizon(self, tables: Tables, reader_application: str) -> Statement:
        # Writers of the durable state table hold the changes query back, not the journal's.
        return q.horizon(tables, reader_application, tables.settings.durable_state_table)

    def decode(
        self,
        rows: Iterable[tuple[Row, RowOffset]],
        registry: SerializerRegistry,
        *,
        source: str,
        skip_filtered: bool,
    ) -> Iterable[DurableStateChange]:
        return rows_to_changes(rows, registry, source=source)

    def heartbeat(
        self, entity_type: str, min_slice: int, offset: TimestampOffset
    ) -> DurableStateChange:
        return heartbeat_change(entity_type, min_slice, offset)


EVENTS: RowSource[EventEnvelope] = EventRows()
EVENTS_FROM_SNAPSHOTS: RowSource[EventEnvelope] = SnapshotStartRows()
STATE_CHANGES: RowSource[DurableStateChange] = StateChangeRows()

"""The statements on projection_management and the dead-letter table; they run nothing.

Built from `ProjectionTables` and shared by the runners (pause checks, dead letters,
executed in `offset_dao.py`) and by the operators' `ProjectionManagement`,
so the runners never import the operators' module.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from journal.durable_state import DurableStateChange
from journal.errors import InvalidArgument
from journal.filter import EventFilter
from journal.model import EventEnvelope
from journal.query.source import EVENTS, STATE_CHANGES, RowSource
from journal.query.sql import filter_condition
from journal.slices import SliceRange
from projections.names import ALL_RANGES
from projections.offset_sql import Statement
from projections.tables import ProjectionTables


class ManagementSql:
    """The statements on projection_management and the dead-letter table."""

    def __init__(self, tables: ProjectionTables) -> None:
        t = tables
        self.upsert = sql.SQL(
            "INSERT INTO {m} (projection_name, projection_key, paused, last_updated) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (projection_name, projection_key) "
            "DO UPDATE SET paused = excluded.paused, last_updated = excluded.last_updated"
        ).format(m=t.management)
        self.paused_keys = sql.SQL(
            "SELECT projection_key FROM {m} WHERE projection_name = %s AND paused"
        ).format(m=t.management)
        self.dead_letter = sql.SQL(
            "INSERT INTO {d} (projection_name, projection_key, slice, persistence_id, seq_nr, "
            "db_timestamp, error) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
        ).format(d=t.dead_letter)
        self.dead_letters = sql.SQL(
            "SELECT persistence_id, seq_nr, slice, db_timestamp, error, failed_at, "
            "replay_requested_at, replayed_at, replay_failures FROM {d} "
            "WHERE projection_name = %s ORDER BY failed_at, persistence_id, seq_nr"
        ).format(d=t.dead_letter)
        # Replay (migration 0003): an operator's request, what an instance picks up for
        # its slices, and the outcome. Marking a letter replayed locks its row, so of two
        # instances (a rescale's old and new owner) only one replays it.
        self.request_replay = sql.SQL(
            "UPDATE {d} SET replay_requested_at = now() "
            "WHERE projection_name = %(name)s AND replayed_at IS NULL AND (%(all)s OR "
            "(persistence_id, seq_nr) IN (SELECT * FROM unnest(%(pids)s::text[], "
            "%(seqs)s::bigint[]))) RETURNING persistence_id, seq_nr"
        ).format(d=t.dead_letter)
        self.pending_replays = sql.SQL(
            "SELECT persistence_id, seq_nr, db_timestamp FROM {d} WHERE projection_name = %s "
            "AND slice BETWEEN %s AND %s AND replay_requested_at IS NOT NULL "
            "AND replayed_at IS NULL ORDER BY db_timestamp, persistence_id, seq_nr LIMIT 100"
        ).format(d=t.dead_letter)
        self.mark_replayed = sql.SQL(
            "UPDATE {d} SET replayed_at = now() WHERE projection_name = %s "
            "AND persistence_id = %s AND seq_nr = %s AND replay_requested_at IS NOT NULL "
            "AND replayed_at IS NULL"
        ).format(d=t.dead_letter)
        self.replay_failed = sql.SQL(
            "UPDATE {d} SET error = %s, failed_at = now(), replay_requested_at = NULL, "
            "replay_failures = replay_failures + 1 WHERE projection_name = %s "
            "AND persistence_id = %s AND seq_nr = %s AND replayed_at IS NULL"
        ).format(d=t.dead_letter)
        self.offsets = sql.SQL(
            "SELECT max(latest), min(latest), count(*) FROM ("
            "  SELECT slice, max(timestamp_offset) AS latest FROM {o} "
            "  WHERE projection_name = %s AND slice BETWEEN %s AND %s GROUP BY slice) AS s"
        ).format(o=t.offset_store)
        self.known = sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM {o} WHERE projection_name = %(n)s) "
            "OR EXISTS (SELECT 1 FROM {m} WHERE projection_name = %(n)s) "
            "OR EXISTS (SELECT 1 FROM {d} WHERE projection_name = %(n)s) "
            "OR EXISTS (SELECT 1 FROM {f} WHERE projection_name = %(n)s)"
        ).format(o=t.offset_store, m=t.management, d=t.dead_letter, f=t.fleet)
        self.head = self._head(t.journal_tables.journal)
        self.state_head = self._head(t.journal_tables.durable_state)
        # A running projection's filter (migration 0003), in the row of key '*': a
        # filtered instance records it at start (the row is inserted not paused if there
        # was none), an unfiltered one clears it.
        self.record_filter = sql.SQL(
            "INSERT INTO {m} (projection_name, projection_key, paused, last_updated, "
            "event_filter) VALUES (%s, {all}, false, %s, %s) "
            "ON CONFLICT (projection_name, projection_key) "
            "DO UPDATE SET event_filter = excluded.event_filter"
        ).format(m=t.management, all=sql.Literal(ALL_RANGES))
        self.clear_filter = sql.SQL(
            "UPDATE {m} SET event_filter = NULL WHERE projection_name = %s "
            "AND projection_key = {all} AND event_filter IS NOT NULL"
        ).format(m=t.management, all=sql.Literal(ALL_RANGES))
        # What a running projection reads (migration 0004): NULL for events, as the filter.
        self.record_reads = sql.SQL(
            "INSERT INTO {m} (projection_name, projection_key, paused, last_updated, reads) "
            "VALUES (%s, {all}, false, %s, %s) ON CONFLICT (projection_name, projection_key) "
            "DO UPDATE SET reads = excluded.reads"
        ).format(m=t.management, all=sql.Literal(ALL_RANGES))
        self.clear_reads = sql.SQL(
            "UPDATE {m} SET reads = NULL WHERE projection_name = %s "
            "AND projection_key = {all} AND reads IS NOT NULL"
        ).format(m=t.management, all=sql.Literal(ALL_RANGES))
        self.recorded_reads = sql.SQL(
            "SELECT reads FROM {m} WHERE projection_name = %s AND projection_key = {all}"
        ).format(m=t.management, all=sql.Literal(ALL_RANGES))
        self.recorded_filter = sql.SQL(
            "SELECT event_filter FROM {m} WHERE projection_name = %s AND projection_key = {all}"
        ).format(m=t.management, all=sql.Literal(ALL_RANGES))
        self._journal = t.journal_tables.journal
        self._durable_state = t.journal_tables.durable_state
        self._offset_store = t.offset_store

    @staticmethod
    def _head(table: sql.Identifier) -> sql.Composed:
        """The newest db_timestamp of an entity type in a slice range of `table`."""
        return sql.SQL(
            "SELECT max(h.ts) FROM generate_series(%(lo)s::int, %(hi)s::int) AS s(slice), "
            "LATERAL (SELECT max(db_timestamp) AS ts FROM {t} "
            "WHERE slice = s.slice AND entity_type = %(et)s) AS h"
        ).format(t=table)

    def head_of(self, source: RowSource[Any]) -> sql.Composed:
        """`head` over the rows `source` reads."""
        return self.state_head if source is STATE_CHANGES else self.head

    def backlog(
        self, event_filter: EventFilter | None = None, *, source: RowSource[Any] = EVENTS
    ) -> tuple[sql.Composed, dict[str, Any]]:
        """The backlog of a range (see projections/backlog.py), and the filter's parameters:
        the database's now(), the oldest event newer than its slice's latest stored
        offset, and how many such events there are, counted up to %(cap)s — only those
        `event_filter` lets through. One index probe per slice for the latest offset and
        the oldest event; the count stops at the cap. With `source=STATE_CHANGES` the
        rows are the durable state's (each id's latest change, a deletion included)."""
        condition: sql.Composable = sql.SQL(" AND NOT deleted")
        params: dict[str, Any] = {}
        table = self._journal
        if source is STATE_CHANGES:
            table, condition = self._durable_state, sql.SQL("")
        if event_filter is not None:
            matched, params = filter_condition(event_filter)
            condition = condition + sql.SQL(" AND ") + matched
        statement = sql.SQL(
            "WITH stored AS MATERIALIZED ("
            "  SELECT s.slice, coalesce((SELECT max(timestamp_offset) FROM {o} "
            "    WHERE projection_name = %(name)s AND slice = s.slice), '-infinity') AS latest "
            "  FROM generate_series(%(lo)s::int, %(hi)s::int) AS s(slice)) "
            "SELECT now(), "
            " (SELECT min(w.ts) FROM stored, LATERAL (SELECT db_timestamp AS ts FROM {j} "
            "   WHERE slice = stored.slice AND entity_type = %(et)s "
            "   AND db_timestamp > stored.latest{c} "
            "   ORDER BY db_timestamp LIMIT 1) AS w), "
            " (SELECT count(*) FROM (SELECT 1 FROM stored, LATERAL (SELECT 1 FROM {j} "
            "   WHERE slice = stored.slice AND entity_type = %(et)s "
            "   AND db_timestamp > stored.latest{c}) AS e LIMIT %(cap)s) AS c)"
        ).format(o=self._offset_store, j=table, c=condition)
        return statement, params

    def paused_keys_of(self, name: str) -> Statement:
        """The keys ("*" or "min-max") under which `name` is paused."""
        return Statement(self.paused_keys, (name,))

    def dead_letters_of(
        self,
        name: str,
        key: str,
        envelopes: Sequence[EventEnvelope | DurableStateChange],
        error: str,
    ) -> list[Statement]:
        """A dead-letter row per envelope, with the error text."""
        return [
            Statement(
                self.dead_letter,
                (name, key, e.slice, e.persistence_id, e.seq_nr, e.db_timestamp, error),
            )
            for e in envelopes
        ]


def pauses(slices: SliceRange, paused_keys: list[str]) -> bool:
    """Whether any paused key ("*" or "min-max") holds an instance over `slices`."""
    for key in paused_keys:
        if key == ALL_RANGES:
            return True
        try:
            paused = SliceRange.parse(key)
        except InvalidArgument:
            continue  # not a key this library writes: it pauses nothing
        if paused.overlaps(slices):
            return True
    return False


def filter_to_json(event_filter: EventFilter | None) -> str | None:
    """The filter as the management table records it (None: no filter)."""
    if event_filter is None:
        return None
    return json.dumps(
        {
            "manifests": list(event_filter.manifests),
            "tags": list(event_filter.tags),
            "where": event_filter.where,
        }
    )


def filter_from_json(value: Any) -> EventFilter | None:
    """A recorded filter (the JSONB column's value, decoded or text) as an `EventFilter`;
    None for none, or for a value this version cannot read."""
    if value is None:
        return None
    try:
        doc = json.loads(value) if isinstance(value, str | bytes) else value
        event_filter = EventFilter(
            manifests=doc.get("manifests") or (),
            tags=doc.get("tags") or (),
            where=doc.get("where"),
        )
    except (ValueError, TypeError, AttributeError, InvalidArgument):
        return None
    return None if event_filter.is_empty else event_filter

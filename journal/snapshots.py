"""Snapshots: one row per persistence id holding its latest saved state.

An aggregate with a long history loads its snapshot and only the events after
it. The row carries the slice and db_timestamp like events do, so snapshot
rows can later be fed to slice queries (Pekko's "start from snapshot").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
from psycopg import sql

from journal.errors import InvalidArgument
from journal.model import Snapshot
from journal.serialization import SerializerRegistry
from journal.slices import entity_type_of, slice_for, validate_persistence_id
from journal.tables import Tables

# A snapshot's db_timestamp: that of the event it was taken at (or of the deletion
# marker standing for it), as Pekko stores it for start-from-snapshot queries, which
# deliver the snapshot in that event's place; the save time if the event is not
# stored (save a snapshot after its event, or in the same transaction).
_EVENT_TIMESTAMP = sql.SQL(
    "COALESCE((SELECT db_timestamp FROM {journal} "
    "WHERE persistence_id = %(event_pid)s AND seq_nr = %(event_seq_nr)s), "
    "transaction_timestamp())"
)


@attrs.frozen
class SnapshotSql:
    """The snapshot table's statements, shared by both drivers."""

    upsert: sql.Composed
    select: sql.Composed
    delete: sql.Composed

    @classmethod
    def of(cls, tables: Tables) -> SnapshotSql:
        t = tables.snapshot
        return cls(
            upsert=sql.SQL(
                """
            INSERT INTO {t} (slice, entity_type, persistence_id, seq_nr, db_timestamp,
                             write_timestamp, ser_id, ser_manifest, snapshot, tags,
                             meta_ser_id, meta_ser_manifest, meta_payload)
            VALUES (%(slice)s, %(entity_type)s, %(pid)s, %(seq_nr)s, {event_timestamp},
                    %(write_ts)s, %(ser_id)s, %(manifest)s, %(payload)s, %(tags)s::text[],
                    %(meta_ser_id)s, %(meta_manifest)s, %(meta_payload)s)
            ON CONFLICT (persistence_id) DO UPDATE SET
              seq_nr = excluded.seq_nr, db_timestamp = excluded.db_timestamp,
              write_timestamp = excluded.write_timestamp, ser_id = excluded.ser_id,
              ser_manifest = excluded.ser_manifest, snapshot = excluded.snapshot,
              tags = excluded.tags, meta_ser_id = excluded.meta_ser_id,
              meta_ser_manifest = excluded.meta_ser_manifest,
              meta_payload = excluded.meta_payload
            WHERE {t}.seq_nr <= excluded.seq_nr
            """
            ).format(t=t, event_timestamp=_EVENT_TIMESTAMP.format(journal=tables.journal)),
            select=sql.SQL(
                "SELECT seq_nr, db_timestamp, write_timestamp, ser_id, ser_manifest, snapshot, "
                "tags, meta_ser_id, meta_ser_manifest, meta_payload "
                "FROM {t} WHERE persistence_id = %s"
            ).format(t=t),
            delete=sql.SQL("DELETE FROM {t} WHERE persistence_id = %s").format(t=t),
        )


def snapshot_params(
    registry: SerializerRegistry,
    persistence_id: str,
    seq_nr: int,
    state: Any,
    tags: tuple[str, ...],
    metadata: Any,
) -> dict[str, Any]:
    """Validate and serialize a snapshot into the parameters of `SnapshotSql.upsert`."""
    pid = validate_persistence_id(persistence_id)
    if isinstance(seq_nr, bool) or not isinstance(seq_nr, int) or seq_nr < 1:
        raise InvalidArgument(f"snapshot seq_nr must be an int >= 1, got {seq_nr!r}")
    payload = registry.serialize(state, what="snapshot")
    meta = registry.serialize(metadata, what="metadata") if metadata is not None else None
    return {
        "slice": slice_for(pid),
        "entity_type": entity_type_of(pid),
        "pid": pid,
        "seq_nr": seq_nr,
        "event_pid": pid,  # the same values, typed by the journal's columns
        "event_seq_nr": seq_nr,
        "write_ts": int(time.time() * 1000),
        "ser_id": payload.serializer_id,
        "manifest": payload.manifest,
        "payload": payload.payload,
        "tags": list(tags) or None,
        "meta_ser_id": meta.serializer_id if meta else None,
        "meta_manifest": meta.manifest if meta else None,
        "meta_payload": meta.payload if meta else None,
    }


def row_to_snapshot(registry: SerializerRegistry, pid: str, row: Sequence[Any]) -> Snapshot:
    """Decode a row selected by `SnapshotSql.select`."""
    seq_nr, db_ts, write_ts, ser_id, manifest, payload, tags, m_id, m_manifest, m_payload = row
    state = registry.deserialize(ser_id, manifest, payload, persistence_id=pid, seq_nr=seq_nr)
    metadata = None
    if m_payload is not None and m_id is not None:
        metadata = registry.deserialize(
            m_id, m_manifest or "", m_payload, persistence_id=pid, seq_nr=seq_nr
        )
    return Snapshot(
        persistence_id=pid,
        seq_nr=seq_nr,
        db_timestamp=db_ts,
        write_timestamp=_from_millis(write_ts),
        state=state,
        tags=tuple(tags or ()),
        metadata=metadata,
    )


def _from_millis(millis: int) -> datetime:
    # Pekko stores write_timestamp as epoch milliseconds (BIGINT).
    return datetime.fromtimestamp(millis / 1000, tz=UTC)

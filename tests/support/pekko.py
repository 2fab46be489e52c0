"""Rows written the way Pekko Persistence R2DBC's journal writes them (Postgres dialect).

The INSERT is the one Pekko's `JournalDao` issues, so a change to the columns
Pekko writes shows up in the tests that read such rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
from psycopg import sql

from journal import slice_for

JACKSON_JSON = 31  # Pekko's jackson-json serializer id

# The INSERT of Pekko's PostgresJournalDao (transaction-timestamp variant), with the
# placeholders bound in its order; `{journal}` is the schema-qualified table.
PEKKO_INSERT = """
INSERT INTO {journal}
(slice, entity_type, persistence_id, seq_nr, writer, adapter_manifest, db_timestamp,
 event_ser_id, event_ser_manifest, event_payload, tags, meta_ser_id, meta_ser_manifest,
 meta_payload)
VALUES (%s, %s, %s, %s, %s, %s,
  GREATEST(CURRENT_TIMESTAMP, (SELECT db_timestamp + '1 microsecond'::interval FROM {journal}
                               WHERE persistence_id = %s AND seq_nr = %s)),
  %s, %s, %s::bytea, %s, %s, %s, %s)
RETURNING db_timestamp
"""


@attrs.frozen
class PekkoEvent:
    manifest: str
    json: str
    tags: Sequence[str] = ()
    meta: tuple[int, str, bytes] | None = None


async def pekko_write(
    pg_dsn: str, schema: str, pid: str, first_seq_nr: int, events: Sequence[PekkoEvent]
) -> None:
    """One atomic write of a Pekko persistent actor: one INSERT per event, one transaction."""
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await pekko_insert(conn, schema, pid, first_seq_nr, events)
        await conn.commit()


async def pekko_insert(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    pid: str,
    first_seq_nr: int,
    events: Sequence[PekkoEvent],
) -> None:
    """Pekko's INSERTs of one atomic write, in the caller's (open) transaction."""
    journal = sql.Identifier(schema, "event_journal")
    statement = sql.SQL(PEKKO_INSERT).format(journal=journal)
    for i, event in enumerate(events):
        seq_nr = first_seq_nr + i
        meta_id, meta_manifest, meta_payload = event.meta or (None, None, None)
        await conn.execute(
            statement,
            (
                slice_for(pid),
                pid.split("|", 1)[0],
                pid,
                seq_nr,
                "2f0e6c1a-pekko-writer-uuid",
                "",  # Pekko always writes an empty adapter manifest
                pid,
                seq_nr - 1,
                JACKSON_JSON,
                event.manifest,
                event.json,
                list(event.tags) or None,
                meta_id,
                meta_manifest,
                meta_payload,
            ),
        )

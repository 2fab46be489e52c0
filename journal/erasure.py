"""Deleting a whole persistence id (GDPR-style erasure): its statements and its checks.

`delete_events_to` keeps history's shape: a marker row at the highest deleted
seq_nr. Erasure removes everything of an id — events, markers, snapshot — in
bounded batches (one short transaction each, no long locks, no table
rewrite), and still leaves one row behind: a **tombstone**, `deleted = true`,
no payload, written *first* with a fresh db_timestamp and this module's
manifest. It does three things:

* it is the deletion evidence: a reader that meets a gap below it knows the
  missing events were deleted, not that they are late;
* slice queries deliver it (`EventEnvelope.deleted`, no event), so whatever
  reads the journal learns that the id was erased and can erase what it
  derived from it — the journal does not know who reads it;
* it keeps or resets the sequence. Without a reset the tombstone is appended
  like an event at highest + 1 (the next append continues after it); with a
  reset it sits at seq_nr 0, so once the batches have removed every row above
  it the id starts again at 1, later in time than everything before.

Writing the tombstone first means an erasure interrupted halfway leaves a
state every reader understands (some events deleted below a tombstone), and
running it again finishes it. Writers of the id should be stopped meanwhile:
with a reset, events appended during the erasure are erased too.
"""

from __future__ import annotations

from typing import Any

import attrs
from psycopg import sql

from journal.errors import InvalidArgument
from journal.model import TOMBSTONE_MANIFEST, TOMBSTONE_SER_ID
from journal.slices import entity_type_of, slice_for, validate_persistence_id
from journal.tables import Tables

__all__ = ["DEFAULT_BATCH_SIZE", "TOMBSTONE_MANIFEST", "Erasure", "ErasureSql", "check_erasure"]

DEFAULT_BATCH_SIZE = 1000

_TOMBSTONE = sql.SQL(
    """WITH prev AS (
      SELECT seq_nr, db_timestamp FROM {journal}
      WHERE persistence_id = %(pid)s ORDER BY seq_nr DESC LIMIT 1
    )
    INSERT INTO {journal} (
      slice, entity_type, persistence_id, seq_nr, db_timestamp, writer,
      event_ser_id, event_ser_manifest, event_payload, deleted
    )
    SELECT %(slice)s, %(entity_type)s, %(pid)s, {seq_nr},
      GREATEST(transaction_timestamp(), prev.db_timestamp + interval '1 microsecond'),
      %(writer)s, %(ser_id)s, %(manifest)s, ''::bytea, true
    FROM prev
    {conflict}
    RETURNING seq_nr"""
)


@attrs.frozen
class Erasure:
    """A validated `delete_all` request."""

    persistence_id: str
    reset_sequence_number: bool
    batch_size: int

    @property
    def slice(self) -> int:
        return slice_for(self.persistence_id)

    @property
    def entity_type(self) -> str:
        return entity_type_of(self.persistence_id)


def check_erasure(
    persistence_id: object, reset_sequence_number: object, batch_size: object
) -> Erasure:
    """Validate `delete_all`'s arguments; raises `InvalidArgument` before any I/O."""
    pid = validate_persistence_id(persistence_id)
    if not isinstance(reset_sequence_number, bool):
        raise InvalidArgument(
            f"reset_sequence_number must be a bool, got {reset_sequence_number!r}"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgument(f"batch_size must be an int >= 1, got {batch_size!r}")
    return Erasure(pid, reset_sequence_number, batch_size)


@attrs.frozen
class ErasureSql:
    """The statements of one erasure, for one journal and snapshot table."""

    tombstone: sql.Composed
    reset_tombstone: sql.Composed
    delete_below: sql.Composed
    delete_above: sql.Composed
    delete_snapshot: sql.Composed
    remains_below: sql.Composed
    remains_above: sql.Composed

    @classmethod
    def of(cls, tables: Tables) -> ErasureSql:
        journal = tables.journal
        # One batch: the lowest `limit` rows in the range, through the primary key.
        batch = (
            "DELETE FROM {journal} WHERE persistence_id = %(pid)s AND seq_nr IN ("
            "SELECT seq_nr FROM {journal} WHERE persistence_id = %(pid)s AND {range} "
            "ORDER BY seq_nr LIMIT %(limit)s)"
        )
        # Whether any row of the range is left, whoever else deletes meanwhile.
        remains = (
            "SELECT EXISTS (SELECT 1 FROM {journal} WHERE persistence_id = %(pid)s AND {range})"
        )
        # Row 0 is a reset tombstone of an earlier erasure: it stays, since it is the
        # only evidence that the id's lifetime before it ended (a projection that has
        # not handled it yet would otherwise take the new lifetime for duplicates).
        below = sql.SQL("seq_nr > 0 AND seq_nr < %(tombstone)s")
        above = sql.SQL("seq_nr > 0")
        return cls(
            tombstone=_TOMBSTONE.format(
                journal=journal, seq_nr=sql.SQL("prev.seq_nr + 1"), conflict=sql.SQL("")
            ),
            # A second reset before anything new was written moves the tombstone on.
            reset_tombstone=_TOMBSTONE.format(
                journal=journal,
                seq_nr=sql.SQL("0"),
                conflict=sql.SQL(
                    "ON CONFLICT (persistence_id, seq_nr) DO UPDATE SET "
                    "db_timestamp = excluded.db_timestamp, writer = excluded.writer"
                ),
            ),
            delete_below=sql.SQL(batch).format(journal=journal, range=below),
            delete_above=sql.SQL(batch).format(journal=journal, range=above),
            delete_snapshot=sql.SQL("DELETE FROM {t} WHERE persistence_id = %s").format(
                t=tables.snapshot
            ),
            remains_below=sql.SQL(remains).format(journal=journal, range=below),
            remains_above=sql.SQL(remains).format(journal=journal, range=above),
        )

    def tombstone_statement(self, erasure: Erasure, writer_id: str) -> tuple[sql.Composed, Any]:
        """The statement writing the tombstone (returns its seq_nr; no row: no events)."""
        params = {
            "pid": erasure.persistence_id,
            "slice": erasure.slice,
            "entity_type": erasure.entity_type,
            "writer": writer_id,
            "ser_id": TOMBSTONE_SER_ID,
            "manifest": TOMBSTONE_MANIFEST,
        }
        statement = self.reset_tombstone if erasure.reset_sequence_number else self.tombstone
        return statement, params

    def batch_statement(self, erasure: Erasure, tombstone: int) -> tuple[sql.Composed, Any]:
        """One bounded batch of the rows the erasure removes (all but the tombstone)."""
        params = {"pid": erasure.persistence_id, "limit": erasure.batch_size}
        if erasure.reset_sequence_number:
            return self.delete_above, params
        return self.delete_below, {**params, "tombstone": tombstone}

    def remains_statement(self, erasure: Erasure, tombstone: int) -> tuple[sql.Composed, Any]:
        """Whether any row the erasure removes is still there (one boolean).

        A short batch does not mean the end: when another deleter (retention,
        `delete_events_to`, a hand-written `DELETE`) removed the rows a batch
        had picked, PostgreSQL re-checks them after the other commits and the
        batch deletes fewer, or none, while rows above them remain. Only this
        check ends an erasure."""
        params = {"pid": erasure.persistence_id}
        if erasure.reset_sequence_number:
            return self.remains_above, params
        return self.remains_below, {**params, "tombstone": tombstone}

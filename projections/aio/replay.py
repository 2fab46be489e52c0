"""Dead-letter replay inside a running instance (`ProjectionManagement.replay_dead_letters`).

An operator marks letters for replay; each running instance, at its management
poll (like a pause), picks the requested letters of its own slices, re-reads
each event from the journal by persistence id and hands it to its handler once
more. Exactly-once and grouped handlers run in the transaction that marks the
letter replayed: the mark locks the letter's row first, so of two instances
that both see the request (a rescale's old and new owner) one replays it and
the other finds it done; a fenced instance proves its lease in the same
transaction. At-least-once handlers run outside it and the mark follows. A
replay that fails rolls back and leaves the letter parked with the new error.

A projection over durable state replays a letter (an id and revision) from the
store: if the id still holds that revision, its state goes to the handler again
as a change (`source` "replay"); if the id moved on, the letter is superseded —
the newer revision stands for it, handled or on its way — and marked replayed
without a call. The store keeps no older revision to replay.

The replay does not touch the offset store: the letter's event was skipped,
and its offset stored then, so the projection's position does not move. The
sync twin is generated from this module.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

import psycopg

from journal.aio.durable_state import DurableStateStore
from journal.aio.journal import Journal
from journal.durable_state import DurableStateChange, state_change
from journal.model import EventEnvelope
from journal.slices import SliceRange
from projections.core import Mode, same_instant
from projections.fencing import Fence
from projections.management_sql import ManagementSql
from projections.recovery import check_decoded
from projections.tables import ProjectionTables

_log = logging.getLogger("slicejournal.projections.replay")


class DeadLetterReplayer:
    """Runs the replay requests of one instance's slices with its handler."""

    def __init__(
        self,
        journal: Journal,
        tables: ProjectionTables,
        name: str,
        slice_range: SliceRange,
        mode: Mode,
        handler: Callable[..., Awaitable[None]],
        *,
        states: DurableStateStore | None = None,
    ) -> None:
        """`states`: the store a projection over durable state reads (letters name
        revisions of its ids); None for one over events."""
        self._journal = journal
        self._tables = tables
        self._name = name
        self._range = slice_range
        self._mode = mode
        self._handler = handler
        self._sql = ManagementSql(tables)
        self._states = states
        self._enabled = True

    async def run_pending(self, fence: Fence | None, on_error: Callable[[Exception], None]) -> int:
        """Replay every requested letter of the range; the number replayed.

        `on_error` sees a failed transaction's error first (a lost lease or a
        conflict ends the instance, as in its batches)."""
        if not self._enabled:
            return 0
        try:
            async with self._journal.pool.connection() as conn:
                r = self._range
                cur = await conn.execute(
                    self._sql.pending_replays, (self._name, r.min_slice, r.max_slice)
                )
                pending = [(str(p), int(s), ts) for p, s, ts in await cur.fetchall()]
        except psycopg.errors.UndefinedColumn:
            # A schema not migrated yet (opened with `check_schema=False`, as during a
            # rolling upgrade): no replay until this instance is restarted after it.
            self._enabled = False
            _log.warning("projection %s: dead-letter replay needs `slicejournal migrate` "
                         "(projections migration 3); not replaying", self._name)  # fmt: skip
            return 0
        replayed = 0
        for pid, seq_nr, written in pending:
            try:
                envelope = await self._load(pid, seq_nr, written)
                if envelope is None:
                    replayed += await self._superseded(pid, seq_nr)
                    continue
                check_decoded([envelope])
                replayed += await self._replay(envelope, fence)
            except Exception as error:
                on_error(error)
                await self._failed(pid, seq_nr, error)
        return replayed

    async def _load(
        self, pid: str, seq_nr: int, written: datetime
    ) -> EventEnvelope | DurableStateChange | None:
        """The letter's event (written at `written`), or its id's state as a change (None:
        a newer revision superseded it); `LookupError` if there is nothing to replay."""
        if self._states is None:
            envelope = await self._journal.load_envelope(pid, seq_nr)
            if envelope is None:
                raise LookupError("the event is no longer in the journal (deleted)")
            if not same_instant(envelope.db_timestamp, written):
                # `delete_all(reset_sequence_number=True)` erased it, and the id's next
                # lifetime stored that seq_nr again: another event.
                raise LookupError(
                    "the event is no longer in the journal (erased; its seq_nr holds a "
                    "later event of the id, written after a reset)"
                )
            return envelope
        state = await self._states.get(pid)
        if state is None:
            raise LookupError("the id is no longer in the durable state store")
        if state.revision > seq_nr:
            return None
        if state.revision < seq_nr:  # the store never goes back: a letter from elsewhere
            raise LookupError(f"the id holds revision {state.revision}, not {seq_nr}")
        return state_change(state, "replay")

    async def _superseded(self, pid: str, revision: int) -> int:
        """A durable state letter whose id moved on: marked replayed, no handler call."""
        async with self._journal.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(self._sql.mark_replayed, (self._name, pid, revision))
        _log.info("projection %s: dead letter %s revision %d superseded by a newer revision; "
                  "marked replayed", self._name, pid, revision)  # fmt: skip
        return int(cur.rowcount)

    async def _replay(self, env: EventEnvelope | DurableStateChange, fence: Fence | None) -> int:
        key = (self._name, env.persistence_id, env.seq_nr)
        if self._mode is Mode.AT_LEAST_ONCE:
            await self._handler(env)
            async with self._journal.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(self._sql.mark_replayed, key)
                return int(cur.rowcount)
        async with self._journal.pool.connection() as conn, conn.transaction():
            if fence is not None:
                await conn.execute(*fence.idle_limit())
            cur = await conn.execute(self._sql.mark_replayed, key)
            if cur.rowcount == 0:
                return 0  # replayed by another instance meanwhile
            if self._mode is Mode.GROUPED:
                await self._handler(conn, [env])
            else:
                await self._handler(conn, env)
            if fence is not None:
                await conn.execute(*fence.statement(self._tables))
        _log.info("projection %s replayed dead letter %s:%d", self._name,
                  env.persistence_id, env.seq_nr)  # fmt: skip
        return 1

    async def _failed(self, pid: str, seq_nr: int, error: Exception) -> None:
        text = f"replay failed: {type(error).__name__}: {error}"
        _log.error("projection %s: %s (%s:%d)", self._name, text, pid, seq_nr)
        async with self._journal.pool.connection() as conn, conn.transaction():
            await conn.execute(self._sql.replay_failed, (text, self._name, pid, seq_nr))

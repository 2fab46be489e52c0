"""The async driver of the write path: appends and deletes on a pool or a caller's connection.

What is stored and how (the statement, its parameters, the envelopes it
returns) is decided in `journal/writer.py`; this module only executes it, and
records the change for the post-commit notification. Each append reports to
the process's telemetry (`journal/telemetry.py`) when one is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection

from journal.aio import flavour, prepared
from journal.aio.flavour import ASYNC
from journal.aio.notifications import Notifier, send_notification
from journal.aio.pool import JournalPool
from journal.append_groups import ESCAPE_SECONDS, AppendGroups, Waiting, stored_in_group
from journal.connection import journal_error, schema_error
from journal.errors import ConcurrencyError, JournalError
from journal.model import EventEnvelope
from journal.notifications import bucket_bit
from journal.serialization import SerializerRegistry
from journal.tables import Tables
from journal.telemetry import (
    APPEND_CONFLICT,
    APPEND_ERROR,
    APPEND_OK,
    NO_WRITE_TELEMETRY,
    current_telemetry,
)
from journal.wire import Positional
from journal.writer import (
    MAX_GROUP_BYTES,
    MAX_GROUP_EVENTS,
    PreparedAppend,
    WriterSql,
    appended_envelopes,
    opens_caller_transaction,
    stored_timestamp,
)


class EventWriter:
    """Executes appends and deletes against one journal table."""

    def __init__(
        self,
        pool: JournalPool,
        tables: Tables,
        registry: SerializerRegistry,
        writer_id: str,
        notifier: Notifier | None,
        append_statements: int | None = None,
    ) -> None:
        self._pool = pool
        self._tables = tables
        self._registry = registry
        self._writer_id = writer_id
        self._notifier = notifier
        self._sql = WriterSql.of(tables)
        # Group commit of the pool's appends (`journal/append_groups.py`); None: each its own.
        self._groups = (
            None
            if append_statements is None
            else AppendGroups(append_statements, MAX_GROUP_EVENTS, MAX_GROUP_BYTES)
        )
        # The tasks (threads) running groups, for `close` to wait for; asyncio also
        # keeps only a weak reference to a task.
        self._group_tasks: set[flavour.Task[None]] = set()
        self._tasks_lock = threading.Lock()
        # The timer that lets appends waiting too long run alone (`_watch`).
        self._watchdog: flavour.Timer | None = None

    async def append(
        self, batch: PreparedAppend, conn: AsyncConnection[Any] | None = None
    ) -> list[EventEnvelope]:
        """Store a prepared batch; in `conn`'s transaction if given, else on its own."""
        telemetry = current_telemetry()
        if telemetry is NO_WRITE_TELEMETRY:
            return await self._append(batch, conn)
        events = len(batch.payloads)
        started = telemetry.append_started(batch.entity_type, events)
        began = time.perf_counter()
        outcome = APPEND_ERROR
        try:
            appended = await self._append(batch, conn)
            outcome = APPEND_OK
            return appended
        except ConcurrencyError:
            outcome = APPEND_CONFLICT
            raise
        finally:
            elapsed = time.perf_counter() - began
            telemetry.append_ended(started, batch.entity_type, events, elapsed, outcome)

    async def _append(
        self, batch: PreparedAppend, conn: AsyncConnection[Any] | None
    ) -> list[EventEnvelope]:
        statement, values = self._sql.append_call(batch, self._writer_id)
        if conn is not None:
            # The caller owns the transaction: run inside a savepoint so a
            # conflict does not poison the caller's other work, and notify
            # inside it (delivered only if the caller commits).
            async with callers_savepoint(conn):
                stored_at = await self._insert(conn, statement, values, own=False)
                if stored_at is None:
                    raise psycopg.Rollback()  # back to the savepoint, then report below
                if self._notifier is not None:
                    current_telemetry().notified(batch.entity_type)
                    await send_notification(
                        conn,
                        self._tables.notify_channel,
                        batch.entity_type,
                        bucket_bit(batch.slice),
                    )
            if stored_at is None:
                actual = await self.highest_seq_nr(batch.persistence_id, conn)
                raise ConcurrencyError(batch.persistence_id, batch.expected_seq_nr, actual)
        else:
            stored_at = await self._append_own(batch, statement, values)
            if self._notifier is not None:
                current_telemetry().notified(batch.entity_type)
                self._notifier.changed(batch.entity_type, batch.slice)
        return appended_envelopes(batch, stored_at, self._writer_id)

    async def _append_own(
        self, batch: PreparedAppend, statement: Positional, values: list[Any]
    ) -> datetime:
        """Store a batch on the pool's own connections: alone, or in the next group when
        `append_statements` statements run already; `ConcurrencyError` if its
        `expected_seq_nr` is not current."""
        groups = self._groups
        if groups is not None and not groups.try_run():
            waiting = Waiting(batch, flavour.Event())
            if not groups.queue(waiting, time.monotonic()):
                stored_at = await self._in_group(groups, waiting)
                if stored_at is not None:
                    return stored_at
                if not waiting.leads:  # not sent in time, or its group rolled back
                    return await self._alone(batch, statement, values)
                # else a group of it alone: it runs here, in a statement's place
        try:
            return await self._alone(batch, statement, values)
        finally:
            if groups is not None:
                self._run_next_groups(groups)

    async def _alone(
        self, batch: PreparedAppend, statement: Positional, values: list[Any]
    ) -> datetime:
        async with self._pool.connection() as own:
            stored_at = await self._insert(own, statement, values, own=True)
            if stored_at is None:
                # Ask on the connection already held: taking a second one from the
                # pool while holding this one can exhaust the pool under contention.
                actual = await self.highest_seq_nr(batch.persistence_id, own)
                raise ConcurrencyError(batch.persistence_id, batch.expected_seq_nr, actual)
        return stored_at

    async def _in_group(self, groups: AppendGroups, waiting: Waiting) -> datetime | None:
        """The stored timestamp of a waiting append once its group ran; None if it is to
        run alone instead: not sent within `ESCAPE_SECONDS`, its group rolled back, or a
        group of it alone (`leads`: it then holds a statement's place)."""
        led = False
        try:
            self._watch(groups)
            await waiting.done.wait()
            if waiting.group:
                led = True
                await self._lead(groups, waiting, waiting.group)  # its group (threads)
        except BaseException:
            # Not sent yet: it never will be. Sent: its group runs on, as a statement
            # whose caller went away would; or it was to run here, and its place goes on
            # (the group it was to lead, unsent, runs alone).
            if not groups.withdraw(waiting) and not led and (waiting.leads or waiting.group):
                for other in waiting.group or ():
                    if other is not waiting:
                        other.run_alone()
                self._run_next_groups(groups)
            raise
        if waiting.alone or waiting.leads:
            return None  # to run alone: its group was rolled back, never sent, or just it
        error = waiting.error
        if error is not None:
            # Every caller of a failed group gets its own exception.
            raise group_error(error, self._pool) from error
        batch = waiting.batch
        if waiting.stored_at is None:
            actual = await self.highest_seq_nr(batch.persistence_id)
            raise ConcurrencyError(batch.persistence_id, batch.expected_seq_nr, actual)
        return waiting.stored_at

    def _watch(self, groups: AppendGroups) -> None:
        """Make sure a timer will let appends waiting `ESCAPE_SECONDS` unsent run alone:
        one timer for them all (a timed wait per append cost it about a tenth of its CPU)."""
        with self._tasks_lock:
            if self._watchdog is None:
                self._watchdog = flavour.call_later(ESCAPE_SECONDS, self._expire, groups)

    def _expire(self, groups: AppendGroups) -> None:
        now = time.monotonic()
        for waiting in groups.expired(now - ESCAPE_SECONDS):
            waiting.run_alone()
        with self._tasks_lock:
            self._watchdog = None
            oldest = groups.oldest_unsent()
            if oldest is not None:
                self._watchdog = flavour.call_later(
                    max(0.0, oldest + ESCAPE_SECONDS - now), self._expire, groups
                )

    def _run_next_groups(self, groups: AppendGroups) -> None:
        """A statement ended: start what waited for it as a group, in a task of its own
        (no caller's cancellation stops a statement that others wait for); in the
        blocking flavour, in the thread of its first caller (`_lead`)."""
        while group := groups.finish():
            if len(group) == 1 or not ASYNC:
                # Its first caller runs it, in this statement's place: one append alone, or
                # (threads, dear to start) the whole group; unless none is still wanted.
                leader = groups.hand_over(group)
                if leader is None:
                    continue
                leader.done.set()
                return
            if ASYNC:
                try:
                    task = flavour.spawn(
                        self._run_groups, groups, group, name="slicejournal-append-group"
                    )
                except Exception:  # no task to run it: its callers run theirs alone
                    for waiting in group:
                        if groups.withdraw(waiting):
                            waiting.run_alone()
                    continue
                with self._tasks_lock:
                    self._group_tasks = {t for t in self._group_tasks if not t.done()} | {task}
                return

    if ASYNC:
        # Groups run in tasks of their own (the blocking flavour's thread runs its
        # group itself, `_lead`), so the generated twin has no `_run_groups`.

        async def _run_groups(self, groups: AppendGroups, group: list[Waiting]) -> None:
            while group:
                try:
                    await self._run_group(groups, group)
                except BaseException as e:
                    for waiting in group:
                        if waiting.done.is_set():
                            continue
                        if groups.withdraw(waiting):
                            waiting.run_alone()  # nothing of it was sent
                        else:
                            waiting.failed(e)
                    self._run_next_groups(groups)  # what waits runs in a task of its own
                    if isinstance(e, Exception):
                        return  # its callers have it; a task's own error would only be logged
                    raise
                group = groups.finish()

        async def _run_group(self, groups: AppendGroups, group: list[Waiting]) -> None:
            """Store a group's appends in one statement; each waiting caller gets its outcome."""
            async with self._pool.connection() as own:
                await self._store(own, groups.send(group))

    async def _lead(self, groups: AppendGroups, leader: Waiting, sent: list[Waiting]) -> None:
        """Run a sent group in its first caller (`leader`), then pass its place on."""
        storing = False
        try:
            async with self._pool.connection() as own:
                storing = True
                await self._store(own, sent)
        except BaseException as e:
            for waiting in sent:
                if waiting is leader or waiting.done.is_set():
                    continue
                if storing:
                    waiting.failed(e)
                else:
                    waiting.run_alone()  # nothing was sent: no connection came
            raise
        finally:
            self._run_next_groups(groups)

    async def _store(self, own: AsyncConnection[Any], sent: list[Waiting]) -> None:
        """Store the appends `sent` in one statement on `own`; each caller gets its outcome."""
        if len(sent) == 1:
            (waiting,) = sent
            statement, values = self._sql.append_call(waiting.batch, self._writer_id)
            try:
                stored_at = await self._insert(own, statement, values, own=True)
            except Exception as e:
                waiting.failed(e)
            else:
                waiting.succeeded(stored_at)
            return
        if not sent:
            return
        values = self._sql.group_call([w.batch for w in sent], self._writer_id)
        try:
            rows = await prepared.rows(own, self._sql.append_group, values)
        except psycopg.Error as e:
            if not rolled_back(e, own):
                for waiting in sent:
                    waiting.failed(e)
                return
            rows = None
        if rows is None:
            # Rolled back, or not runnable through libpq: each caller runs its own
            # append alone, at once, so each gets its own outcome and none waits
            # behind another's lock.
            for waiting in sent:
                waiting.run_alone()
            return
        for waiting, stored_at in zip(sent, stored_in_group(len(sent), rows), strict=True):
            waiting.succeeded(stored_at)

    async def close(self) -> None:
        """Wait until no group task runs (their callers wait for them; a blocking
        journal's groups run in their callers' threads). The escape timer stops once no
        append waits."""
        while True:
            with self._tasks_lock:
                running = [t for t in self._group_tasks if not t.done()]
            if not running:
                return
            if ASYNC:
                await asyncio.wait(running)  # not `gather`: cancelling it would cancel them
            else:
                flavour.gather(running)

    async def _insert(
        self, conn: AsyncConnection[Any], statement: Positional, values: list[Any], *, own: bool
    ) -> datetime | None:
        """The batch's db_timestamp; None if `expected_seq_nr` was not current.

        On the pool's own (idle, autocommit) connections a batch runs prepared through
        libpq (`prepared.first_row`); on a caller's connection, whose transaction and
        mode are the caller's, through a cursor.
        """
        try:
            row = await prepared.first_row(conn, statement, values, prepared=own)
        except psycopg.errors.UniqueViolation:
            return None
        return stored_timestamp(row)

    async def highest_seq_nr(
        self, persistence_id: str, conn: AsyncConnection[Any] | None = None
    ) -> int:
        """The highest seq_nr stored for the id (deleted marker rows included), 0 if none."""
        if conn is not None:
            cur = await conn.execute(self._sql.highest, (persistence_id,))
            row = await cur.fetchone()
        else:
            async with self._pool.connection() as own:
                cur = await own.execute(self._sql.highest, (persistence_id,))
                row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> int:
        """Delete events up to `to_seq_nr` (clipped to the highest), keeping a marker row.

        The row at the clipped seq_nr stays as a `deleted = true` marker without
        payload, so the highest seq_nr never goes backwards and is never reused.
        Returns the seq_nr of that marker (0 when there was nothing to delete).
        """
        async with self._pool.connection() as conn, conn.transaction():
            highest = await self.highest_seq_nr(persistence_id, conn)
            target = min(to_seq_nr, highest)
            if target < 1:
                return 0
            await conn.execute(self._sql.delete_before, (persistence_id, target))
            await conn.execute(self._sql.mark_deleted, (persistence_id, target))
            return target


def rolled_back(error: psycopg.Error, conn: AsyncConnection[Any]) -> bool:
    """Whether a failed group statement certainly stored nothing, so that each of its
    appends may run again alone: the server answered with an error (a seq_nr another
    writer took, a row lock not granted in time, a deadlock between such races, a
    value it refused) and the session is still there. Not after a lost connection or
    a server shutting down: the commit may have happened."""
    state = error.sqlstate
    return (
        state is not None
        and not state.startswith(("08", "57P"))
        and not (conn.closed or conn.broken)
    )


def group_error(error: BaseException, pool: JournalPool) -> JournalError:
    """One caller's exception for the group its append was in, which failed with
    `error` (each caller raises its own, `error` as the cause): what the same error
    would have raised from an append alone on `pool`'s connection (a missing journal
    table is `SchemaNotInitialized` there too)."""
    missing = schema_error(pool.tables, error, pool.where)
    if missing is not None:
        return missing
    if isinstance(error, psycopg.Error):
        return journal_error(error)
    return JournalError(
        f"the group carrying this append failed ({type(error).__name__}: {error}); "
        "it may or may not be stored"
    )


@contextlib.asynccontextmanager
async def callers_savepoint(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """A savepoint in the transaction of a caller's connection (`conn=` of a write): the
    caller's transaction is begun first if it has none yet (`opens_caller_transaction`),
    so the savepoint is not the outer transaction, committed before the caller decides.
    An exception in the block rolls back to the savepoint only."""
    if opens_caller_transaction(conn.autocommit, conn.info.transaction_status):
        await conn.execute("SELECT 1")
    async with conn.transaction():
        yield

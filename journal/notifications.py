"""LISTEN/NOTIFY wake-ups: slice queries react in milliseconds instead of polling.

Notifications are hints only. A query that misses one still finds the events on
its next poll, so nothing here is needed for correctness, only for latency.

Why post-commit, from one background task: `NOTIFY` inside a transaction takes
a database-wide lock at commit, which serialises every notifying writer's
commit (and so its WAL flush). Instead, `append` records "entity type X,
slice bucket B changed" in memory after its commit, and one sender per
`Journal` turns everything recorded since its last send into one `pg_notify`
per entity type. At low rates that is one notification per append, sent at
once; after each send the task waits 10 ms, so at high rates many appends
share one and the lock is taken at most ~100 times per second no matter how
many writers there are. Appends made inside a caller's transaction (`conn=`)
notify inside it instead, because only the caller knows when it commits.

Payload: ``"<16 hex digits>:<entity type>"`` — a 64-bit mask of slice buckets
(bucket = slice // 16) followed by the entity type. Channel: see
`Tables.notify_channel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg import AsyncConnection, sql

_log = logging.getLogger("slicejournal.journal.notifications")

SLICES_PER_BUCKET = 16
MIN_SEND_INTERVAL = 0.01
_MASK_DIGITS = 16


def bucket_bit(slice_: int) -> int:
    """The mask bit of the bucket holding `slice_`."""
    return 1 << (slice_ // SLICES_PER_BUCKET)


def bucket_mask(min_slice: int, max_slice: int) -> int:
    """The bucket mask covering an inclusive slice range."""
    mask = 0
    for bucket in range(min_slice // SLICES_PER_BUCKET, max_slice // SLICES_PER_BUCKET + 1):
        mask |= 1 << bucket
    return mask


def encode_payload(entity_type: str, mask: int) -> str:
    """Build a notification payload for an entity type and a bucket mask."""
    return f"{mask:0{_MASK_DIGITS}x}:{entity_type}"


def decode_payload(payload: str) -> tuple[str, int] | None:
    """Split a payload into (entity type, bucket mask); None if it is not ours."""
    if len(payload) <= _MASK_DIGITS or payload[_MASK_DIGITS] != ":":
        return None
    try:
        mask = int(payload[:_MASK_DIGITS], 16)
    except ValueError:
        return None
    return payload[_MASK_DIGITS + 1 :], mask


async def send_notification(
    conn: AsyncConnection[Any], channel: str, entity_type: str, mask: int
) -> None:
    """Issue one `pg_notify` (inside whatever transaction `conn` is in)."""
    await conn.execute("SELECT pg_notify(%s, %s)", (channel, encode_payload(entity_type, mask)))


Connect = Callable[[], Awaitable[AsyncConnection[Any]]]


class Notifier:
    """Coalesces post-commit change hints and sends them from one background task."""

    def __init__(self, channel: str, connect: Connect) -> None:
        self._channel = channel
        self._connect = connect
        self._pending: dict[str, int] = {}
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._conn: AsyncConnection[Any] | None = None
        self._closed = False

    def changed(self, entity_type: str, slice_: int) -> None:
        """Record a committed change; it will be sent soon, merged with others."""
        if self._closed:
            return
        self._pending[entity_type] = self._pending.get(entity_type, 0) | bucket_bit(slice_)
        self._wakeup.set()
        self._idle.clear()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="notifier")

    async def _run(self) -> None:
        while not self._closed:
            await self._wakeup.wait()
            self._wakeup.clear()
            pending, self._pending = self._pending, {}
            if pending:
                try:
                    await self._send(pending)
                except Exception as e:  # a hint is lost; pollers still find the events
                    _log.debug("dropping notification after error: %s", e)
                    await self._reset()
            if not self._pending:
                self._idle.set()
            # Whatever arrives in the next few ms shares the next notification:
            # at most ~1/MIN_SEND_INTERVAL notifying commits per second.
            await asyncio.sleep(MIN_SEND_INTERVAL)

    async def _send(self, pending: dict[str, int]) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect()
            # A hint lost in a crash costs nothing, so its commit need not wait for the disk.
            await self._conn.execute("SET synchronous_commit = off")
        for entity_type, mask in pending.items():
            await send_notification(self._conn, self._channel, entity_type, mask)

    async def _reset(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
        self._conn = None

    async def flush(self) -> None:
        """Wait until everything recorded so far has been sent (used by close and tests)."""
        if self._task is not None and not self._task.done():
            await self._idle.wait()

    async def close(self) -> None:
        await self.flush()
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._reset()


class _Subscription:
    def __init__(self, entity_type: str, mask: int) -> None:
        self.entity_type = entity_type
        self.mask = mask
        self.event = asyncio.Event()


async def wait_for_wakeup(event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set or `seconds` pass; True if it was set (and clear it).

    `asyncio.timeout` rather than `asyncio.wait_for`: on Python 3.11 the latter
    can swallow a cancellation that arrives as the event fires, which would
    leave a cancelled stream running.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    if event.is_set():
        event.clear()
        return True
    return False


class NotificationListener:
    """One LISTEN connection per `Journal`, fanned out to every live query.

    It reconnects (with backoff) after a server restart or a killed backend;
    each reconnect wakes every subscriber, since a notification may have been
    lost while it was down.
    """

    def __init__(self, channel: str, connect: Connect) -> None:
        self._channel = channel
        self._connect = connect
        self._subs: weakref.WeakSet[_Subscription] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self._conn: AsyncConnection[Any] | None = None

    def subscribe(self, entity_type: str, min_slice: int, max_slice: int) -> _Subscription:
        """A subscription whose `event` is set when a matching notification arrives."""
        sub = _Subscription(entity_type, bucket_mask(min_slice, max_slice))
        self._subs.add(sub)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="listener")
        return sub

    def unsubscribe(self, sub: _Subscription) -> None:
        self._subs.discard(sub)

    def _wake_all(self) -> None:
        for sub in list(self._subs):
            sub.event.set()

    def _dispatch(self, payload: str) -> None:
        decoded = decode_payload(payload)
        if decoded is None:
            return
        entity_type, mask = decoded
        for sub in list(self._subs):
            if sub.entity_type == entity_type and sub.mask & mask:
                sub.event.set()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                conn = await self._connect()
                self._conn = conn
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                backoff = 0.05
                self._wake_all()
                async for notify in conn.notifies():
                    self._dispatch(notify.payload)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                _log.info("notification listener lost its connection (%s); reconnecting", e)
            finally:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        await self._conn.close()
                    self._conn = None
            self._wake_all()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

# Generated from journal/aio/notifications.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The NOTIFY sender and the LISTEN fan-out of one journal (see journal/notifications.py).

The sender coalesces post-commit change hints in one background task (a
thread in the sync flavour); the listener holds one LISTEN connection and
wakes the live queries whose entity type and slice buckets a notification
names. Both reconnect on their own; a lost hint costs latency, never an event.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from psycopg import Connection, sql

from journal.notifications import (
    MIN_SEND_INTERVAL,
    bucket_bit,
    bucket_mask,
    decode_payload,
    encode_payload,
)
from journal.sync.flavour import (
    CancelledError,
    Event,
    Task,
    cancel_and_wait,
    checkpoint,
    sleep,
    spawn,
    wait_event,
)

_log = logging.getLogger("slicejournal.journal.notifications")

# How long the listener waits for a notification before it checks for its own end.
_LISTEN_SLICE_SECONDS = 1.0

Connect = Callable[[], Connection[Any]]


def send_notification(conn: Connection[Any], channel: str, entity_type: str, mask: int) -> None:
    """Issue one `pg_notify` (inside whatever transaction `conn` is in)."""
    conn.execute("SELECT pg_notify(%s, %s)", (channel, encode_payload(entity_type, mask)))


class Notifier:
    """Coalesces post-commit change hints and sends them from one background task."""

    def __init__(self, channel: str, connect: Connect) -> None:
        self._channel = channel
        self._connect = connect
        # `changed` may be called from several threads in the sync flavour.
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._wakeup = Event()
        self._idle = Event()
        self._idle.set()
        self._task: Task[None] | None = None
        self._conn: Connection[Any] | None = None
        self._closed = False

    def changed(self, entity_type: str, slice_: int) -> None:
        """Record a committed change; it will be sent soon, merged with others."""
        with self._lock:
            if self._closed:
                return
            self._pending[entity_type] = self._pending.get(entity_type, 0) | bucket_bit(slice_)
            self._idle.clear()
            self._wakeup.set()
            if self._task is None:
                self._task = spawn(self._run, name="slicejournal-notifier")

    def _run(self) -> None:
        while not self._closed:
            wait_event(self._wakeup, None)
            with self._lock:
                self._wakeup.clear()
                pending, self._pending = self._pending, {}
            if pending:
                try:
                    self._send(pending)
                except Exception as e:  # a hint is lost; pollers still find the events
                    _log.debug("dropping notification after error: %s", e)
                    self._reset()
            with self._lock:
                if not self._pending:
                    self._idle.set()
            # Whatever arrives in the next few ms shares the next notification:
            # at most ~1/MIN_SEND_INTERVAL notifying commits per second.
            sleep(MIN_SEND_INTERVAL)

    def _send(self, pending: dict[str, int]) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            # A hint lost in a crash costs nothing, so its commit need not wait for the disk.
            self._conn.execute("SET synchronous_commit = off")
        for entity_type, mask in pending.items():
            send_notification(self._conn, self._channel, entity_type, mask)

    def _reset(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def flush(self) -> None:
        """Wait until everything recorded so far has been sent (used by close and tests)."""
        if self._task is not None and not self._task.done():
            wait_event(self._idle, None)

    def close(self) -> None:
        """Send what is pending, then stop the task and close its connection."""
        self.flush()
        with self._lock:
            self._closed = True
        cancel_and_wait(self._task)
        self._reset()


class Subscription:
    """One live query's interest: its `event` is set when a matching notification arrives."""

    def __init__(self, entity_type: str, mask: int) -> None:
        self.entity_type = entity_type
        self.mask = mask
        self.event = Event()


def wait_for_wakeup(event: Event, seconds: float) -> bool:
    """Wait until `event` is set or `seconds` pass; True if it was set (and clear it)."""
    if wait_event(event, seconds):
        event.clear()
        return True
    return False


class NotificationListener:
    """One LISTEN connection per journal, fanned out to every live query.

    It reconnects (with backoff) after a server restart or a killed backend;
    each reconnect wakes every subscriber, since a notification may have been
    lost while it was down.
    """

    def __init__(self, channel: str, connect: Connect) -> None:
        self._channel = channel
        self._connect = connect
        self._lock = threading.Lock()
        self._subs: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self._task: Task[None] | None = None
        self._conn: Connection[Any] | None = None

    def subscribe(self, entity_type: str, min_slice: int, max_slice: int) -> Subscription:
        """A subscription whose `event` is set when a matching notification arrives."""
        sub = Subscription(entity_type, bucket_mask(min_slice, max_slice))
        with self._lock:
            self._subs.add(sub)
            if self._task is None:
                self._task = spawn(self._run, name="slicejournal-listener")
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop waking `sub`."""
        with self._lock:
            self._subs.discard(sub)

    def _subscribers(self) -> list[Subscription]:
        with self._lock:
            return list(self._subs)

    def _wake_all(self) -> None:
        for sub in self._subscribers():
            sub.event.set()

    def _dispatch(self, payload: str) -> None:
        decoded = decode_payload(payload)
        if decoded is None:
            return
        entity_type, mask = decoded
        for sub in self._subscribers():
            if sub.entity_type == entity_type and sub.mask & mask:
                sub.event.set()

    def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                conn = self._connect()
                self._conn = conn
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                backoff = 0.05
                self._wake_all()
                while True:
                    # In slices, so that a thread (sync flavour) sees its cancellation.
                    for notify in conn.notifies(timeout=_LISTEN_SLICE_SECONDS):
                        self._dispatch(notify.payload)
                    checkpoint()
            except CancelledError:
                raise
            except Exception as e:
                _log.info("notification listener lost its connection (%s); reconnecting", e)
            finally:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None
            self._wake_all()
            sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def close(self) -> None:
        """Stop listening and close the connection."""
        cancel_and_wait(self._task)
        self._task = None

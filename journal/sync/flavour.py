"""The blocking flavour of the primitives in `journal/aio/flavour.py`.

The generated sync drivers call these under the same names as the asyncio
ones. A spawned function runs in a daemon thread; since a thread cannot be
interrupted from outside, cancelling one sets a flag that every waiting
primitive here (`sleep`, `wait_event`, `queue_get`, `queue_put`, `checkpoint`)
checks, raising `CancelledError` in that thread — the same points where an
asyncio task would see its cancellation. Code outside a spawned thread (the
caller's own) waits plainly.
"""

from __future__ import annotations

import contextlib
import inspect
import queue as _queue
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

from journal.errors import InvalidArgument

T = TypeVar("T")

ASYNC: Final = False

# How often a cancellable wait looks at its thread's cancel flag.
_CANCEL_CHECK_SECONDS = 0.05

Event = threading.Event
Lock = threading.Lock


class CancelledError(BaseException):
    """Raised inside a spawned thread at a waiting point after `cancel_and_wait`."""


class Queue(_queue.Queue[T], Generic[T]):
    """A thread-safe FIFO (the asyncio flavour's `asyncio.Queue`)."""

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)


_local = threading.local()


def _cancel_flag() -> threading.Event | None:
    flag: threading.Event | None = getattr(_local, "cancel", None)
    return flag


def checkpoint() -> None:
    """Raise `CancelledError` if this thread was spawned and has been cancelled."""
    flag = _cancel_flag()
    if flag is not None and flag.is_set():
        raise CancelledError()


class Task(Generic[T]):
    """A function running in a daemon thread, cancellable at its waiting points."""

    def __init__(self, function: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        self.name = name
        self._function = function
        self._args = args
        self._cancel = threading.Event()
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        _local.cancel = self._cancel
        try:
            self._function(*self._args)
        except CancelledError:
            self._cancelled = True
        except BaseException as e:  # kept for the spawner, as a task keeps its exception
            self._error = e

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def cancelled(self) -> bool:
        return self.done() and self._cancelled

    def exception(self) -> BaseException | None:
        return self._error


def spawn(function: Callable[..., None], *args: Any, name: str) -> Task[None]:
    """Run `function(*args)` in a daemon thread."""
    task: Task[None] = Task(function, args, name)
    task.start()
    return task


Timer = threading.Timer


def call_later(seconds: float, function: Callable[..., None], *args: Any) -> threading.Timer:
    """Call `function(*args)` after `seconds`, in a daemon thread; `.cancel()` stops it."""
    timer = threading.Timer(seconds, function, args)
    timer.daemon = True
    timer.start()
    return timer


def cancel_and_wait(task: Task[Any] | None) -> None:
    """Cancel a spawned thread and wait until it has ended (its error, if any, dropped)."""
    if task is None:
        return
    task.cancel()
    task.join()


def gather(tasks: list[Task[None]]) -> list[BaseException | None]:
    """Wait for every thread; each one's exception (or None), in order."""
    for task in tasks:
        task.join()
    return [task.exception() for task in tasks]


def task_failure(task: Task[Any]) -> BaseException | None:
    """The exception a finished thread ended with (None while running, or if it returned)."""
    return task.exception() if task.done() else None


def sleep(seconds: float) -> None:
    """`time.sleep`, cut short by `CancelledError` in a cancelled spawned thread."""
    flag = _cancel_flag()
    if flag is None:
        time.sleep(max(0.0, seconds))
    elif flag.wait(max(0.0, seconds)):
        raise CancelledError()


def wait_event(event: threading.Event, seconds: float | None) -> bool:
    """Wait until `event` is set or `seconds` pass; True if it is set."""
    flag = _cancel_flag()
    if flag is None:
        return event.wait(seconds)
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        checkpoint()
        step = _CANCEL_CHECK_SECONDS
        if deadline is not None:
            step = min(step, deadline - time.monotonic())
            if step <= 0:
                return event.is_set()
        if event.wait(step):
            return True


def queue_get(queue: Queue[T], seconds: float) -> T | None:
    """The next item, or None if none arrives within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        checkpoint()
        step = min(_CANCEL_CHECK_SECONDS, deadline - time.monotonic())
        if _cancel_flag() is None:
            step = deadline - time.monotonic()
        with contextlib.suppress(_queue.Empty):
            return queue.get(timeout=max(0.0, step))
        if time.monotonic() >= deadline:
            return None


def queue_put(queue: Queue[T], item: T) -> None:
    """Put `item`, waiting while the queue is full (cancellable)."""
    while True:
        checkpoint()
        try:
            queue.put(item, timeout=_CANCEL_CHECK_SECONDS)
            return
        except _queue.Full:
            continue


def queue_offer(queue: Queue[T], item: T) -> bool:
    """Put `item` without waiting; False if the queue is full."""
    try:
        queue.put_nowait(item)
    except _queue.Full:
        return False
    return True


def call_back(what: str, result: Any) -> None:
    """What a user's callback returned (`what` names it), refusing an awaitable: the sync
    API does not await, so an async callback's work would silently never run."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # no "never awaited" warning on top of the error
        raise InvalidArgument(
            f"{what} returned an awaitable ({type(result).__name__}), which the sync API "
            "cannot run: make it a plain `def`, or use the asyncio API"
        )

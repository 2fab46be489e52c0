"""The asyncio flavour of the few primitives the drivers wait, spawn and queue with.

Every driver module under `journal/aio/` and `projections/aio/` is the one
source of its behaviour; `tools/async_to_sync.py` writes its blocking twin
under `sync/` by dropping `async`/`await` and renaming a fixed set of names.
What cannot be renamed — a task versus a thread, a cancellable wait — is
written here once per flavour, with the same names and signatures in
`journal/sync/flavour.py`, so the generated code reads the same in both.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from journal.errors import InvalidArgument

T = TypeVar("T")

ASYNC: Final = True

CancelledError = asyncio.CancelledError
Event = asyncio.Event
Lock = asyncio.Lock
Queue = asyncio.Queue
Task = asyncio.Task
sleep = asyncio.sleep


def spawn(
    function: Callable[..., Coroutine[Any, Any, None]], *args: Any, name: str
) -> asyncio.Task[None]:
    """Run `function(*args)` concurrently (a task here, a thread in the sync flavour)."""
    return asyncio.get_running_loop().create_task(function(*args), name=name)


Timer = asyncio.TimerHandle


def call_later(seconds: float, function: Callable[..., None], *args: Any) -> asyncio.TimerHandle:
    """Call `function(*args)` after `seconds`, on the running loop; `.cancel()` stops it."""
    return asyncio.get_running_loop().call_later(seconds, function, *args)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a spawned task and wait until it has ended (its error, if any, dropped)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def gather(tasks: list[asyncio.Task[None]]) -> list[BaseException | None]:
    """Wait for every task; each one's exception (or None), in order."""
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


def task_failure(task: asyncio.Task[Any]) -> BaseException | None:
    """The exception a finished task ended with (None while running, or if it returned)."""
    if not task.done() or task.cancelled():
        return None
    return task.exception()


async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until `event` is set or `seconds` pass; True if it is set.

    `asyncio.timeout` rather than `asyncio.wait_for`: on Python 3.11 the latter
    can swallow a cancellation that arrives as the event fires, which would
    leave a cancelled stream running.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


async def queue_get(queue: asyncio.Queue[T], seconds: float) -> T | None:
    """The next item, or None if none arrives within `seconds`."""
    if not queue.empty():
        return queue.get_nowait()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            return await queue.get()
    return None


async def queue_put(queue: asyncio.Queue[T], item: T) -> None:
    """Put `item`, waiting while the queue is full."""
    await queue.put(item)


def queue_offer(queue: asyncio.Queue[T], item: T) -> bool:
    """Put `item` without waiting; False if the queue is full."""
    try:
        queue.put_nowait(item)
    except asyncio.QueueFull:
        return False
    return True


async def checkpoint() -> None:
    """A point where a cancelled task stops (the sync flavour's threads check here)."""
    await asyncio.sleep(0)


async def call_back(what: str, result: Any) -> None:
    """Await what a user's callback returned (`what` names it), refusing a result that is
    not awaitable: a lambda passed as an async callback returns what its body does."""
    if not inspect.isawaitable(result):
        raise InvalidArgument(
            f"{what} returned {result!r}, not an awaitable: the asyncio API awaits it "
            "(make it `async def`)"
        )
    await result

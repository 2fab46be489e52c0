"""Which flavour a user's callable is, decided when it is handed over.

The asyncio API awaits the callables it is given (projection handlers, a durable
state store's change handler) and the sync one calls them in a thread; one of the
other flavour would never run, or fail at its first use. Both packages check
with `is_async_callable` when the callable is passed in, so the mistake is an
error at construction, not a silent loss later.
"""

from __future__ import annotations

import functools
import inspect

from journal.errors import InvalidArgument


def unwrapped(function: object) -> object:
    """`function` without its `functools.partial` layers."""
    while isinstance(function, functools.partial):
        function = function.func
    return function


def is_async_callable(function: object) -> bool:
    """Whether calling `function` makes a coroutine: an `async def` function or method,
    one wrapped in `functools.partial`, or an object whose `__call__` is `async def`."""
    target = unwrapped(function)
    if inspect.iscoroutinefunction(target):
        return True
    if inspect.isroutine(target) or inspect.isclass(target) or not callable(target):
        return False
    return inspect.iscoroutinefunction(type(target).__call__)


def describe(function: object, role: str) -> str:
    """`role 'name'`, the callable's name as its user wrote it, for messages."""
    target = unwrapped(function)
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{role} {name!r}"


def check_flavour(
    function: object, *, asynchronous: bool, what: str, async_api: str, sync_api: str
) -> None:
    """Refuse a callable of the other flavour when it is handed over, not at its first
    call: `async_api` awaits it, so it needs an `async def`; `sync_api` calls it
    without an event loop, so an `async def` one would never run. `what` names it.

    A lambda passes the asyncio check: it may return an awaitable (`lambda conn, env:
    apply(conn, env, extra)`), which is checked where it is called.
    """
    if asynchronous:
        if is_async_callable(function) or getattr(unwrapped(function), "__name__", "") == (
            "<lambda>"
        ):
            return
        raise InvalidArgument(
            f"{what} is not an async function, but {async_api} awaits it: make it "
            f"`async def`, or use {sync_api} for a blocking one"
        )
    if is_async_callable(function):
        raise InvalidArgument(
            f"{what} is an async function, but {sync_api} calls it without an event loop "
            f"(it would never run): make it a plain `def`, or use {async_api} for an "
            "async one"
        )

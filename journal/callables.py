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

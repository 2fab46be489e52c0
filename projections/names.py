"""How projection instances are named and checked, for every runner and for management.

Pure: a projection's name and its instance key (the slice range, as Pekko
names it) are validated the same way wherever an instance is built.
"""

from __future__ import annotations

import attrs

from journal.callables import is_async_callable, unwrapped
from journal.errors import InvalidArgument
from journal.slices import SliceRange, validate_entity_type

ALL_RANGES = "*"  # the management key that pauses every instance


def validate_name(name: object) -> str:
    """Return `name` if it can name a projection, else raise `InvalidArgument`."""
    if not isinstance(name, str) or not name or len(name) > 255 or "\x00" in name:
        raise InvalidArgument(
            f"projection name must be a non-empty str up to 255 chars, got {name!r}"
        )
    return name


@attrs.frozen
class InstanceSpec:
    """What a projection instance is built from, validated by `check_instance`: name,
    entity type, slice range and the range's key."""

    name: str
    entity_type: str
    slice_range: SliceRange
    key: str


def check_instance(
    name: object, entity_type: object, slice_range: object, handler: object
) -> InstanceSpec:
    """Validate what every runner is built from, before anything runs."""
    slice_range = SliceRange.check(slice_range)
    if not callable(handler):
        raise InvalidArgument("handler must be a callable")
    return InstanceSpec(
        validate_name(name), validate_entity_type(entity_type), slice_range, slice_range.key
    )


# A handler's flavour, as the journal decides it for its own callables.
_unwrapped = unwrapped
is_async_handler = is_async_callable


def _describe(handler: object) -> str:
    target = _unwrapped(handler)
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"handler {name!r}"


def check_handler_flavour(handler: object, *, asynchronous: bool) -> None:
    """Refuse a handler of the other flavour when the projection is built, not at its
    first event: `Projection` (asyncio) awaits its handler, so it needs an `async def`;
    `SyncProjection` calls it in a thread, so an `async def` one would never run.

    A lambda passes the asyncio check: it may return an awaitable (`lambda conn, env:
    apply(conn, env, extra)`), which the runner awaits.
    """
    if asynchronous:
        target = _unwrapped(handler)
        if is_async_handler(handler) or getattr(target, "__name__", None) == "<lambda>":
            return
        raise InvalidArgument(
            f"{_describe(handler)} is not an async function, but Projection awaits its "
            "handler: make it `async def`, or use SyncProjection (SyncJournal) for a "
            "blocking handler"
        )
    if is_async_handler(handler):
        raise InvalidArgument(
            f"{_describe(handler)} is an async function, but SyncProjection calls its "
            "handler without an event loop (it would never run): make it a plain `def`, "
            "or use Projection (Journal, asyncio) for an async handler"
        )

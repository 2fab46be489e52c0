"""How projection instances are named and checked, for every runner and for management.

Pure: a projection's name and its instance key (the slice range, as Pekko
names it) are validated the same way wherever an instance is built.
"""

from __future__ import annotations

import attrs

from journal.callables import check_flavour, describe, is_async_callable
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
is_async_handler = is_async_callable


def check_handler_flavour(handler: object, *, asynchronous: bool) -> None:
    """Refuse a handler of the other flavour when the projection is built, not at its
    first event: `Projection` (asyncio) awaits its handler, so it needs an `async def`;
    `SyncProjection` calls it in a thread, so an `async def` one would never run
    (`journal.callables.check_flavour`, a lambda passing the asyncio check)."""
    check_flavour(
        handler, asynchronous=asynchronous, what=describe(handler, "handler"),
        async_api="Projection (Journal, asyncio)", sync_api="SyncProjection (SyncJournal)",
    )  # fmt: skip


def wrong_journal(journal: object, *, asynchronous: bool) -> InvalidArgument:
    """The error for a projection built over something other than its flavour's journal
    (`Projection` reads a `Journal`, `SyncProjection` a `SyncJournal`): the other
    flavour's journal is told which projection reads it, and `Journal.connect(...)`
    not yet entered is told to enter it."""
    flavours = (("Projection", "Journal", "async with"), ("SyncProjection", "SyncJournal", "with"))
    (projection, wanted, enter), (other_projection, other, _) = (
        flavours if asynchronous else flavours[::-1]
    )
    got = type(journal).__name__
    message = f"{projection} reads a {wanted}, got {got}"
    if got == other:
        message += f": a {other} is read by {other_projection}"
    elif hasattr(journal, "__aenter__") or hasattr(journal, "__enter__"):
        message += (
            f", a context manager: build the projection of the journal it opens "
            f"(`{enter} {wanted}.connect(...) as journal:`)"
        )
    return InvalidArgument(message)

"""A handler of the wrong flavour is refused when the projection is built, not at its
first event: `Projection` (asyncio) needs an async handler, `SyncProjection` a blocking
one. The check lives in the async runner, the one source of both runners, so this
also shows that the generated sync twin checks the other way round."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from journal import InvalidArgument, JournalSettings, SerializerRegistry, SliceRange
from journal.aio.journal import Journal
from journal.sync.journal import SyncJournal
from projections import Projection, SyncProjection
from projections.names import is_async_handler

# Built, never opened: constructing a projection does no I/O.
DSN = "postgresql://nobody@127.0.0.1:1/none"


async def async_one(conn: Any, env: Any) -> None: ...


def sync_one(conn: Any, env: Any) -> None: ...


async def async_three(conn: Any, env: Any, extra: int) -> None: ...


def sync_three(conn: Any, env: Any, extra: int) -> None: ...


class AsyncCallable:
    async def __call__(self, conn: Any, env: Any) -> None: ...

    async def method(self, conn: Any, env: Any) -> None: ...


class SyncCallable:
    def __call__(self, conn: Any, env: Any) -> None: ...

    def method(self, conn: Any, env: Any) -> None: ...


ASYNC_HANDLERS: dict[str, Callable[..., Any]] = {
    "async def": async_one,
    "partial of async def": functools.partial(async_three, extra=1),
    "partial of a partial": functools.partial(functools.partial(async_three), extra=1),
    "object with async __call__": AsyncCallable(),
    "bound async method": AsyncCallable().method,
    "partial of async callable object": functools.partial(AsyncCallable()),
}
SYNC_HANDLERS: dict[str, Callable[..., Any]] = {
    "def": sync_one,
    "partial of def": functools.partial(sync_three, extra=1),
    "object with __call__": SyncCallable(),
    "bound method": SyncCallable().method,
    "builtin": print,
}


@pytest.fixture(scope="module")
def journals() -> Iterator[tuple[Journal, SyncJournal]]:
    settings = JournalSettings()
    yield (
        Journal(DSN, settings, SerializerRegistry()),
        SyncJournal(DSN, settings, SerializerRegistry()),
    )


FACTORIES = ("exactly_once", "grouped", "at_least_once")


def build_async(journal: Journal, factory: str, handler: Any) -> Projection:
    make = getattr(Projection, factory)
    return make(journal, name="p", entity_type="T", slice_range=SliceRange.FULL, handler=handler)  # type: ignore[no-any-return]


def build_sync(journal: SyncJournal, factory: str, handler: Any) -> SyncProjection:
    make = getattr(SyncProjection, factory)
    return make(journal, name="p", entity_type="T", slice_range=SliceRange.FULL, handler=handler)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ASYNC_HANDLERS)
def test_async_handlers_are_recognised(kind: str) -> None:
    assert is_async_handler(ASYNC_HANDLERS[kind])


@pytest.mark.parametrize("kind", SYNC_HANDLERS)
def test_sync_handlers_are_recognised(kind: str) -> None:
    assert not is_async_handler(SYNC_HANDLERS[kind])


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("kind", SYNC_HANDLERS)
def test_projection_refuses_a_blocking_handler(
    journals: tuple[Journal, SyncJournal], kind: str, factory: str
) -> None:
    with pytest.raises(InvalidArgument, match=r"not an async function.*use SyncProjection"):
        build_async(journals[0], factory, SYNC_HANDLERS[kind])


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("kind", ASYNC_HANDLERS)
def test_projection_takes_an_async_handler(
    journals: tuple[Journal, SyncJournal], kind: str, factory: str
) -> None:
    assert build_async(journals[0], factory, ASYNC_HANDLERS[kind]).name == "p"


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("kind", ASYNC_HANDLERS)
def test_sync_projection_refuses_an_async_handler(
    journals: tuple[Journal, SyncJournal], kind: str, factory: str
) -> None:
    with pytest.raises(InvalidArgument, match=r"is an async function.*use Projection"):
        build_sync(journals[1], factory, ASYNC_HANDLERS[kind])


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("kind", SYNC_HANDLERS)
def test_sync_projection_takes_a_blocking_handler(
    journals: tuple[Journal, SyncJournal], kind: str, factory: str
) -> None:
    assert build_sync(journals[1], factory, SYNC_HANDLERS[kind]).name == "p"


def test_a_lambda_may_return_an_awaitable() -> None:
    """A lambda passes the asyncio check (it may return a coroutine), and the sync one."""
    handler = lambda conn, env: async_three(conn, env, 1)  # noqa: E731
    journal = Journal(DSN, JournalSettings(), SerializerRegistry())
    assert build_async(journal, "exactly_once", handler).name == "p"
    sync_journal = SyncJournal(DSN, JournalSettings(), SerializerRegistry())
    assert build_sync(sync_journal, "exactly_once", lambda conn, env: None).name == "p"


def test_the_error_names_the_handler(journals: tuple[Journal, SyncJournal]) -> None:
    with pytest.raises(InvalidArgument, match="handler 'sync_one'"):
        build_async(journals[0], "grouped", sync_one)
    with pytest.raises(InvalidArgument, match="handler 'AsyncCallable'"):
        build_sync(journals[1], "grouped", AsyncCallable())


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_projection_refuses_the_other_flavours_journal(
    journals: tuple[Journal, SyncJournal], factory: str
) -> None:
    """A handler of the right flavour does not make up for a journal of the wrong one:
    the projection says, when it is built, which journal it reads and which projection
    reads the one it got."""
    journal, sync_journal = journals
    with pytest.raises(
        InvalidArgument,
        match=r"^Projection reads a Journal, got SyncJournal: a SyncJournal is read by "
        r"SyncProjection$",
    ):
        build_async(sync_journal, factory, async_one)  # type: ignore[arg-type]
    with pytest.raises(
        InvalidArgument,
        match=r"^SyncProjection reads a SyncJournal, got Journal: a Journal is read by "
        r"Projection$",
    ):
        build_sync(journal, factory, sync_one)  # type: ignore[arg-type]


def test_a_journal_not_yet_opened_is_told_to_open_it() -> None:
    """`Journal.connect(...)` returns a context manager: handed over as it is, the
    projection says to build it of the journal the `async with` opens."""
    connecting = Journal.connect(DSN)
    with pytest.raises(InvalidArgument, match=r"context manager.*async with Journal\.connect"):
        build_async(connecting, "grouped", async_one)  # type: ignore[arg-type]
    sync_connecting = SyncJournal.connect(DSN)
    with pytest.raises(InvalidArgument, match=r"context manager.*with SyncJournal\.connect"):
        build_sync(sync_connecting, "grouped", sync_one)  # type: ignore[arg-type]

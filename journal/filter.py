"""Which events a consumer wants: `EventFilter`, evaluated by PostgreSQL.

A projection that cares about one event type in ten should not read, ship and
decode the other nine. A filter is a condition on the journal row — any of the
given serializer manifests, any of the given tags, and an optional SQL
expression — that the slice query adds to its statements, so the server
decides and a filtered-out row never has its payload shipped or decoded.

It cannot simply leave those rows out: a projection's offset store needs every
seq_nr of an id, or it would take the missing ones for a gap and look for them.
So, as Pekko's filtered envelopes do, a filtered-out row comes back as its key
only (id, seq_nr, timestamp, slice; no payload, tags or metadata), and the
consumer records its offset without handing it to a handler. A plain query
stream with a filter yields only the matching envelopes.

`where` is application code, trusted like the handler itself: it is spliced
into the statement as written (never build it from user input). The manifests
and tags are bound parameters. Pure (no database import): the condition is
built by `journal.query.sql.filter_condition`, beside the statements it joins.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from journal.errors import InvalidArgument

__all__ = ["EventFilter"]


def _strings(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidArgument(f"EventFilter.{name} must be a sequence of strings, got {value!r}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str) or not item:
            raise InvalidArgument(f"EventFilter.{name} must hold non-empty strings, got {item!r}")
    return items


def _manifests(value: object) -> tuple[str, ...]:
    return _strings("manifests", value)


def _tags(value: object) -> tuple[str, ...]:
    return _strings("tags", value)


def _where(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(
            f"EventFilter.where must be a non-empty SQL expression, got {value!r}"
        )
    return value


@attrs.frozen
class EventFilter:
    """The events a query or projection delivers: every given part must hold.

    * `manifests`: the event's serializer manifest is one of these (the names
      given to `SerializerRegistry.register`);
    * `tags`: the event carries at least one of these (`append(..., tags=)`);
    * `where`: a boolean SQL expression over the journal row's columns
      (`persistence_id`, `seq_nr`, `event_ser_manifest`, `tags`, `writer`, ...).
      Trusted application code, inserted as written: never build it from user
      input. It runs in the journal's read sessions, whose time zone is UTC:
      write a zone-dependent expression with its zone (`db_timestamp AT TIME
      ZONE 'Europe/Berlin'`, a literal with an offset).

    An empty filter (no part given) delivers everything. Tombstones
    (`Journal.delete_all`) are always delivered: an erasure must reach every
    consumer.
    """

    manifests: tuple[str, ...] = attrs.field(default=(), converter=_manifests)
    tags: tuple[str, ...] = attrs.field(default=(), converter=_tags)
    where: str | None = attrs.field(default=None, converter=_where)

    @property
    def is_empty(self) -> bool:
        """True when the filter lets every event through."""
        return not (self.manifests or self.tags or self.where)


def check_filter(value: object) -> EventFilter | None:
    """`filter=` of a query or projection: None, or an `EventFilter` (empty: None)."""
    if value is None:
        return None
    if not isinstance(value, EventFilter):
        raise InvalidArgument(f"filter must be an EventFilter or None, got {value!r}")
    return None if value.is_empty else value

"""The row decoder: one row or a batch, the same envelopes, errors carried not raised."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest

from journal.durable_state import DurableStateChange
from journal.errors import DeserializationError
from journal.model import (
    NOT_LOADED,
    TOMBSTONE_MANIFEST,
    TOMBSTONE_SER_ID,
    UNDECODABLE,
    EventEnvelope,
    TimestampOffset,
    new_envelope,
)
from journal.rows import row_to_envelope, rows_to_envelopes
from journal.serialization import SerializerRegistry

TS = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
OFFSET = TimestampOffset(TS, TS, {"A|1": 1})


@attrs.frozen
class Deposited:
    amount: int


def registry() -> SerializerRegistry:
    r = SerializerRegistry()
    r.register(Deposited, "bank.Deposited")
    return r


def row(
    seq_nr: int,
    payload: bytes | None,
    *,
    ser_id: int = 31,
    manifest: str = "",
    meta: bytes | None = None,
    tags: list[str] | None = None,
) -> tuple[Any, ...]:
    return ("A|1", "A", 7, seq_nr, TS, "w", tags, ser_id, manifest,
            31 if meta is not None else None, "" if meta is not None else None, meta, payload,
            TS)  # fmt: skip


ROWS = [
    row(1, b'{"amount": 1}', tags=["x", "y"]),
    row(2, b'{"amount": 2}', manifest="bank.Deposited"),
    row(3, b"not json"),
    row(4, b'{"amount": "two"}', manifest="bank.Deposited"),
    row(5, b"{}", ser_id=99),
    row(6, None),
    row(7, b'{"amount": 7}', meta=b'{"trace": "t"}'),
    row(8, b"[123456789012345678901234567890]"),
    row(9, None, ser_id=TOMBSTONE_SER_ID, manifest=TOMBSTONE_MANIFEST),
    row(10, b'{"amount": 10}', meta=b"{bad"),
]


def test_a_batch_decodes_each_row_as_a_single_row_would() -> None:
    r = registry()
    batch = rows_to_envelopes([(x, OFFSET) for x in ROWS], r, source="query")
    single = [row_to_envelope(x, r, source="query", offset=OFFSET) for x in ROWS]
    assert [comparable(e) for e in batch] == [comparable(e) for e in single]


def comparable(env: EventEnvelope) -> tuple[Any, ...]:
    """The envelope's fields, its error (compared by identity) as its text."""
    fields = attrs.astuple(env, recurse=False)
    return (*fields[:-2], None if env.error is None else str(env.error), fields[-1])


def test_what_each_row_becomes() -> None:
    envs = rows_to_envelopes([(x, OFFSET) for x in ROWS], registry(), source="query")
    assert envs[0].event == {"amount": 1} and envs[0].tags == ("x", "y")
    assert envs[1].event == Deposited(2)
    for bad in (envs[2], envs[3], envs[4], envs[9]):
        assert bad.event is UNDECODABLE
        assert isinstance(bad.error, DeserializationError)
        assert "A|1" in str(bad.error) and str(bad.seq_nr) in str(bad.error)
    assert envs[5].event is NOT_LOADED and envs[5].error is None
    assert envs[6].event == {"amount": 7} and envs[6].metadata == {"trace": "t"}
    assert envs[7].event == [123456789012345678901234567890]  # exact, not a float
    assert envs[8].deleted and envs[8].event is None
    assert all(e.offset is OFFSET and e.source == "query" for e in envs)


def test_the_fast_constructor_builds_the_same_immutable_envelope() -> None:
    values = ("A|1", "A", 7, 1, TS, {"a": 1}, 31, "", ("t",), None, "w", OFFSET, "query",
              None, False)  # fmt: skip
    fast = new_envelope(*values)
    assert fast == EventEnvelope(*values)
    assert type(fast) is EventEnvelope and type(fast.offset) is TimestampOffset
    assert hash(fast.offset) == hash(OFFSET)
    assert pickle.loads(pickle.dumps(fast)) == fast
    # Code written when the envelope was an attrs class keeps working.
    assert attrs.evolve(fast, source="load").source == "load"
    assert attrs.asdict(fast, recurse=False)["persistence_id"] == "A|1"
    assert fast._replace(seq_nr=2).seq_nr == 2 and fast.seq_nr == 1
    with pytest.raises(AttributeError):
        fast.seq_nr = 2  # type: ignore[misc]
    with pytest.raises(TypeError):  # a tuple underneath, but not ordered as one
        assert fast < fast  # type: ignore[operator]


@pytest.mark.parametrize("kind", ["event", "state change"])
def test_an_offset_left_to_be_built_is_the_offset_everywhere(kind: str) -> None:
    """A slice query leaves a row's own offset to be built when read (its read time in
    the offset's place): the value is the same as with the offset built, by every
    way of looking at it."""
    read_at = datetime(2024, 5, 1, 12, 0, 1, tzinfo=UTC)
    own = TimestampOffset(TS, read_at, {"A|1": 4})
    if kind == "event":
        values: tuple[Any, ...] = ("A|1", "A", 7, 4, TS, "opened", 31, "", ("t",), None, "w",
                                   own, "query", None, False)  # fmt: skip
        cls: Any = EventEnvelope
    else:
        values = ("A|1", "A", 7, 4, TS, "opened", 31, "", ("t",), own, "query", None, False)
        cls = DurableStateChange
    at = values.index(own)
    eager = tuple.__new__(cls, values)
    lazy = tuple.__new__(cls, (*values[:at], read_at, *values[at + 1 :]))
    assert lazy.offset == own and type(lazy.offset) is TimestampOffset
    assert dict(lazy.offset.seen) == {"A|1": 4}
    assert lazy._offset_timestamp() == eager._offset_timestamp() == TS
    assert lazy == eager and eager == lazy and (lazy != eager) is False
    assert hash(lazy) == hash(eager)
    assert tuple(lazy) == values and list(lazy) == list(values) and lazy[at] == own
    assert lazy[:] == values and len(lazy) == len(values) and lazy[-1] == values[-1]
    assert own in lazy and read_at not in lazy and lazy.count(own) == 1
    assert lazy.index(own) == eager.index(own) == at
    assert repr(lazy) == repr(eager)
    assert lazy._asdict() == eager._asdict()
    assert attrs.asdict(lazy, recurse=False) == attrs.asdict(eager, recurse=False)
    assert pickle.loads(pickle.dumps(lazy)) == eager
    # A changed copy keeps the offset the value was read with, not one built anew.
    later = datetime(2024, 5, 2, tzinfo=UTC)
    for changed in (lazy._replace(db_timestamp=later), attrs.evolve(lazy, db_timestamp=later)):
        assert changed.db_timestamp == later and changed.offset == own
        assert changed.offset.timestamp == TS
    assert lazy != lazy._replace(source="backtracking")

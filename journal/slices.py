"""Slices: how persistence ids are spread over projection instances.

A slice is a number 0..1023 derived from the persistence id exactly as
Apache Pekko derives it (`abs(String.hashCode) % 1024`), so that JVM services
using Pekko Persistence R2DBC and Python workers agree on which instance owns
which event. Projections own contiguous slice *ranges*; changing the number of
instances only regroups slices, it never moves an event to another slice.
"""

from __future__ import annotations

import functools
import operator
import re
import sys
from collections.abc import Iterator
from typing import ClassVar

import attrs

from journal.errors import InvalidArgument, InvalidPersistenceId

NUMBER_OF_SLICES = 1024
SEPARATOR = "|"
MAX_PERSISTENCE_ID_LENGTH = 255

# Control characters (including NUL, which PostgreSQL text cannot store) are
# never part of a valid id; everything else printable is allowed.
_BAD_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def java_string_hash(value: str) -> int:
    """Java's `String.hashCode`: 31·h + c over UTF-16 code units, as signed 32 bits.

    Unrolled, that is the sum of each unit times 31 to the power of the units after
    it, modulo 2**32: one `map` over the units, newest first, and the powers, in C
    (a 40-character id: 2.7 against 6 µs for the loop, which every append of an id
    not seen lately pays).
    """
    units: bytes | memoryview
    if value.isascii():  # one byte a unit
        units = value.encode("ascii")
    else:
        units = memoryview(value.encode(_UTF16_NATIVE, "surrogatepass")).cast("H")
    if len(units) > len(_POWERS_OF_31):  # longer than any id: the loop, nothing kept
        h = 0
        for unit in units:
            h = (31 * h + unit) & 0xFFFFFFFF
    else:
        h = sum(map(operator.mul, reversed(units), _POWERS_OF_31)) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


# 31**k modulo 2**32, for k up to the units of the longest id (a 255-character id has
# up to 510 units).
_POWERS_OF_31 = tuple(pow(31, k, 1 << 32) for k in range(2 * MAX_PERSISTENCE_ID_LENGTH))
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


# Cached: a live aggregate appends to the same id again and again, and the hash
# still visits each of the id's characters.
@functools.lru_cache(maxsize=1 << 16)
def slice_for(persistence_id: str) -> int:
    """The slice (0..1023) of a persistence id, identical to Pekko's `sliceForPersistenceId`."""
    # Pekko computes math.abs(hashCode % numberOfSlices); for a modulus that
    # divides 2**32 that equals abs(h) % n even for Int.MinValue.
    return abs(java_string_hash(persistence_id)) % NUMBER_OF_SLICES


def entity_type_of(persistence_id: str) -> str:
    """The entity type: the part of the persistence id before the first `|` (all of it if none)."""
    return persistence_id.split(SEPARATOR, 1)[0]


def validate_persistence_id(persistence_id: object) -> str:
    """Return `persistence_id` if it is a storable id, else raise `InvalidPersistenceId`."""
    if not isinstance(persistence_id, str):
        raise InvalidPersistenceId(
            f"persistence id must be a str, got {type(persistence_id).__name__}"
        )
    if not persistence_id:
        raise InvalidPersistenceId("persistence id must not be empty")
    if len(persistence_id) > MAX_PERSISTENCE_ID_LENGTH:
        raise InvalidPersistenceId(
            f"persistence id is {len(persistence_id)} characters long; "
            f"the maximum is {MAX_PERSISTENCE_ID_LENGTH}: {persistence_id[:40]!r}..."
        )
    if _BAD_CHARACTERS.search(persistence_id):
        raise InvalidPersistenceId(
            f"persistence id {persistence_id!r} contains a control character"
        )
    try:
        persistence_id.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidPersistenceId(
            f"persistence id {persistence_id!r} is not valid Unicode (lone surrogate)"
        ) from e
    if not entity_type_of(persistence_id):
        raise InvalidPersistenceId(f"persistence id {persistence_id!r} has an empty entity type")
    return persistence_id


def validate_entity_type(entity_type: object) -> str:
    """Return `entity_type` if it can be the entity type of a persistence id."""
    if not isinstance(entity_type, str):
        raise InvalidPersistenceId(f"entity type must be a str, got {type(entity_type).__name__}")
    if SEPARATOR in entity_type:
        raise InvalidPersistenceId(f"entity type {entity_type!r} must not contain {SEPARATOR!r}")
    if not entity_type:
        raise InvalidPersistenceId("entity type must not be empty")
    validate_persistence_id(entity_type)
    return entity_type


@attrs.frozen
class PersistenceId:
    """A persistence id built from an entity type and an entity id: `"<type>|<id>"`."""

    entity_type: str
    entity_id: str

    @classmethod
    def of(cls, entity_type: str, entity_id: str) -> PersistenceId:
        """Build "type|id", rejecting `|` in either part and anything else invalid."""
        validate_entity_type(entity_type)
        if not isinstance(entity_id, str):
            raise InvalidPersistenceId(f"entity id must be a str, got {type(entity_id).__name__}")
        if SEPARATOR in entity_id:
            raise InvalidPersistenceId(f"entity id {entity_id!r} must not contain {SEPARATOR!r}")
        if not entity_id:
            raise InvalidPersistenceId(f"the entity id of {entity_type!r} must not be empty")
        pid = cls(entity_type, entity_id)
        validate_persistence_id(pid.id)
        return pid

    @classmethod
    def parse(cls, persistence_id: str) -> PersistenceId:
        """Split a stored id at its first `|`."""
        validate_persistence_id(persistence_id)
        entity_type, _, entity_id = persistence_id.partition(SEPARATOR)
        return cls(entity_type, entity_id)

    @property
    def id(self) -> str:
        """The persistence id string as stored in the journal."""
        return f"{self.entity_type}{SEPARATOR}{self.entity_id}"

    @property
    def slice(self) -> int:
        """The slice of this id."""
        return slice_for(self.id)

    def __str__(self) -> str:
        return self.id


def _check_slice(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < NUMBER_OF_SLICES:
        raise InvalidArgument(f"{name} must be within 0..{NUMBER_OF_SLICES - 1}, got {value}")


def _check_range(instance: SliceRange, _a: object, _v: int) -> None:
    _check_slice("min_slice", instance.min_slice)
    _check_slice("max_slice", instance.max_slice)
    if instance.min_slice > instance.max_slice:
        raise InvalidArgument(
            f"min_slice {instance.min_slice} is greater than max_slice {instance.max_slice}"
        )


@attrs.frozen(order=True)
class SliceRange:
    """An inclusive range of slices owned by one projection instance.

    `SliceRange.FULL` is every slice; `str(r)` and `r.key` ("0-255") are how Pekko
    names the instance of a range, and `SliceRange.parse` reads that form back.
    """

    FULL: ClassVar[SliceRange]
    """All slices, 0..1023."""

    min_slice: int = attrs.field()
    max_slice: int = attrs.field(validator=_check_range)

    @classmethod
    def parse(cls, text: str) -> SliceRange:
        """ "0-255" -> SliceRange(0, 255); `InvalidArgument` for anything else."""
        lo, sep, hi = str(text).partition("-")
        try:
            if not sep:
                raise ValueError
            return cls(int(lo), int(hi))
        except ValueError as e:  # InvalidArgument is one
            detail = f": {e}" if str(e) and isinstance(e, InvalidArgument) else ""
            raise InvalidArgument(
                f"expected a slice range MIN-MAX within 0-{NUMBER_OF_SLICES - 1}, "
                f"got {text!r}{detail}"
            ) from None

    @staticmethod
    def check(value: object, name: str = "slice_range") -> SliceRange:
        """Return `value` if it is a `SliceRange`, else raise `InvalidArgument` naming `name`."""
        if not isinstance(value, SliceRange):
            raise InvalidArgument(f"{name} must be a SliceRange, got {type(value).__name__}")
        return value

    @property
    def key(self) -> str:
        """The projection key of the instance for this range, as Pekko names it: "0-255"."""
        return f"{self.min_slice}-{self.max_slice}"

    def overlaps(self, other: SliceRange) -> bool:
        """Whether the two ranges share at least one slice."""
        return self.min_slice <= other.max_slice and other.min_slice <= self.max_slice

    def split(self, parts: int) -> list[SliceRange]:
        """This range in `parts` contiguous, non-empty sub-ranges, as even as the count
        allows (the first ones one slice longer); fewer if it has fewer slices."""
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
            raise InvalidArgument(f"number of parts must be an int >= 1, got {parts!r}")
        parts = min(parts, len(self))
        size, extra = divmod(len(self), parts)
        out = []
        lo = self.min_slice
        for i in range(parts):
            hi = lo + size + (1 if i < extra else 0) - 1
            out.append(SliceRange(lo, hi))
            lo = hi + 1
        return out

    def __contains__(self, slice_: object) -> bool:
        return isinstance(slice_, int) and self.min_slice <= slice_ <= self.max_slice

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.min_slice, self.max_slice + 1))

    def __len__(self) -> int:
        return self.max_slice - self.min_slice + 1

    def __str__(self) -> str:
        return self.key


SliceRange.FULL = SliceRange(0, NUMBER_OF_SLICES - 1)


def slice_ranges(number_of_ranges: int) -> list[SliceRange]:
    """Split the 1024 slices into `number_of_ranges` equal ranges (n must divide 1024).

    Anything else raises `InvalidArgument` (a `ValueError`).
    """
    if isinstance(number_of_ranges, bool) or not isinstance(number_of_ranges, int):
        raise InvalidArgument(
            f"number of ranges must be an int, got {type(number_of_ranges).__name__}"
        )
    if number_of_ranges < 1 or NUMBER_OF_SLICES % number_of_ranges:
        raise InvalidArgument(
            f"number of ranges must be a positive divisor of {NUMBER_OF_SLICES} "
            f"(1, 2, 4, ..., 1024), got {number_of_ranges}"
        )
    return SliceRange.FULL.split(number_of_ranges)

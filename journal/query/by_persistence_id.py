"""The seq_nr range check of the reads by persistence id (their drivers: `journal/aio/`)."""

from __future__ import annotations

from journal.errors import InvalidArgument

MAX_SEQ_NR = 2**63 - 1


def check_seq_range(from_seq_nr: object, to_seq_nr: object) -> tuple[int, int]:
    """Validate a from/to seq_nr pair (to may be None = unbounded)."""
    for name, value in (("from_seq_nr", from_seq_nr), ("to_seq_nr", to_seq_nr)):
        if value is None and name == "to_seq_nr":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"{name} must be an int >= 0, got {value!r}")
    to = MAX_SEQ_NR if to_seq_nr is None else to_seq_nr
    assert isinstance(from_seq_nr, int) and isinstance(to, int)
    return from_seq_nr, to

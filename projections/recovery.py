"""What a projection does when its handler fails: fail, retry, or retry then skip.

A skipped envelope is written to the dead-letter table with the error text in
the same transaction that stores its offset — never silently dropped. An event
that could not be decoded fails the same way before the handler sees it, so
the same strategy decides: stop loudly, or dead-letter it with the error.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import timedelta

import attrs

from journal.durable_state import DurableStateChange
from journal.durations import Duration, name_duration_fields, non_negative, to_timedelta
from journal.errors import InvalidSettings
from journal.model import EventEnvelope


class OnFailure(enum.Enum):
    """What a projection does when a handler keeps failing."""

    FAIL = "fail"
    RETRY_AND_FAIL = "retry_and_fail"
    RETRY_AND_SKIP = "retry_and_skip"


def _non_negative_int(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidSettings(f"{attribute.name} must be an int >= 0, got {value!r}")


@attrs.frozen(field_transformer=name_duration_fields)
class RecoveryStrategy:
    """Retries (with exponential backoff) and what happens when they run out."""

    on_failure: OnFailure = OnFailure.FAIL
    retries: int = attrs.field(default=0, validator=_non_negative_int)
    backoff: timedelta = attrs.field(
        default=timedelta(milliseconds=100), converter=to_timedelta, validator=non_negative
    )
    max_backoff: timedelta = attrs.field(
        default=timedelta(seconds=5), converter=to_timedelta, validator=non_negative
    )

    @classmethod
    def fail(cls) -> RecoveryStrategy:
        """Stop the projection on the first error."""
        return cls(OnFailure.FAIL)

    @classmethod
    def retry_and_fail(cls, retries: int, backoff: Duration = 0.1) -> RecoveryStrategy:
        """Retry `retries` times with exponential backoff, then stop the projection."""
        return cls(OnFailure.RETRY_AND_FAIL, retries, backoff)

    @classmethod
    def retry_and_skip(cls, retries: int, backoff: Duration = 0.1) -> RecoveryStrategy:
        """Retry, then write the envelope(s) to the dead-letter table and go on."""
        return cls(OnFailure.RETRY_AND_SKIP, retries, backoff)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1-based)."""
        seconds = self.backoff.total_seconds() * (2 ** (attempt - 1))
        return float(min(seconds, self.max_backoff.total_seconds()))

    @property
    def attempts(self) -> int:
        """How many times an envelope (or batch) is tried in all."""
        return 1 if self.on_failure is OnFailure.FAIL else 1 + self.retries


def check_decoded(envelopes: Iterable[EventEnvelope | DurableStateChange]) -> None:
    """Raise the `DeserializationError` of the first envelope whose event was not decoded."""
    for env in envelopes:
        if env.error is not None:
            raise env.error

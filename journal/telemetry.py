"""The write side's telemetry hook, and the process's current telemetry.

The journal cannot see the projections package, so the hook is split: this
module holds the write side's calls (`WriteTelemetry`) and the one place a
process installs its telemetry (`use_telemetry`); `projections.telemetry`
extends it with the runners' calls and holds the exporters. Like the
Prometheus registry and OpenTelemetry's providers, the current telemetry is
process-wide and off (`NO_TELEMETRY`'s no-ops) until asked for: the library
installs nothing by itself, and a no-op costs a method call per append.
"""

from __future__ import annotations

from typing import Final

APPEND_OK: Final = "ok"
APPEND_CONFLICT: Final = "conflict"  # expected_seq_nr was not current: ConcurrencyError
APPEND_ERROR: Final = "error"  # anything else (connection lost, serialization, ...)


class WriteTelemetry:
    """What the writer reports; every method is a no-op here (override what you export).

    Called on the appending task or thread, never concurrently for one append;
    implementations must be thread-safe (the sync journal appends from threads)
    and must not raise.
    """

    def append_started(self, entity_type: str, events: int) -> object:
        """An append of `events` events begins; the value returned is passed to
        `append_ended` (a span, a start time; None for nothing)."""
        return None

    def append_ended(
        self, started: object, entity_type: str, events: int, seconds: float, outcome: str
    ) -> None:
        """The append ended after `seconds`: `APPEND_OK`, `APPEND_CONFLICT` or `APPEND_ERROR`."""

    def notified(self, entity_type: str) -> None:
        """A change notification (PostgreSQL NOTIFY) was sent or queued for an append."""


NO_WRITE_TELEMETRY: Final = WriteTelemetry()
_current: WriteTelemetry = NO_WRITE_TELEMETRY


def use_telemetry(telemetry: WriteTelemetry | None) -> None:
    """Install `telemetry` for the process (None: back to no telemetry).

    Every append from then on reports to it, and every projection run started
    from then on (unless given its own `telemetry=`)."""
    global _current
    _current = NO_WRITE_TELEMETRY if telemetry is None else telemetry


def current_telemetry() -> WriteTelemetry:
    """The telemetry installed by `use_telemetry` (a no-op one if none)."""
    return _current

"""One telemetry hook for every runner, several exporters (the shape of Akka's Telemetry SPI).

The runners — `Projection` and its generated `SyncProjection` (so groups too),
the fleet worker and the Spark driver — call one small interface, and an
exporter turns the calls into whatever it exports:

* `Telemetry` (extends the writer's `journal.telemetry.WriteTelemetry`):
  `instance(...)` gives the per-instance hook, and the fleet's lease events
  (`lease_claimed`, `lease_lost`, `lease_released`, `instance_restarted`);
* `InstanceTelemetry`: what one projection instance reports — started and
  stopped, batches (started/ended, with the envelope count and duration),
  duplicates dropped and gap events filled, handler errors and retries,
  dead letters, offsets stored, backlog sampled (`projections/backlog.py`).

Every method is a no-op here: `NO_TELEMETRY` is the default, and a runner
whose instance hook is the no-op one skips even its clock readings, so
telemetry that is off costs a comparison per batch. Exporters:
`projections.telemetry_prometheus.PrometheusTelemetry` and
`projections.telemetry_otel.OtelTelemetry` ([otel] extra); `RecordingTelemetry`
below keeps every call, for tests. Install one for the process with
`use_telemetry` (re-exported here), or pass `telemetry=` to a runner.

Labels are bounded: projection name, slice range ("0-255"), runner flavour,
entity type — never a persistence id or an error text.
"""

from __future__ import annotations

import threading
from typing import Any, Final

import attrs

from journal.telemetry import (
    APPEND_CONFLICT,
    APPEND_ERROR,
    APPEND_OK,
    WriteTelemetry,
    current_telemetry,
    use_telemetry,
)
from projections.backlog import Backlog

__all__ = [
    "APPEND_CONFLICT",
    "APPEND_ERROR",
    "APPEND_OK",
    "NO_INSTANCE_TELEMETRY",
    "NO_TELEMETRY",
    "Call",
    "InstanceTelemetry",
    "RecordingTelemetry",
    "Telemetry",
    "current_telemetry",
    "telemetry_for_runner",
    "use_telemetry",
]


class InstanceTelemetry:
    """What one projection instance (a name and a slice range) reports. No-ops here.

    Called from the instance's own task or thread, except `backlog_sampled`
    (its sampler's); implementations must be thread-safe and must not raise.
    """

    # True: the runner samples the range's backlog every `backlog_sample_interval`
    # (one query) and calls `backlog_sampled`. The no-op hook wants no samples.
    samples_backlog: bool = False

    def started(self) -> None:
        """The instance (re)started: offsets loaded, the slice stream opens."""

    def stopped(self, error: BaseException | None) -> None:
        """The run ended: on request (None) or with `error` (it will not go on by itself)."""

    def batch_started(self, envelopes: int) -> object:
        """The handler gets `envelopes` envelopes (one transaction for exactly-once and
        grouped, one handler call for at-least-once); the value returned goes to
        `batch_ended`."""
        return None

    def batch_ended(
        self, started: object, envelopes: int, seconds: float, error: BaseException | None
    ) -> None:
        """The batch ended after `seconds` (retries included): handled and committed, or
        dead-lettered (`error` None; see `dead_lettered`), or failed for good."""

    def duplicates(self, count: int) -> None:
        """`count` envelopes were dropped as already handled (backtracking, redelivery,
        deleted since): the SPI's rejected envelopes."""

    def gaps_filled(self, count: int) -> None:
        """`count` earlier events of a persistence id were loaded to fill a gap."""

    def handler_error(self, error: BaseException, attempt: int, retrying: bool) -> None:
        """The handler failed on attempt `attempt`; `retrying`: another attempt follows."""

    def dead_lettered(self, count: int) -> None:
        """`count` envelopes were skipped into the dead-letter table after their retries."""

    def offsets_stored(self, records: int) -> None:
        """A transaction stored `records` offset rows (events and progress markers)."""

    def backlog_sampled(self, backlog: Backlog) -> None:
        """A reading of the range's backlog (only if `samples_backlog`)."""


class Telemetry(WriteTelemetry):
    """The hook of a process: the writer's calls, the fleet's, and per-instance hooks."""

    def instance(self, projection: str, slice_range: str, runner: str) -> InstanceTelemetry:
        """The hook of one instance; `runner` is "async", "sync" or "spark"."""
        return NO_INSTANCE_TELEMETRY

    def lease_claimed(self, projection: str, slice_range: str, worker: str, epoch: int) -> None:
        """A fleet worker claimed the range's lease under `epoch`."""

    def lease_lost(self, projection: str, slice_range: str, worker: str, reason: str) -> None:
        """The lease was taken over or expired: the instance was stopped."""

    def lease_released(self, projection: str, slice_range: str, worker: str) -> None:
        """The worker gave the lease back (rebalance, shutdown)."""

    def instance_restarted(self, projection: str, slice_range: str, error: BaseException) -> None:
        """The worker restarts the range's instance after `error` (backoff first)."""


NO_INSTANCE_TELEMETRY: Final = InstanceTelemetry()
NO_TELEMETRY: Final = Telemetry()


def telemetry_for_runner(telemetry: WriteTelemetry | None) -> Telemetry:
    """The runner's telemetry: its own if given, else the process's current one; a
    write-only hook installed for the process has nothing for runners (no-op)."""
    chosen = current_telemetry() if telemetry is None else telemetry
    return chosen if isinstance(chosen, Telemetry) else NO_TELEMETRY


# -- recording, for tests ---------------------------------------------------------------------


@attrs.frozen
class Call:
    """One call a `RecordingTelemetry` received: the hook's name, whose, and its arguments
    (errors as their type names, so records compare plainly)."""

    name: str
    projection: str = ""
    slice_range: str = ""
    args: tuple[Any, ...] = ()


class _RecordingInstance(InstanceTelemetry):
    def __init__(self, owner: RecordingTelemetry, projection: str, slice_range: str) -> None:
        self._owner = owner
        self._where = (projection, slice_range)
        self.samples_backlog = owner.samples_backlog

    def _add(self, name: str, *args: Any) -> None:
        self._owner.add(Call(name, *self._where, args))

    def started(self) -> None:
        self._add("started")

    def stopped(self, error: BaseException | None) -> None:
        self._add("stopped", None if error is None else type(error).__name__)

    def batch_started(self, envelopes: int) -> object:
        self._add("batch_started", envelopes)
        return envelopes

    def batch_ended(
        self, started: object, envelopes: int, seconds: float, error: BaseException | None
    ) -> None:
        assert started == envelopes, (started, envelopes)
        assert seconds >= 0
        self._add("batch_ended", envelopes, None if error is None else type(error).__name__)

    def duplicates(self, count: int) -> None:
        self._add("duplicates", count)

    def gaps_filled(self, count: int) -> None:
        self._add("gaps_filled", count)

    def handler_error(self, error: BaseException, attempt: int, retrying: bool) -> None:
        self._add("handler_error", type(error).__name__, attempt, retrying)

    def dead_lettered(self, count: int) -> None:
        self._add("dead_lettered", count)

    def offsets_stored(self, records: int) -> None:
        self._add("offsets_stored", records)

    def backlog_sampled(self, backlog: Backlog) -> None:
        self._add("backlog_sampled", backlog)


class RecordingTelemetry(Telemetry):
    """Keeps every call, in order (thread-safe): a test's view of what the runners report."""

    def __init__(self, *, samples_backlog: bool = False) -> None:
        self.samples_backlog = samples_backlog
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def add(self, call: Call) -> None:
        """Record one call (every hook method of this telemetry and its instances does)."""
        with self._lock:
            self.calls.append(call)

    def named(self, name: str, projection: str | None = None) -> list[Call]:
        """The calls of one hook (of one projection)."""
        with self._lock:
            return [
                c
                for c in self.calls
                if c.name == name and (projection is None or c.projection == projection)
            ]

    def total(self, name: str, projection: str | None = None) -> int:
        """The sum of the first argument of a hook's calls (counts: duplicates, offsets)."""
        return sum(int(c.args[0]) for c in self.named(name, projection))

    def instance(self, projection: str, slice_range: str, runner: str) -> InstanceTelemetry:
        self.add(Call("instance", projection, slice_range, (runner,)))
        return _RecordingInstance(self, projection, slice_range)

    def append_started(self, entity_type: str, events: int) -> object:
        return events

    def append_ended(
        self, started: object, entity_type: str, events: int, seconds: float, outcome: str
    ) -> None:
        self.add(Call("append", args=(entity_type, events, outcome)))

    def notified(self, entity_type: str) -> None:
        self.add(Call("notified", args=(entity_type,)))

    def lease_claimed(self, projection: str, slice_range: str, worker: str, epoch: int) -> None:
        self.add(Call("lease_claimed", projection, slice_range, (worker, epoch)))

    def lease_lost(self, projection: str, slice_range: str, worker: str, reason: str) -> None:
        self.add(Call("lease_lost", projection, slice_range, (worker,)))

    def lease_released(self, projection: str, slice_range: str, worker: str) -> None:
        self.add(Call("lease_released", projection, slice_range, (worker,)))

    def instance_restarted(self, projection: str, slice_range: str, error: BaseException) -> None:
        self.add(Call("instance_restarted", projection, slice_range, (type(error).__name__,)))

"""The OpenTelemetry exporter of the telemetry hook ([otel] extra): spans and metrics.

Spans: `slicejournal.append` per append (entity type, event count, outcome)
and `slicejournal.projection.batch` per handler batch (projection, range,
runner, size; an error status when it failed for good). Metrics, under the
meter `slicejournal`, carry the same figures as the Prometheus exporter
(`projections/telemetry_prometheus.py`) with the same bounded attributes.
Tracer and meter come from the providers given, else OpenTelemetry's global
ones, so the application's SDK setup (exporters, sampling, resource) applies.
Off unless installed: `use_telemetry(OtelTelemetry())`.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import Span, Status, StatusCode, TracerProvider

from projections.backlog import Backlog
from projections.telemetry import InstanceTelemetry, Telemetry

SCOPE = "slicejournal"


class OtelTelemetry(Telemetry):
    """Spans for appends and projection batches, and metrics for the same."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self.appends = meter.create_counter("slicejournal.appends", "{append}", "Appends")
        self.events_appended = meter.create_counter(
            "slicejournal.events_appended", "{event}", "Events appended"
        )
        self.append_duration = meter.create_histogram(
            "slicejournal.append.duration", "s", "Append duration"
        )
        self.handled = meter.create_counter(
            "slicejournal.events_handled", "{event}", "Envelopes handed to the handler"
        )
        self.batch_duration = meter.create_histogram(
            "slicejournal.batch.duration", "s", "Handler batch duration, retries included"
        )
        self.duplicates = meter.create_counter(
            "slicejournal.duplicates_dropped", "{event}", "Envelopes dropped as already handled"
        )
        self.errors = meter.create_counter(
            "slicejournal.handler_errors", "{error}", "Handler attempts that failed"
        )
        self.dead_letters = meter.create_counter(
            "slicejournal.dead_letters", "{event}", "Envelopes dead-lettered"
        )
        self.offsets = meter.create_counter(
            "slicejournal.offsets_stored", "{row}", "Offset rows stored"
        )
        self.leases = meter.create_counter(
            "slicejournal.lease_events", "{event}", "Leases claimed, lost, released"
        )
        # Backlog readings, observed at collection: the last sample per range.
        self.backlogs: dict[tuple[str, str], Backlog] = {}
        meter.create_observable_gauge(
            "slicejournal.backlog.age", [self._ages], "s", "Age of the oldest unhandled event"
        )
        meter.create_observable_gauge(
            "slicejournal.backlog.events", [self._sizes], "{event}", "Events not handled yet"
        )

    def _ages(self, options: CallbackOptions) -> list[Observation]:
        return [
            Observation(b.age_seconds, {"projection": p, "range": r})
            for (p, r), b in list(self.backlogs.items())
        ]

    def _sizes(self, options: CallbackOptions) -> list[Observation]:
        return [
            Observation(b.size, {"projection": p, "range": r})
            for (p, r), b in list(self.backlogs.items())
        ]

    def instance(self, projection: str, slice_range: str, runner: str) -> InstanceTelemetry:
        return _Instance(self, projection, slice_range, runner)

    def append_started(self, entity_type: str, events: int) -> object:
        return self.tracer.start_span(
            "slicejournal.append",
            attributes={"slicejournal.entity_type": entity_type, "slicejournal.events": events},
        )

    def append_ended(
        self, started: object, entity_type: str, events: int, seconds: float, outcome: str
    ) -> None:
        attributes = {"entity_type": entity_type, "outcome": outcome}
        self.appends.add(1, attributes)
        if outcome == "ok":
            self.events_appended.add(events, {"entity_type": entity_type})
        self.append_duration.record(seconds, attributes)
        if isinstance(started, Span):
            started.set_attribute("slicejournal.outcome", outcome)
            if outcome != "ok":
                started.set_status(Status(StatusCode.ERROR, outcome))
            started.end()

    def _lease(self, what: str, projection: str, slice_range: str) -> None:
        self.leases.add(1, {"projection": projection, "range": slice_range, "event": what})

    def lease_claimed(self, projection: str, slice_range: str, worker: str, epoch: int) -> None:
        self._lease("claimed", projection, slice_range)

    def lease_lost(self, projection: str, slice_range: str, worker: str, reason: str) -> None:
        self._lease("lost", projection, slice_range)
        self.backlogs.pop((projection, slice_range), None)

    def lease_released(self, projection: str, slice_range: str, worker: str) -> None:
        self._lease("released", projection, slice_range)
        self.backlogs.pop((projection, slice_range), None)


class _Instance(InstanceTelemetry):
    samples_backlog = True

    def __init__(self, t: OtelTelemetry, projection: str, slice_range: str, runner: str) -> None:
        self._t = t
        self._key = (projection, slice_range)
        self._attributes: dict[str, Any] = {"projection": projection, "range": slice_range}
        self._span_attributes: dict[str, Any] = {
            "slicejournal.projection": projection,
            "slicejournal.range": slice_range,
            "slicejournal.runner": runner,
        }

    def stopped(self, error: BaseException | None) -> None:
        self._t.backlogs.pop(self._key, None)

    def batch_started(self, envelopes: int) -> object:
        return self._t.tracer.start_span(
            "slicejournal.projection.batch",
            attributes={**self._span_attributes, "slicejournal.batch.size": envelopes},
        )

    def batch_ended(
        self, started: object, envelopes: int, seconds: float, error: BaseException | None
    ) -> None:
        self._t.batch_duration.record(seconds, self._attributes)
        if error is None:
            self._t.handled.add(envelopes, self._attributes)
        if isinstance(started, Span):
            if error is not None:
                started.record_exception(error)
                started.set_status(Status(StatusCode.ERROR, type(error).__name__))
            started.end()

    def duplicates(self, count: int) -> None:
        self._t.duplicates.add(count, self._attributes)

    def handler_error(self, error: BaseException, attempt: int, retrying: bool) -> None:
        self._t.errors.add(1, {**self._attributes, "retrying": retrying})

    def dead_lettered(self, count: int) -> None:
        self._t.dead_letters.add(count, self._attributes)

    def offsets_stored(self, records: int) -> None:
        self._t.offsets.add(records, self._attributes)

    def backlog_sampled(self, backlog: Backlog) -> None:
        self._t.backlogs[self._key] = backlog

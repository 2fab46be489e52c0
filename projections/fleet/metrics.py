"""Prometheus metrics of a fleet worker, read from its live state at every scrape.

A collector rather than counters updated on the hot path: the runners already
count (`ProjectionStats`), so a scrape reads those counters and nothing is
added to the per-envelope work. Labels: `projection`, `range`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from projections.fleet.worker import FleetWorker, lag_seconds

_LABELS = ["projection", "range"]


class FleetCollector(Collector):
    """The per-range figures of one worker."""

    def __init__(self, worker: FleetWorker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        handled = CounterMetricFamily(
            "slicejournal_events_handled", "Events handed to the handler", labels=_LABELS
        )
        duplicates = CounterMetricFamily(
            "slicejournal_duplicates_dropped",
            "Envelopes dropped as already handled (backtracking, redelivery)",
            labels=_LABELS,
        )
        restarts = CounterMetricFamily(
            "slicejournal_instance_restarts", "Restarts after a failure", labels=_LABELS
        )
        lag = GaugeMetricFamily(
            "slicejournal_lag_seconds",
            "Seconds since the newest event the instance handled was written",
            labels=_LABELS,
        )
        held = GaugeMetricFamily(
            "slicejournal_lease_held", "1 while this worker holds the range's lease", labels=_LABELS
        )
        name = self.worker.name
        for instance in self.worker.held():
            labels = [name, str(instance.slice_range)]
            stats = None if instance.projection is None else instance.projection.stats
            handled.add_metric(labels, 0 if stats is None else stats.accepted)
            duplicates.add_metric(labels, 0 if stats is None else stats.duplicates)
            restarts.add_metric(labels, instance.restarts)
            held.add_metric(labels, 0 if instance.lost else 1)
            seconds = lag_seconds(instance)
            if seconds is not None:
                lag.add_metric(labels, seconds)
        yield from (handled, duplicates, restarts, lag, held)


def serve_metrics(worker: FleetWorker, port: int) -> None:
    """Serve `/metrics` on `port` (0: any free port) from a daemon thread."""
    REGISTRY.register(FleetCollector(worker))
    start_http_server(port)

"""The Prometheus exporter of the telemetry hook: one set of series for every runner.

`slicejournal worker --metrics-port` installs one; an in-process `Projection`,
`ProjectionGroup` or sync runner gets exactly the same series by installing
one too (`use_telemetry(PrometheusTelemetry())`) and serving it
(`serve_http`, or the application's own /metrics: the series live in
`registry`, prometheus_client's default unless given). Names follow
Prometheus' conventions: units in the name, `_total` counters, and bounded
labels only — `projection`, `range` ("0-255"), `worker` on leases,
`entity_type` and `outcome` on appends. The backlog gauges are the readings
of `projections/backlog.py`, so they agree with `slicejournal status`; they
disappear when the range stops or its lease goes (no stale value stays).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from projections.backlog import Backlog
from projections.telemetry import InstanceTelemetry, Telemetry

_RANGE = ("projection", "range")
# Handler batches and appends: 1 ms .. 30 s.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# Every series name this module exports (their families' names, as the exposition and
# the Grafana dashboard's queries spell them); tests check the dashboard against it.
METRIC_NAMES = (
    "slicejournal_events_handled_total",
    "slicejournal_duplicates_dropped_total",
    "slicejournal_gap_events_filled_total",
    "slicejournal_batch_duration_seconds",
    "slicejournal_handler_errors_total",
    "slicejournal_handler_retries_total",
    "slicejournal_dead_letters_total",
    "slicejournal_offsets_stored_total",
    "slicejournal_instance_running",
    "slicejournal_instance_restarts_total",
    "slicejournal_backlog_age_seconds",
    "slicejournal_backlog_events",
    "slicejournal_lease_held",
    "slicejournal_leases_claimed_total",
    "slicejournal_leases_lost_total",
    "slicejournal_appends_total",
    "slicejournal_events_appended_total",
    "slicejournal_append_duration_seconds",
    "slicejournal_notifications_total",
    "slicejournal_pool_connections",
    "slicejournal_pool_requests_waiting",
)


class PrometheusTelemetry(Telemetry):
    """Counts, durations, backlog and leases as Prometheus series in `registry`."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.registry = registry
        r = registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = _RANGE) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = _RANGE) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        self.handled = counter(
            "slicejournal_events_handled", "Envelopes handed to the handler (or dead-lettered)"
        )
        self.duplicates_dropped = counter(
            "slicejournal_duplicates_dropped",
            "Envelopes dropped as already handled (backtracking, redelivery, deleted)",
        )
        self.gap_events = counter(
            "slicejournal_gap_events_filled", "Earlier events loaded to fill a sequence gap"
        )
        self.batch_seconds = Histogram(
            "slicejournal_batch_duration_seconds",
            "Handler batches (a transaction, or an at-least-once call), retries included",
            _RANGE,
            registry=r,
            buckets=_BUCKETS,
        )
        self.errors = counter("slicejournal_handler_errors", "Handler attempts that failed")
        self.retries = counter("slicejournal_handler_retries", "Handler attempts retried")
        self.dead_letters = counter(
            "slicejournal_dead_letters", "Envelopes skipped into the dead-letter table"
        )
        self.offsets = counter("slicejournal_offsets_stored", "Offset rows stored")
        self.running = gauge("slicejournal_instance_running", "1 while the instance runs")
        self.restarts = counter(
            "slicejournal_instance_restarts",
            "Restarts of a fleet worker's instance after a failure",
        )
        self.backlog_age = gauge(
            "slicejournal_backlog_age_seconds",
            "Age of the oldest event of the range not yet handled (0: caught up)",
        )
        self.backlog_events = gauge(
            "slicejournal_backlog_events",
            "Events of the range not yet handled (counted up to a cap)",
        )
        lease = (*_RANGE, "worker")
        self.lease_held = gauge(
            "slicejournal_lease_held", "1 while this worker holds the range's lease", lease
        )
        self.claimed = counter("slicejournal_leases_claimed", "Leases claimed", lease)
        self.lost = counter("slicejournal_leases_lost", "Leases lost (taken over, expired)", lease)
        kind = ("entity_type",)
        self.appends = counter(
            "slicejournal_appends", "Appends by outcome (ok, conflict, error)", (*kind, "outcome")
        )
        self.appended = counter("slicejournal_events_appended", "Events appended", kind)
        self.append_seconds = Histogram(
            "slicejournal_append_duration_seconds",
            "Appends, conflicts and errors included",
            kind,
            registry=r,
            buckets=_BUCKETS,
        )
        self.notifications = counter(
            "slicejournal_notifications", "Change notifications sent or queued", kind
        )
        self._pools = _PoolCollector()
        if r is not None:
            r.register(self._pools)

    def watch_pools(self, *pools: Any) -> None:
        """Export these connection pools' sizes and waiting requests (a `Journal`'s `pool`
        and `read_pool`, or any psycopg_pool pool) under their names."""
        self._pools.pools.extend(pools)

    # -- the hook ---------------------------------------------------------------------------

    def instance(self, projection: str, slice_range: str, runner: str) -> InstanceTelemetry:
        return _Instance(self, projection, slice_range)

    def append_ended(
        self, started: object, entity_type: str, events: int, seconds: float, outcome: str
    ) -> None:
        self.appends.labels(entity_type, outcome).inc()
        if outcome == "ok":
            self.appended.labels(entity_type).inc(events)
        self.append_seconds.labels(entity_type).observe(seconds)

    def notified(self, entity_type: str) -> None:
        self.notifications.labels(entity_type).inc()

    def lease_claimed(self, projection: str, slice_range: str, worker: str, epoch: int) -> None:
        self.claimed.labels(projection, slice_range, worker).inc()
        self.lost.labels(projection, slice_range, worker)
        self.lease_held.labels(projection, slice_range, worker).set(1)
        self.restarts.labels(projection, slice_range)

    def lease_lost(self, projection: str, slice_range: str, worker: str, reason: str) -> None:
        self.lost.labels(projection, slice_range, worker).inc()
        self._lease_gone(projection, slice_range, worker)

    def lease_released(self, projection: str, slice_range: str, worker: str) -> None:
        self._lease_gone(projection, slice_range, worker)

    def _lease_gone(self, projection: str, slice_range: str, worker: str) -> None:
        self.lease_held.labels(projection, slice_range, worker).set(0)
        _forget(self.backlog_age, projection, slice_range)
        _forget(self.backlog_events, projection, slice_range)

    def instance_restarted(self, projection: str, slice_range: str, error: BaseException) -> None:
        self.restarts.labels(projection, slice_range).inc()


def _forget(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


class _Instance(InstanceTelemetry):
    """One range's series, their label children resolved once."""

    samples_backlog = True

    def __init__(self, t: PrometheusTelemetry, projection: str, slice_range: str) -> None:
        labels = (projection, slice_range)
        self._t = t
        self._labels = labels
        self._handled = t.handled.labels(*labels)
        self._duplicates = t.duplicates_dropped.labels(*labels)
        self._gaps = t.gap_events.labels(*labels)
        self._seconds = t.batch_seconds.labels(*labels)
        self._errors = t.errors.labels(*labels)
        self._retries = t.retries.labels(*labels)
        self._dead = t.dead_letters.labels(*labels)
        self._offsets = t.offsets.labels(*labels)
        self._running = t.running.labels(*labels)

    def started(self) -> None:
        self._running.set(1)

    def stopped(self, error: BaseException | None) -> None:
        self._running.set(0)
        _forget(self._t.backlog_age, *self._labels)
        _forget(self._t.backlog_events, *self._labels)

    def batch_ended(
        self, started: object, envelopes: int, seconds: float, error: BaseException | None
    ) -> None:
        self._seconds.observe(seconds)
        if error is None:
            self._handled.inc(envelopes)

    def duplicates(self, count: int) -> None:
        self._duplicates.inc(count)

    def gaps_filled(self, count: int) -> None:
        self._gaps.inc(count)

    def handler_error(self, error: BaseException, attempt: int, retrying: bool) -> None:
        self._errors.inc()
        if retrying:
            self._retries.inc()

    def dead_lettered(self, count: int) -> None:
        self._dead.inc(count)

    def offsets_stored(self, records: int) -> None:
        self._offsets.inc(records)

    def backlog_sampled(self, backlog: Backlog) -> None:
        self._t.backlog_age.labels(*self._labels).set(backlog.age_seconds)
        self._t.backlog_events.labels(*self._labels).set(backlog.size)


class _PoolCollector(Collector):
    """Connection pool figures read at scrape time (psycopg_pool's `get_stats`)."""

    def __init__(self) -> None:
        self.pools: list[Any] = []

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            "slicejournal_pool_connections",
            "Connections of a pool, by state (open: in the pool; idle: available in it)",
            labels=["pool", "state"],
        )
        waiting = GaugeMetricFamily(
            "slicejournal_pool_requests_waiting",
            "Requests waiting for a connection",
            labels=["pool"],
        )
        for pool in self.pools:
            stats = pool.get_stats()
            size.add_metric([pool.name, "open"], stats.get("pool_size", 0))
            size.add_metric([pool.name, "idle"], stats.get("pool_available", 0))
            waiting.add_metric([pool.name], stats.get("requests_waiting", 0))
        yield size
        yield waiting

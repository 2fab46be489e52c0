"""The OpenTelemetry exporter with the SDK's in-memory exporters, on a real PostgreSQL:
spans arrive for appends (entity type, size, outcome) and projection batches (projection,
range, runner, size), and the metrics carry the same figures."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the [otel] extra")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from journal import ConcurrencyError, Journal, SliceRange
from journal.model import EventEnvelope
from journal.telemetry import use_telemetry
from projections import Projection, ProjectionSettings
from projections.telemetry_otel import OtelTelemetry
from tests.support.projections import eventually

ENTITY = "Meter"


async def _ignore(conn: Any, env: EventEnvelope) -> None:
    return None


@pytest.mark.timeout(60)
async def test_spans_and_metrics_for_appends_and_batches(journal: Journal) -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry = OtelTelemetry(tracer_provider, MeterProvider(metric_readers=[reader]))
    use_telemetry(telemetry)
    try:
        for i in range(5):
            await journal.append(f"{ENTITY}|m-{i}", [{"n": 1}, {"n": 2}], expected_seq_nr=0)
        with pytest.raises(ConcurrencyError):
            await journal.append(f"{ENTITY}|m-0", [{"n": 3}], expected_seq_nr=0)
        p = Projection.grouped(
            journal, name="meters", entity_type=ENTITY, slice_range=SliceRange(0, 1023),
            handler=_ignore,
            settings=ProjectionSettings(
                group_after_duration=timedelta(milliseconds=50),
                backlog_sample_interval=timedelta(milliseconds=100),
            ),
        )  # fmt: skip
        task = asyncio.create_task(p.run())
        await eventually(lambda: p.stats.accepted == 10, "all 10 events handled")
        await eventually(
            lambda: (
                telemetry.backlogs.get(("meters", "0-1023")) is not None
                and telemetry.backlogs[("meters", "0-1023")].size == 0
            ),
            "a backlog sample of 0",
        )
        data = reader.get_metrics_data()
        await p.stop()
        await asyncio.wait_for(task, 10)
    finally:
        use_telemetry(None)

    appends = [s for s in spans.get_finished_spans() if s.name == "slicejournal.append"]
    assert len(appends) == 6
    assert appends[0].attributes is not None
    assert appends[0].attributes["slicejournal.entity_type"] == ENTITY
    assert appends[0].attributes["slicejournal.events"] == 2
    outcomes = [s.attributes["slicejournal.outcome"] for s in appends if s.attributes]
    assert outcomes == ["ok"] * 5 + ["conflict"]
    batches = [s for s in spans.get_finished_spans() if s.name == "slicejournal.projection.batch"]
    assert batches
    sizes = [s.attributes["slicejournal.batch.size"] for s in batches if s.attributes]
    assert sum(int(str(n)) for n in sizes) == 10
    attributes = batches[0].attributes
    assert attributes is not None
    assert attributes["slicejournal.projection"] == "meters"
    assert attributes["slicejournal.range"] == "0-1023"
    assert attributes["slicejournal.runner"] == "async"

    points: dict[str, list[Any]] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points.setdefault(m.name, []).extend(m.data.data_points)
    assert sum(pt.value for pt in points["slicejournal.events_appended"]) == 10
    handled = points["slicejournal.events_handled"]
    assert sum(pt.value for pt in handled) == 10
    assert {pt.attributes["range"] for pt in handled} == {"0-1023"}
    assert [pt.value for pt in points["slicejournal.backlog.age"]] == [0.0]
    assert "slicejournal.batch.duration" in points and "slicejournal.append.duration" in points

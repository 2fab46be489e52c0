"""The projection sink as a Python data source *writer*, one per running projection.

Spark's Python data source API runs a writer's `write()` once per partition
of every micro-batch, on executors, over Arrow batches — exactly the unit of
work of the exactly-once sink — and needs no pandas (`DataFrame.mapInArrow`
would). A writer gets only string options, so each projection registers its
own small `DataSource` class carrying its `PartitionApplier` (handler included);
cloudpickle ships the class by value to the executors.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from projections.spark.sink import PartitionApplier, PartitionReport

_log = logging.getLogger("slicejournal.projections.spark")


def _totals(messages: list[WriterCommitMessage | None]) -> dict[str, int]:
    reports = [m for m in messages if isinstance(m, PartitionReport)]
    return {
        "accepted": sum(r.accepted for r in reports),
        "duplicates": sum(r.duplicates for r in reports),
        "gaps_filled": sum(r.gaps_filled for r in reports),
    }


class _StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, applier: PartitionApplier) -> None:
        self.applier = applier

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.applier.apply(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log.info(
            "projection %s batch %d: %s", self.applier.offset_name, batchId, _totals(messages)
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Each partition committed or rolled back on its own; a retry re-validates.
        _log.warning("projection %s batch %d aborted", self.applier.offset_name, batchId)


class _BatchWriter(DataSourceArrowWriter):
    def __init__(self, applier: PartitionApplier) -> None:
        self.applier = applier

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.applier.apply(iterator)


class ProjectionWriterSource(DataSource):
    """Base of the per-projection writer sources; `applier` is set by `writer_source_for`."""

    applier: PartitionApplier
    short_name: str

    @classmethod
    def name(cls) -> str:
        return cls.short_name

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _StreamWriter(self.applier)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return _BatchWriter(self.applier)


def writer_source_for(applier: PartitionApplier) -> type[ProjectionWriterSource]:
    """A `DataSource` class, registered under a name of its own, that writes through `applier`."""
    key = f"{applier.settings.schema}\x00{applier.offset_name}\x00{applier.dsn}"
    short = "slicejournal_writer_" + hashlib.sha1(key.encode()).hexdigest()[:16]
    return type(short, (ProjectionWriterSource,), {"applier": applier, "short_name": short})

"""slicejournal's projections: slice streams turned into read models, exactly once.

The public API: the names in `__all__` (see "Stability" in the README); every
module, and every name not in `__all__`, is private.

    projection = Projection.exactly_once(
        journal, name="balances", entity_type="Account",
        slice_range=SliceRange(0, 1023), handler=apply_to_balance)
    await projection.run()          # until `await projection.stop()`
"""

from typing import TYPE_CHECKING

from journal._lazy import lazy_attributes, moved, private
from projections.core import ProjectionStats
from projections.errors import (
    LeaseLost,
    OffsetConflict,
    ProjectionError,
    UnknownProjection,
    WaitTimeout,
)
from projections.recovery import OnFailure, RecoveryStrategy
from projections.retention import (
    ProjectionInfo,
    RangeReport,
    Registration,
    RetentionPolicy,
    RetentionProgress,
    RetentionReport,
    RetentionSettings,
)
from projections.settings import ProjectionSettings, ProjectionTableNames

# The runners and management load psycopg and asyncio, the exporters prometheus_client
# and OpenTelemetry (the [otel] extra): imported on first use.
if TYPE_CHECKING:
    from projections.aio.fleet_control import FleetControl
    from projections.aio.group import ProjectionGroup
    from projections.aio.management import ProjectionManagement
    from projections.aio.retention import Retention
    from projections.aio.runner import (
        AtLeastOnceChangeHandler,
        AtLeastOnceHandler,
        ChangeHandler,
        GroupedChangeHandler,
        GroupedHandler,
        Handler,
        Projection,
    )
    from projections.backlog import Backlog
    from projections.fleet.status import FleetStatus, LeaseStatus
    from projections.fleet.worker import FleetWorker, WorkerApp, WorkerSettings
    from projections.management import DeadLetter, RangeStatus
    from projections.sync.fleet_control import SyncFleetControl
    from projections.sync.group import SyncProjectionGroup
    from projections.sync.management import SyncProjectionManagement
    from projections.sync.retention import SyncRetention
    from projections.sync.runner import (
        SyncAtLeastOnceChangeHandler,
        SyncAtLeastOnceHandler,
        SyncChangeHandler,
        SyncGroupedChangeHandler,
        SyncGroupedHandler,
        SyncHandler,
        SyncProjection,
    )
    from projections.telemetry import InstanceTelemetry, RecordingTelemetry, Telemetry
    from projections.telemetry_otel import OtelTelemetry
    from projections.telemetry_prometheus import PrometheusTelemetry

__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(("DeadLetter", "RangeStatus"), "projections.management"),
        "ProjectionManagement": "projections.aio.management",
        "Retention": "projections.aio.retention",
        "SyncRetention": "projections.sync.retention",
        **dict.fromkeys(
            (
                "AtLeastOnceChangeHandler",
                "AtLeastOnceHandler",
                "ChangeHandler",
                "GroupedChangeHandler",
                "GroupedHandler",
                "Handler",
                "Projection",
            ),
            "projections.aio.runner",
        ),
        "ProjectionGroup": "projections.aio.group",
        **dict.fromkeys(("FleetStatus", "LeaseStatus"), "projections.fleet.status"),
        "FleetControl": "projections.aio.fleet_control",
        "SyncFleetControl": "projections.sync.fleet_control",
        "SyncProjectionManagement": "projections.sync.management",
        **dict.fromkeys(("FleetWorker", "WorkerApp", "WorkerSettings"), "projections.fleet.worker"),
        **dict.fromkeys(
            (
                "SyncAtLeastOnceChangeHandler",
                "SyncAtLeastOnceHandler",
                "SyncChangeHandler",
                "SyncGroupedChangeHandler",
                "SyncGroupedHandler",
                "SyncHandler",
                "SyncProjection",
            ),
            "projections.sync.runner",
        ),
        "SyncProjectionGroup": "projections.sync.group",
        "Backlog": "projections.backlog",
        **dict.fromkeys(
            ("InstanceTelemetry", "RecordingTelemetry", "Telemetry"), "projections.telemetry"
        ),
        "PrometheusTelemetry": "projections.telemetry_prometheus",
        "OtelTelemetry": "projections.telemetry_otel",
    },
    # Exported by 0.2.0, deprecated in 0.3.0: each use warns, naming what to use instead.
    deprecated={
        "Mode": private(
            "projections.core",
            "Mode",
            "choose the mode with `Projection.exactly_once` / `grouped` / `at_least_once` "
            "(`Projection.mode` still reads it)",
        ),
        **{
            name: private(module, name)
            for name, module in (
                ("ProjectionCore", "projections.core"),
                ("OffsetState", "projections.offset_store"),
                ("Record", "projections.offset_store"),
                ("Validation", "projections.offset_store"),
                ("Verdict", "projections.offset_store"),
            )
        },
        "ProjectionTables": private(
            "projections.tables",
            "ProjectionTables",
            "pass a `ProjectionTableNames` instead: `ProjectionSettings(tables=...)`, "
            "`ProjectionManagement(journal, tables=...)`, "
            "`journal.create_schema(tables=[ProjectionTableNames(...)])`",
        ),
        "use_telemetry": moved("journal.telemetry", "use_telemetry", "journal"),
        "parse_duration": moved("journal.durations", "parse_duration", "journal"),
    },
)

__all__ = [
    "AtLeastOnceChangeHandler",
    "AtLeastOnceHandler",
    "Backlog",
    "ChangeHandler",
    "DeadLetter",
    "FleetControl",
    "FleetStatus",
    "FleetWorker",
    "GroupedChangeHandler",
    "GroupedHandler",
    "Handler",
    "InstanceTelemetry",
    "LeaseLost",
    "LeaseStatus",
    "OffsetConflict",
    "OnFailure",
    "OtelTelemetry",
    "Projection",
    "ProjectionError",
    "ProjectionGroup",
    "ProjectionInfo",
    "ProjectionManagement",
    "ProjectionSettings",
    "ProjectionStats",
    "ProjectionTableNames",
    "PrometheusTelemetry",
    "RangeReport",
    "RangeStatus",
    "RecordingTelemetry",
    "RecoveryStrategy",
    "Registration",
    "Retention",
    "RetentionPolicy",
    "RetentionProgress",
    "RetentionReport",
    "RetentionSettings",
    "SyncAtLeastOnceChangeHandler",
    "SyncAtLeastOnceHandler",
    "SyncChangeHandler",
    "SyncFleetControl",
    "SyncGroupedChangeHandler",
    "SyncGroupedHandler",
    "SyncHandler",
    "SyncProjection",
    "SyncProjectionGroup",
    "SyncProjectionManagement",
    "SyncRetention",
    "Telemetry",
    "UnknownProjection",
    "WaitTimeout",
    "WorkerApp",
    "WorkerSettings",
]

"""slicejournal's projections: slice streams turned into read models, exactly once.

The public API; everything not re-exported here is private.

    projection = Projection.exactly_once(
        journal, name="balances", entity_type="Account",
        slice_range=SliceRange(0, 1023), handler=apply_to_balance)
    await projection.run()          # until `await projection.stop()`
"""

from typing import TYPE_CHECKING

from journal._lazy import lazy_attributes
from projections.core import Mode, ProjectionCore, ProjectionStats
from projections.errors import (
    LeaseLost,
    OffsetConflict,
    ProjectionError,
    UnknownProjection,
    WaitTimeout,
)
from projections.offset_store import OffsetState, Record, Validation, Verdict
from projections.recovery import OnFailure, RecoveryStrategy
from projections.retention import (
    ProjectionInfo,
    RangeReport,
    Registration,
    RetentionPolicy,
    RetentionProgress,
    RetentionReport,
    RetentionSettings,
    parse_duration,
)
from projections.settings import ProjectionSettings, ProjectionTableNames

# The runners and management load psycopg and asyncio, the exporters prometheus_client
# and OpenTelemetry (the [otel] extra): imported on first use.
if TYPE_CHECKING:
    from journal.telemetry import use_telemetry
    from projections.aio.fleet_control import FleetControl
    from projections.aio.group import ProjectionGroup
    from projections.aio.management import ProjectionManagement
    from projections.aio.retention import Retention
    from projections.aio.runner import (
        AtLeastOnceHandler,
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
        SyncAtLeastOnceHandler,
        SyncGroupedHandler,
        SyncHandler,
        SyncProjection,
    )
    from projections.tables import ProjectionTables
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
            ("AtLeastOnceHandler", "GroupedHandler", "Handler", "Projection"),
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
                "SyncAtLeastOnceHandler",
                "SyncGroupedHandler",
                "SyncHandler",
                "SyncProjection",
            ),
            "projections.sync.runner",
        ),
        "SyncProjectionGroup": "projections.sync.group",
        "Backlog": "projections.backlog",
        "ProjectionTables": "projections.tables",
        **dict.fromkeys(
            ("InstanceTelemetry", "RecordingTelemetry", "Telemetry"), "projections.telemetry"
        ),
        "PrometheusTelemetry": "projections.telemetry_prometheus",
        "OtelTelemetry": "projections.telemetry_otel",
        "use_telemetry": "journal.telemetry",
    },
)

__all__ = [
    "AtLeastOnceHandler",
    "Backlog",
    "DeadLetter",
    "FleetControl",
    "FleetStatus",
    "FleetWorker",
    "GroupedHandler",
    "Handler",
    "InstanceTelemetry",
    "LeaseLost",
    "LeaseStatus",
    "Mode",
    "OffsetConflict",
    "OffsetState",
    "OnFailure",
    "OtelTelemetry",
    "Projection",
    "ProjectionCore",
    "ProjectionError",
    "ProjectionGroup",
    "ProjectionInfo",
    "ProjectionManagement",
    "ProjectionSettings",
    "ProjectionStats",
    "ProjectionTableNames",
    "ProjectionTables",
    "PrometheusTelemetry",
    "RangeReport",
    "RangeStatus",
    "Record",
    "RecordingTelemetry",
    "RecoveryStrategy",
    "Registration",
    "Retention",
    "RetentionPolicy",
    "RetentionProgress",
    "RetentionReport",
    "RetentionSettings",
    "SyncAtLeastOnceHandler",
    "SyncFleetControl",
    "SyncGroupedHandler",
    "SyncHandler",
    "SyncProjection",
    "SyncProjectionGroup",
    "SyncProjectionManagement",
    "SyncRetention",
    "Telemetry",
    "UnknownProjection",
    "Validation",
    "Verdict",
    "WaitTimeout",
    "WorkerApp",
    "WorkerSettings",
    "parse_duration",
    "use_telemetry",
]

"""slicejournal's projections: slice streams turned into read models, exactly once.

The public API; everything not re-exported here is private.

    projection = Projection.exactly_once(
        journal, name="balances", entity_type="Account",
        slice_range=SliceRange(0, 1023), handler=apply_to_balance)
    await projection.run()          # until `await projection.stop()`
"""

from typing import TYPE_CHECKING

from journal._lazy import lazy_attributes
from journal.errors import UnknownProjection
from projections.core import Mode, ProjectionCore, ProjectionStats
from projections.errors import LeaseLost, OffsetConflict, ProjectionError
from projections.names import range_key
from projections.offset_store import OffsetState, Record, Validation, Verdict
from projections.recovery import OnFailure, RecoveryStrategy
from projections.settings import ProjectionSettings

# The runners and management load psycopg and asyncio: imported on first use.
if TYPE_CHECKING:
    from projections.management import DeadLetter, ProjectionManagement, RangeStatus
    from projections.runner import (
        AtLeastOnceHandler,
        GroupedHandler,
        Handler,
        Projection,
    )
    from projections.scaling import ProjectionGroup
    from projections.sync_runner import SyncHandler, SyncProjection

__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(
            ("DeadLetter", "ProjectionManagement", "RangeStatus"),
            "projections.management",
        ),
        **dict.fromkeys(
            (
                "AtLeastOnceHandler",
                "GroupedHandler",
                "Handler",
                "Projection",
            ),
            "projections.runner",
        ),
        "ProjectionGroup": "projections.scaling",
        "SyncHandler": "projections.sync_runner",
        "SyncProjection": "projections.sync_runner",
    },
)

__all__ = [
    "AtLeastOnceHandler",
    "DeadLetter",
    "GroupedHandler",
    "Handler",
    "LeaseLost",
    "Mode",
    "OffsetConflict",
    "OffsetState",
    "OnFailure",
    "Projection",
    "ProjectionCore",
    "ProjectionError",
    "ProjectionGroup",
    "ProjectionManagement",
    "ProjectionSettings",
    "ProjectionStats",
    "RangeStatus",
    "Record",
    "RecoveryStrategy",
    "SyncHandler",
    "SyncProjection",
    "UnknownProjection",
    "Validation",
    "Verdict",
    "range_key",
]

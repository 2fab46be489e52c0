"""slicejournal's projections: slice streams turned into read models, exactly once.

The public API; everything not re-exported here is private.

    projection = Projection.exactly_once(
        journal, name="balances", entity_type="Account",
        slice_range=SliceRange(0, 1023), handler=apply_to_balance)
    await projection.run()          # until `await projection.stop()`
"""

from journal.errors import UnknownProjection
from projections.management import DeadLetter, ProjectionManagement, RangeStatus, range_key
from projections.offset_store import OffsetState, Record, Validation, Verdict
from projections.recovery import OnFailure, RecoveryStrategy
from projections.runner import (
    AtLeastOnceHandler,
    GroupedHandler,
    Handler,
    Mode,
    Projection,
    ProjectionError,
    ProjectionStats,
)
from projections.scaling import ProjectionGroup
from projections.settings import ProjectionSettings

__all__ = [
    "AtLeastOnceHandler",
    "DeadLetter",
    "GroupedHandler",
    "Handler",
    "Mode",
    "OffsetState",
    "OnFailure",
    "Projection",
    "ProjectionError",
    "ProjectionGroup",
    "ProjectionManagement",
    "ProjectionSettings",
    "ProjectionStats",
    "RangeStatus",
    "Record",
    "RecoveryStrategy",
    "UnknownProjection",
    "Validation",
    "Verdict",
    "range_key",
]

"""The projection fleet: worker processes that share a projection's slice ranges
through PostgreSQL leases, fenced, and rescaled with one command.

    slicejournal worker myapp.read_models:balances    # on 1..N hosts
    slicejournal scale balances 8                     # the running fleet follows

Programmatic use: `FleetWorker(journal, factory).run()` is what the command
runs; `FleetControl(journal)` scales, reads status and moves offsets.
"""

from typing import TYPE_CHECKING

from journal._lazy import lazy_attributes
from projections.fleet.assignment import LeaseRow, Plan, assign, plan

if TYPE_CHECKING:
    from projections.aio.fleet_control import FleetControl
    from projections.fleet.status import FleetStatus, LeaseStatus
    from projections.fleet.worker import FleetWorker, WorkerApp, WorkerSettings

__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(("FleetStatus", "LeaseStatus"), "projections.fleet.status"),
        "FleetControl": "projections.aio.fleet_control",
        **dict.fromkeys(("FleetWorker", "WorkerApp", "WorkerSettings"), "projections.fleet.worker"),
    },
)

__all__ = [
    "FleetControl",
    "FleetStatus",
    "FleetWorker",
    "LeaseRow",
    "LeaseStatus",
    "Plan",
    "WorkerApp",
    "WorkerSettings",
    "assign",
    "plan",
]

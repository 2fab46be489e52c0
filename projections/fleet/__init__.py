"""The projection fleet: worker processes that share a projection's slice ranges
through PostgreSQL leases, fenced, and rescaled with one command.

    slicejournal worker myapp.read_models:balances    # on 1..N hosts
    slicejournal scale balances 8                     # the running fleet follows

Programmatic use: `FleetWorker(journal, factory).run()` is what the command
runs; `FleetControl(journal)` scales, reads status and moves offsets. Both, and
`WorkerApp`, `WorkerSettings`, `FleetStatus`, `LeaseStatus`, are exported by
`projections` (one name for one thing): this package exports nothing of its own.
The names it exported in 0.2.0 still work, with a `DeprecationWarning`, until 0.4.0.
"""

from journal._lazy import lazy_attributes, moved, private

__getattr__, __dir__ = lazy_attributes(
    __name__,
    {},
    deprecated={
        **{
            name: moved(module, name, "projections")
            for name, module in (
                ("FleetControl", "projections.aio.fleet_control"),
                ("FleetStatus", "projections.fleet.status"),
                ("LeaseStatus", "projections.fleet.status"),
                ("FleetWorker", "projections.fleet.worker"),
                ("WorkerApp", "projections.fleet.worker"),
                ("WorkerSettings", "projections.fleet.worker"),
            )
        },
        **{
            name: private("projections.fleet.assignment", name)
            for name in ("LeaseRow", "Plan", "assign", "plan")
        },
    },
)

__all__: list[str] = []

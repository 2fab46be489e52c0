"""The projection the fleet tests run in `slicejournal worker` subprocesses.

`tests.fleet_app:balances` is the factory `(journal, slice_range) -> Projection`:
the bank workload's grouped exactly-once handler, whose `applied(pid, seq_nr)`
primary key makes any event applied twice an error the test sees.
"""

from __future__ import annotations

from journal import BacktrackingSettings, Journal, SliceRange
from projections import Projection, ProjectionSettings
from tests import bank
from tests.conftest import fast_query_settings

NAME = "balances"


def balances(journal: Journal, slice_range: SliceRange) -> Projection:
    return Projection.grouped(
        journal,
        name=NAME,
        entity_type=bank.ENTITY,
        slice_range=slice_range,
        handler=bank.make_grouped_handler(journal),
        settings=ProjectionSettings(
            group_after_envelopes=20, group_after_duration=0.1, management_poll_interval=0.5
        ),
        # Late commits in the tests stay open up to 5 s: backtrack behind that.
        query_settings=fast_query_settings(
            buffer_size=100, backtracking=BacktrackingSettings(window=20, behind_current_time=6)
        ),
    )

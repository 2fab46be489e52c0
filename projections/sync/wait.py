# Generated from projections/aio/wait.py by tools/async_to_sync.py: do not edit.
# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.
"""The sync driver of `SyncProjectionManagement.wait_for` (see projections/wait.py).

One connection of its own, LISTENing on the projections' commit channel before
the first check, so a commit between the check and the wait is never missed;
then check, wait for a notification naming the projection (or the re-check
interval), check again, until nothing is pending or the time is up. The sync
twin is generated from this module.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from journal.notifications import decode_payload
from journal.sync.journal import SyncJournal
from journal.sync.pool import connect
from projections.tables import ProjectionTables
from projections.wait import RECHECK_SECONDS, WaitSql, WaitTarget, timed_out


def wait_until_handled(
    journal: SyncJournal,
    tables: ProjectionTables,
    name: str,
    targets: Sequence[WaitTarget],
    seconds: float,
) -> None:
    """Return once projection `name` handled every target; `WaitTimeout` otherwise."""
    deadline = time.monotonic() + seconds
    statements = WaitSql(tables)
    conn = connect(journal.dsn, connect_timeout=journal.settings.connect_timeout_seconds)
    try:
        conn.execute(statements.listen)
        pending = list(targets)
        while pending:
            statement = statements.pending(name, pending)
            cur = conn.execute(statement.query, statement.params)
            pending = [pending[i - 1] for (i,) in cur.fetchall()]
            remaining = deadline - time.monotonic()
            if not pending:
                return
            if remaining <= 0:
                raise timed_out(name, pending, seconds)
            for notify in conn.notifies(timeout=min(remaining, RECHECK_SECONDS)):
                decoded = decode_payload(notify.payload)
                if decoded is not None and decoded[0] == name:
                    break
    finally:
        with contextlib.suppress(Exception):
            conn.close()

"""Fencing: an offset-storing transaction proves, inside itself, that its lease still holds.

A fleet worker frozen past its lease's expiry (SIGSTOP, a GC pause, a network
partition) may wake up in the middle of a batch after another worker took its
range over. Checking the lease before the transaction is not enough; the check
must be part of the transaction that stores the offsets. `Fence.statement` is
run in every such transaction right before its offset rows (after the
handler's writes): it calls the schema's fence function, which locks the
lease row `FOR KEY SHARE` (a takeover, which locks it `FOR UPDATE`, waits for
the transaction to end; the owner's renewals do not) and raises SQLSTATE
`SJ001` unless the row still has this owner and epoch and has not expired on
the database clock. The transaction then rolls
back and the runner raises `LeaseLost`. A fenced handler transaction also
starts with the idle limit (`Fence.begin()`: BEGIN and the setting in one query;
`Fence.idle_limit()` where a transaction is open already): it may sit idle at
most the lease TTL, so a worker frozen mid-batch has its transaction (and the
read-model rows it locked) ended by the server instead of holding the next
owner up. The server arms that timeout only when a statement ends with a Sync,
so on a server without a bound on the whole transaction a fenced transaction is
not pipelined; it saves its waits by sending fewer statements instead (the fence
and the offset rows in one, `OffsetSql.save`). PostgreSQL 17 added that bound,
`transaction_timeout`, which the server enforces while it waits for the next
message of a pipeline too. There (`bounds_whole_transactions`) a fenced batch is
pipelined like any other, BEGIN to COMMIT with one wait, and starts with
`Fence.transaction_limit()`: the whole transaction may last at most the lease TTL,
so a worker frozen mid-batch holds its locks at most that long after BEGIN
(while the server waits to read from it; a server blocked writing a large result
to a frozen client is not interrupted, in either way of sending). A batch that
needs longer is ended by the server; the runner then runs that instance's
batches synced, as above.

Without a fence the offset rows themselves still guard against doubles: event
rows are inserted without `ON CONFLICT`, so a second instance storing the same
event fails with `OffsetConflict` instead of applying it twice.
"""

from __future__ import annotations

import functools

import attrs
import psycopg
from psycopg import sql

from journal.slices import SliceRange
from journal.tables import rendered
from projections.errors import LeaseLost, OffsetConflict, ProjectionError
from projections.tables import ProjectionTables

FENCE_SQLSTATE = "SJ001"


@attrs.frozen
class Fence:
    """The lease an instance runs under: range, owner and the epoch it was claimed at."""

    projection_name: str
    slice_range: SliceRange
    owner: str
    epoch: int
    idle_timeout_ms: int

    def statement(self, tables: ProjectionTables) -> tuple[str, tuple[object, ...]]:
        return _fence_call(tables), self.params()

    def params(self) -> tuple[object, ...]:
        """The fence function's arguments, in its order (`statement`, `OffsetSql`'s
        fenced insert)."""
        r = self.slice_range
        return (
            self.projection_name,
            r.min_slice,
            r.max_slice,
            self.owner,
            self.epoch,
            self.idle_timeout_ms,
        )

    def begin(self) -> str:
        """BEGIN and `idle_limit`'s setting in one simple-protocol query, so a fenced
        handler transaction starts with one wait for the server instead of two."""
        return _begin(self.idle_timeout_ms)

    def idle_limit(self) -> tuple[sql.SQL, tuple[object, ...]]:
        """The first statement of a fenced handler transaction: the server ends it if it
        sits idle longer than the TTL, so a worker frozen mid-handler (its read-model
        row locks held) cannot block the range's next owner for long."""
        query = sql.SQL("SELECT set_config('idle_in_transaction_session_timeout', %s, true)")
        return query, (str(self.idle_timeout_ms),)

    def transaction_limit(self) -> tuple[sql.SQL, dict[str, object]]:
        """The first statement after BEGIN of a pipelined fenced batch (only where
        `bounds_whole_transactions`): the server ends the transaction once it has lasted
        the TTL, whether it waits for a Sync or for the rest of a pipeline, so a worker
        frozen mid-batch holds its locks for at most that long after BEGIN (see the
        module for the one wait it does not cover)."""
        return _TRANSACTION_LIMIT, {"ms": str(self.idle_timeout_ms)}


def bounds_whole_transactions(server_version: int) -> bool:
    """Whether the server has `transaction_timeout` (PostgreSQL 17 and later), which
    ends a transaction that lasts too long even while the server waits for the next
    message of a pipeline (`idle_in_transaction_session_timeout` waits for a Sync)."""
    return server_version >= _TRANSACTION_TIMEOUT_SINCE


_TRANSACTION_TIMEOUT_SINCE = 170000
# Zero first: the server starts the timer when the setting turns positive inside a
# transaction, and keeps a timer already running (a server-wide default) as it is.
_TRANSACTION_LIMIT = sql.SQL(
    "SELECT set_config('transaction_timeout', '0', true), "
    "set_config('transaction_timeout', %(ms)s, true), "
    "set_config('idle_in_transaction_session_timeout', %(ms)s, true)"
)


@functools.cache
def _begin(idle_timeout_ms: int) -> str:
    """`Fence.begin`'s query, composed once per timeout: it starts every fenced batch."""
    return rendered(
        sql.SQL("BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}").format(
            sql.Literal(idle_timeout_ms)
        )
    )


@functools.cache
def _fence_call(tables: ProjectionTables) -> str:
    """The fence function's call, composed once per installation: it runs in every batch."""
    return rendered(sql.SQL("SELECT {}(%s, %s, %s, %s, %s, %s)").format(tables.lease_fence))


def offset_error(
    error: BaseException, tables: ProjectionTables, where: str
) -> ProjectionError | None:
    """`LeaseLost` or `OffsetConflict` if `error` is one of those, else None."""
    if not isinstance(error, psycopg.Error):
        return None
    if error.sqlstate == FENCE_SQLSTATE:
        return LeaseLost(f"projection {where}: {error.diag.message_primary or error}")
    if (
        isinstance(error, psycopg.errors.UniqueViolation)
        and error.diag.table_name == tables.names.offset_table
        and error.diag.schema_name == tables.schema_name
    ):
        return OffsetConflict(
            f"projection {where}: another instance already stored an offset this "
            f"transaction was storing (two instances over overlapping slice ranges?); "
            f"rolled back: {error.diag.message_detail or error}"
        )
    return None

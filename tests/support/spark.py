"""The bank read model's handlers for Spark executors (sync psycopg), importable by them.

Executors unpickle these: each is a `functools.partial` of a function of this
module, which they import from the project root on their PYTHONPATH.
"""

from __future__ import annotations

import functools
import os
import signal
from typing import Any

from psycopg import Connection, sql

from journal import EventEnvelope
from slicejournal.examples.bank import BalancesReadModel


def _apply(schema: str | None, conn: Connection[Any], envs: list[EventEnvelope]) -> None:
    # schema None: unqualified names, resolved by search_path (what a rebuild needs).
    BalancesReadModel(schema).handle_sync(conn, envs)


def bank_handler(schema: str) -> Any:
    """Applies bank events to `schema`.balances and records each in `schema`.applied."""
    return functools.partial(_apply, schema)


def _record(schema: str, conn: Connection[Any], envs: list[EventEnvelope]) -> None:
    conn.cursor().executemany(
        sql.SQL("INSERT INTO {} (pid, seq_nr, deleted) VALUES (%s, %s, %s)").format(
            sql.Identifier(schema, "seen")
        ),
        [(e.persistence_id, e.seq_nr, e.deleted) for e in envs],
    )


def recording_handler(schema: str) -> Any:
    """Records (pid, seq_nr, deleted) of every envelope, in order, in `schema`.seen
    (`n bigserial, pid text, seq_nr bigint, deleted boolean`)."""
    return functools.partial(_record, schema)


def unqualified_handler() -> Any:
    """The bank handler naming its tables unqualified (what a rebuild needs)."""
    return functools.partial(_apply, None)


def _apply_or_die(
    schema: str, marker: str, conn: Connection[Any], envs: list[EventEnvelope]
) -> None:
    _apply(schema, conn, envs)
    try:
        os.unlink(marker)
    except FileNotFoundError:
        return
    # The handler's writes are in, the offsets not yet: the Python worker dies here.
    os.kill(os.getpid(), signal.SIGKILL)


def dying_handler(schema: str, marker: str) -> Any:
    """The bank handler that SIGKILLs its own Spark Python worker, mid-transaction,
    the first time it runs while `marker` exists."""
    return functools.partial(_apply_or_die, schema, marker)


def _totals(conn: Connection[Any], envs: list[EventEnvelope]) -> None:
    for e in envs:
        if e.from_snapshot:  # the id's state as of seq_nr: replaces what came before
            conn.execute(
                "INSERT INTO totals (pid, balance, seq_nr) VALUES (%s, %s, %s) "
                "ON CONFLICT (pid) DO UPDATE SET balance = excluded.balance, "
                "seq_nr = excluded.seq_nr",
                (e.persistence_id, e.event["balance"], e.seq_nr),
            )
        else:
            conn.execute(
                "INSERT INTO totals (pid, balance, seq_nr) VALUES (%s, %s, %s) "
                "ON CONFLICT (pid) DO UPDATE SET balance = totals.balance + excluded.balance, "
                "seq_nr = excluded.seq_nr",
                (e.persistence_id, e.event["amount"], e.seq_nr),
            )


def totals_handler() -> Any:
    """Folds bank events, or an id's snapshot (`{"balance": n}`) then its later events,
    into `totals (pid, balance, seq_nr)`, named unqualified (what a rebuild needs)."""
    return functools.partial(_totals)


def _apply_changes(schema: str, conn: Connection[Any], changes: list[Any]) -> None:
    # `changes`: DurableStateChanges, each the latest revision the stream read of an id.
    for change in changes:
        if not change.deleted and change.value["rev"] != change.revision:
            raise AssertionError(f"{change!r}: its value names another revision")
    cur = conn.cursor()
    # A revision applied twice fails on the primary key (and so the batch).
    cur.executemany(
        sql.SQL("INSERT INTO {} (pid, revision) VALUES (%s, %s)").format(
            sql.Identifier(schema, "state_applied")
        ),
        [(c.persistence_id, c.revision) for c in changes],
    )
    cur.executemany(
        sql.SQL(
            "INSERT INTO {} (pid, revision, deleted) VALUES (%s, %s, %s) ON CONFLICT (pid) "
            "DO UPDATE SET revision = EXCLUDED.revision, deleted = EXCLUDED.deleted"
        ).format(sql.Identifier(schema, "state_model")),
        [(c.persistence_id, c.revision, c.deleted) for c in changes],
    )


def state_handler(schema: str) -> Any:
    """Applies durable state changes to `schema`.state_model (pid, revision, deleted) and
    records each in `schema`.state_applied (n bigserial, pid, revision; unique (pid,
    revision)), in the order applied."""
    return functools.partial(_apply_changes, schema)

"""The bank read model's handler for Spark executors (sync psycopg), importable by them."""

from __future__ import annotations

import functools
import os
import signal
from typing import Any

from psycopg import Connection, sql

from journal import EventEnvelope


def _apply(schema: str | None, conn: Connection[Any], envs: list[EventEnvelope]) -> None:
    # schema None: unqualified names, resolved by search_path (what a rebuild needs).
    qualify = (schema,) if schema is not None else ()
    applied = sql.SQL("INSERT INTO {} (pid, seq_nr) VALUES (%s, %s)").format(
        sql.Identifier(*qualify, "applied")
    )
    balance = sql.SQL(
        "INSERT INTO {b} (pid, balance) VALUES (%s, %s) "
        "ON CONFLICT (pid) DO UPDATE SET balance = {t}.balance + excluded.balance"
    ).format(b=sql.Identifier(*qualify, "balances"), t=sql.Identifier("balances"))
    with conn.cursor() as cur:
        cur.executemany(applied, [(e.persistence_id, e.seq_nr) for e in envs])
        cur.executemany(balance, [(e.persistence_id, e.event["amount"]) for e in envs])


def bank_handler(schema: str) -> Any:
    """Applies bank events to `schema`.balances and records each in `schema`.applied."""
    return functools.partial(_apply, schema)


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

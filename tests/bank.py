"""Moved to `tests.support.bank`; this name stays for the test modules not yet moved
(test_sync_projection, test_sync_parity, test_horizon: `from tests import bank`)."""

from __future__ import annotations

from tests.support.bank import (
    ENTITY,
    Writers,
    account,
    assert_applied_exactly_once,
    create_read_model,
    expected_balances,
    journal_count,
    make_grouped_handler,
    make_handler,
    projected,
    table,
    wait_until_projected,
)

__all__ = [
    "ENTITY",
    "Writers",
    "account",
    "assert_applied_exactly_once",
    "create_read_model",
    "expected_balances",
    "journal_count",
    "make_grouped_handler",
    "make_handler",
    "projected",
    "table",
    "wait_until_projected",
]

"""Moved: the projection tests are in tests/integration/test_projections.py, their helpers
in `tests.support.projections`. These names stay importable from here for the test
modules not yet moved (test_sync_projection, test_sync_parity, test_horizon)."""

from __future__ import annotations

from tests.support.projections import FAST, assert_exact, bank_journal, journal_settings

__all__ = ["FAST", "assert_exact", "bank_journal", "journal_settings"]

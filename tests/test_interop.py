"""Moved: the Pekko interop tests are in tests/integration/test_interop.py, the Pekko
writes in `tests.support.pekko`. These names stay importable from here for
test_horizon, not yet moved."""

from __future__ import annotations

from tests.support.pekko import PekkoEvent, pekko_insert

__all__ = ["PekkoEvent", "pekko_insert"]

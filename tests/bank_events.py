"""The tests' own typed bank events (the demo has its own; tests do not borrow them)."""

from __future__ import annotations

import attrs


@attrs.frozen
class Deposited:
    amount: int


@attrs.frozen
class Withdrawn:
    amount: int

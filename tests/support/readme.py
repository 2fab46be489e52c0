"""The README's ```python blocks: every one is a complete program the tests run."""

from __future__ import annotations

import re

from tests.support import ROOT

README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def readme_examples() -> list[str]:
    """The text of every ```python block of the README, in order."""
    return BLOCK.findall(README.read_text(encoding="utf-8"))

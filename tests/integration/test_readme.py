"""The README's examples run as written, twice in a row, so the README cannot rot.

Each ```python block is saved as a file and run as a program in a fresh
database that `slicejournal migrate` prepared — exactly what a user would do —
then run again, because a user runs an example more than once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.readme import example_database, readme_examples


@pytest.fixture(scope="module")
def example_dsn(pg_dsn: str) -> Iterator[str]:
    """A database of its own, created and dropped by this module."""
    with example_database(pg_dsn) as dsn:
        yield dsn


def test_the_readme_has_examples() -> None:
    assert len(readme_examples()) >= 3


# Two runs of at most 120 s each (the Spark example starts a JVM twice on 2 cores).
@pytest.mark.timeout(300)
@pytest.mark.parametrize("index", range(len(readme_examples())))
def test_readme_example_runs_as_written_twice(index: int, example_dsn: str, tmp_path: Path) -> None:
    source = readme_examples()[index]
    script = tmp_path / f"example_{index}.py"
    script.write_text(source, encoding="utf-8")
    env = {**os.environ, "SLICEJOURNAL_DSN": example_dsn}
    for attempt in (1, 2):
        result = subprocess.run(
            # A deprecated name (it warns where the example uses it) fails the example.
            [sys.executable, "-W", "error::DeprecationWarning:__main__", str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
            check=False,
        )
        assert result.returncode == 0, (
            f"README example {index + 1}, run {attempt}:\n{source}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
        assert result.stdout.strip(), f"README example {index + 1} printed nothing"
        assert "Traceback" not in result.stderr, result.stderr

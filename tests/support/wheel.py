"""The project's wheel, installed outside the repository: what a user, or a cluster's
executors, get from `pip install slicejournal`.

Shared by the installed-wheel tests and the Spark cluster fixture (whose
executors run on a Python of their own with the wheel, not this tree).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def run(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run `cmd`; a non-zero exit fails the test with its output."""
    result = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{cmd}: {result.stdout}\n{result.stderr}"
    return result


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without `SLICEJOURNAL*` and `PYTHON*` (no DSN, no
    PYTHONPATH leading back into the source tree), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLICEJOURNAL", "PYTHON"))}
    return {**env, **extra}


def build_wheel(dist: Path) -> Path:
    """Build the wheel of this tree into `dist`; its path."""
    dist.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        dist.parent)  # fmt: skip
    (wheel,) = dist.glob("slicejournal-*.whl")
    return wheel


def make_venv(venv: Path, *requirements: str, timeout: float = 600) -> Path:
    """A fresh virtualenv at `venv` with `requirements` installed; its bin directory."""
    run([sys.executable, "-m", "venv", str(venv)], venv.parent)
    bin_dir = venv / "bin"
    if requirements:
        run([str(bin_dir / "python"), "-m", "pip", "install", "-q", *requirements],
            venv.parent, clean_env(), timeout=timeout)  # fmt: skip
    return bin_dir

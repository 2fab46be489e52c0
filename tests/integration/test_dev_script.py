"""`./dev`, the one entry point of the README, explains itself instead of failing."""

from __future__ import annotations

import subprocess

from tests.support import ROOT


def dev(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "dev"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dev_without_arguments_prints_its_usage() -> None:
    result = dev()
    assert result.returncode == 0, result.stderr
    for task in ("./dev demo", "./dev test", "./dev lint", "./dev bench NAME"):
        assert task in result.stdout
    assert "set -euo" not in result.stdout


def test_dev_bench_without_a_name_lists_the_benchmarks() -> None:
    result = dev("bench")
    assert result.returncode == 2
    for name in ("append", "query", "projection"):
        assert name in result.stderr
    assert "_common" not in result.stderr


def test_dev_rejects_unknown_tasks_and_benchmarks() -> None:
    assert "unknown task 'nope'" in dev("nope").stderr
    result = dev("bench", "nope")
    assert result.returncode == 2
    assert "no benchmark named 'nope'" in result.stderr

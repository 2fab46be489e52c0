"""`slicejournal retention apply` and `slicejournal projections list | register | retire`,
run as subprocesses against a journal the test fills (and reads back) itself."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from journal import Journal
from projections import ProjectionManagement, Retention, RetentionPolicy, RetentionProgress
from tests.integration.test_retention import (
    ENTITY,
    create_target,
    events,
    pid,
    projection,
    rows,
    write,
)

CLI = [sys.executable, "-m", "slicejournal.cli"]


def cli(journal: Journal, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*CLI, *args, "--dsn", journal.dsn, "--schema", journal.settings.schema]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.timeout(120)
async def test_bad_arguments_are_usage_errors_before_anything_is_written(
    journal: Journal,
) -> None:
    await write(journal, range(5))
    await asyncio.sleep(1.1)
    before = await rows(journal)
    for args, says in (
        (["--keep", "7x"], "expected a positive duration"),
        (["--keep", "0s"], "expected a positive duration"),
        (["--keep=-1d"], "expected a positive duration"),
        (["--keep", "1s", "--batch-size", "0"], "between"),
        (["--keep", "1s", "--ranges", "3"], "must divide 1024"),
        ([], "needs --keep, --keep-last or --keep-snapshot"),
    ):
        result = cli(journal, "retention", "apply", "--entity-type", ENTITY, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert says in result.stderr and "Traceback" not in result.stderr
    result = cli(journal, "retention", "apply", "--entity-type", "a|b", "--keep", "1s")
    assert result.returncode == 2 and "must not contain" in result.stderr
    assert await rows(journal) == before


@pytest.mark.timeout(120)
async def test_dry_run_apply_list_register_retire(journal: Journal) -> None:
    handler = await create_target(journal, "balances")
    await write(journal, range(12), events=2)
    await projection(journal, "balances", handler).run(until_caught_up=True)
    consumed = await events(journal)
    await ProjectionManagement(journal).pause("balances")
    await write(journal, range(4), events=1)  # seq_nr 3 of four ids: not consumed
    await asyncio.sleep(1.1)
    before = await rows(journal)

    dry = cli(journal, "retention", "apply", "--entity-type", ENTITY, "--keep", "1s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert await rows(journal) == before  # the dry run deleted nothing
    assert "dry run: nothing deleted" in dry.stdout
    assert "total: 24 event(s) would go, 4 held back by projections" in dry.stdout
    assert "balances (offset " in dry.stdout and "paused)" in dry.stdout

    listed = cli(journal, "projections", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (info,) = json.loads(listed.stdout)
    assert (info["name"], info["registration"], info["paused"]) == ("balances", "implicit", True)
    assert info["seen_entity_types"] == [ENTITY] and info["min_offset"] is not None
    table = cli(journal, "projections", "list")
    assert table.stdout.splitlines()[1].split()[:4] == ["balances", "implicit", ENTITY, "(seen)"]

    done = cli(journal, "retention", "apply", "--entity-type", ENTITY, "--keep", "1s",
               "--batch-size", "5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "total: 24 event(s) deleted, 4 held back by projections" in done.stdout
    assert await events(journal) == {(pid(i), 3) for i in range(4)}
    assert not consumed & await events(journal)

    # A projection registered before it starts holds everything it has not consumed.
    registered = cli(journal, "projections", "register", "audit", "--entity-type", ENTITY)
    assert registered.returncode == 0, registered.stderr
    retired = cli(journal, "projections", "retire", "balances")
    assert retired.returncode == 0 and "retired" in retired.stdout
    held = cli(journal, "retention", "apply", "--entity-type", ENTITY, "--keep", "1s")
    assert "total: 0 event(s) deleted, 4 held back" in held.stdout, held.stdout
    assert "audit (no offset yet)" in held.stdout
    assert "offset rows of retired projections deleted: 0" not in held.stdout
    cli(journal, "projections", "retire", "audit")
    freed = cli(journal, "retention", "apply", "--entity-type", ENTITY, "--keep", "1s")
    assert "total: 4 event(s) deleted, 0 held back" in freed.stdout, freed.stdout
    assert await events(journal) == set()
    listed = cli(journal, "projections", "list", "--json")
    assert {(i["name"], i["registration"]) for i in json.loads(listed.stdout)} == {
        ("audit", "retired"),
        ("balances", "retired"),
    }
    unknown = cli(journal, "projections", "retire", "nope")
    assert unknown.returncode == 1 and "unknown projection 'nope'" in unknown.stderr


@pytest.mark.timeout(120)
async def test_apply_shows_its_progress_on_stderr_unless_quiet_or_json(journal: Journal) -> None:
    await write(journal, range(40))
    await asyncio.sleep(1.1)
    common = ["retention", "apply", "--entity-type", ENTITY, "--keep", "1s", "--ranges", "4"]

    # The API: one call per report range with a slice to examine, counts growing.
    seen: list[RetentionProgress] = []
    dry = await Retention(journal).apply(
        RetentionPolicy(ENTITY, keep="1s"), dry_run=True, ranges=4, progress=seen.append
    )
    assert 1 <= len(seen) <= 4 and all(p.dry_run for p in seen)
    assert [p.slice_range for p in seen] == sorted({p.slice_range for p in seen})
    assert seen[-1].slices_done == seen[-1].slices_total and seen[-1].events == dry.events
    assert [p.slices_done for p in seen] == sorted(p.slices_done for p in seen)
    assert "would go" in seen[-1].describe()

    for quiet in (["--quiet"], ["--json"], ["-q", "--dry-run"]):
        result = cli(journal, *common, "--dry-run", *quiet)
        assert result.returncode == 0, result.stderr
        assert "retention: slices" not in result.stderr, quiet

    done = cli(journal, *common)
    assert done.returncode == 0, done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("retention: slices ")]
    assert len(lines) == len(seen), done.stderr
    total = seen[-1].slices_total
    assert f"({total}/{total} slices examined): {dry.events} event(s) deleted" in lines[-1]
    assert f"total: {dry.events} event(s) deleted" in done.stdout

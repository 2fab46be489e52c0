"""slicejournal on a real Spark standalone cluster and through Spark Connect.

One cluster for the module (a master and 2 workers from PySpark's own
scripts, tests/support/spark_cluster.py), executors on a Python of their own
that has only the installed wheel. Drivers are separate programs run with
this venv's Python (the README's example as written, and
tests/support/spark_cluster_job.py), so their sessions never meet the
local-mode `spark` fixture of this process; they print JSON and the tests
check the database themselves.

On the cluster: the README example; where the executors' Python comes from;
a batch read per slice range; `project` exactly once while a worker (its JVM,
its executor and their Python workers) is SIGKILLed mid-batch; `rebuild`.
Through a Connect server over the same cluster: the README example, the batch
read, `project` (availableNow, and a stream whose 3 s leases the client
renews while events are appended), `rebuild`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from psycopg import sql

from journal import JournalSettings, SyncJournal
from tests.support import ROOT
from tests.support.pg import drop_test_schema, fresh_schema_name, with_password
from tests.support.readme import example_database, readme_examples
from tests.support.spark_cluster import ConnectServer, SparkCluster, gone, spark_home, tail

pytestmark = pytest.mark.spark_cluster

JOB = ROOT / "tests" / "support" / "spark_cluster_job.py"
ENTITY = "Acct"
PIDS, EVENTS_PER_PID = 100, 20
DRIVER_TIMEOUT = 420.0


@attrs.frozen
class Filled:
    """A journal schema with `PIDS` x `EVENTS_PER_PID` events and the jobs' tables;
    `dsn` carries `password` (which no log, plan or event log may show)."""

    dsn: str
    schema: str
    password: str

    def rows(self, statement: str, *tables: str) -> list[tuple[Any, ...]]:
        import psycopg

        query = sql.SQL(statement).format(*(sql.Identifier(self.schema, t) for t in tables))
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(query).fetchall()

    def events(self) -> set[tuple[str, int]]:
        return {(p, s) for p, s in self.rows("SELECT persistence_id, seq_nr FROM {}",
                                             "event_journal")}  # fmt: skip


@pytest.fixture(scope="module")
def filled(pg_dsn: str) -> Iterator[Any]:
    """A factory of filled schemas (one per driver program), dropped at the end."""
    schemas: list[str] = []

    def fill(uri: bool) -> Filled:
        """`uri`: a URI DSN (`postgresql://user:password@...`), else key=value."""
        password, uri_dsn, key_value_dsn = with_password(pg_dsn)
        dsn = uri_dsn if uri else key_value_dsn
        schema = fresh_schema_name()
        schemas.append(schema)
        settings = JournalSettings(schema=schema)
        with SyncJournal.connect(dsn, settings, create_schema=True) as journal:
            for p in range(PIDS):
                events = [{"n": n} for n in range(EVENTS_PER_PID)]
                journal.append(f"{ENTITY}|{p}", events, expected_seq_nr=0)
            with journal.pool.connection() as conn:
                for table in ("applied", "streamed"):
                    conn.execute(
                        sql.SQL(
                            "CREATE TABLE {} (pid text, seq_nr bigint, PRIMARY KEY (pid, seq_nr))"
                        ).format(sql.Identifier(schema, table))
                    )
                conn.execute(
                    sql.SQL("CREATE TABLE {} (pid text PRIMARY KEY, events bigint)").format(
                        sql.Identifier(schema, "totals")
                    )
                )
        return Filled(dsn, schema, password)

    yield fill
    for schema in schemas:
        drop_test_schema(pg_dsn, schema)


def start_driver(script: Path, args: list[str], env: dict[str, str], cwd: Path) -> Any:
    return subprocess.Popen(
        [sys.executable, str(script), *args], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=(cwd / "driver.log").open("w"),
    )  # fmt: skip


def finish_driver(driver: Any, cwd: Path, what: str, logs: str = "") -> str:
    try:
        out, _ = driver.communicate(timeout=DRIVER_TIMEOUT)
    except subprocess.TimeoutExpired:
        driver.kill()
        out, _ = driver.communicate()
    err = tail(cwd / "driver.log", 60)
    assert driver.returncode == 0, f"{what} failed\n--- stdout\n{out}\n--- driver\n{err}\n{logs}"
    assert "Traceback" not in err, err
    return str(out)


def phases(out: str) -> dict[str, dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith('{"phase"')]
    return {line.pop("phase"): line for line in lines}


def spark_example() -> str:
    (example,) = [text for text in readme_examples() if "spark_session()" in text]
    return example


def run_readme_example(env: dict[str, str], pg_dsn: str, work: Path, logs: str) -> list[str]:
    """The README's Spark example as written, in a database of its own; its output lines."""
    (work / "example.py").write_text(spark_example(), encoding="utf-8")
    with example_database(pg_dsn) as dsn:
        driver = start_driver(work / "example.py", [], env | {"SLICEJOURNAL_DSN": dsn}, work)
        return finish_driver(driver, work, "the README's Spark example", logs).splitlines()


# What the example prints in a new database: 20 sales over 3 skus.
README_OUTPUT = [
    "events in the journal: 20",
    "[Row(slice=540, count=1), Row(slice=541, count=1), Row(slice=542, count=1)]",
    "[('sku-0', 7), ('sku-1', 7), ('sku-2', 6)]",
]


# -- the standalone cluster ----------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_the_readme_spark_example_runs_unchanged_on_the_cluster(
    spark_cluster: SparkCluster, pg_dsn: str, tmp_path: Path
) -> None:
    env = spark_cluster.driver_env()
    assert "PYTHONPATH" not in env and env["MASTER"].startswith("spark://127.0.0.1:")
    lines = run_readme_example(env, pg_dsn, tmp_path, spark_cluster.logs())
    assert lines == README_OUTPUT
    # It ran on the cluster: an application of the master, finished.
    apps = spark_cluster.state().get("completedapps")
    assert isinstance(apps, list) and any(a["name"] == "slicejournal" for a in apps), apps


@attrs.frozen
class JobRun:
    """What a run of the job program left: its data, its phases' JSON, its directory."""

    filled: Filled
    results: dict[str, dict[str, Any]]
    work: Path


@pytest.fixture(scope="module")
def cluster_run(
    spark_cluster: SparkCluster, filled: Any, tmp_path_factory: pytest.TempPathFactory
) -> JobRun:
    """One driver program on the cluster: probe, batch, project and rebuild; during
    `project`, the worker running the partition that sleeps mid-transaction is killed."""
    data: Filled = filled(uri=True)
    work = tmp_path_factory.mktemp("cluster-job")
    script = work / JOB.name
    shutil.copy(JOB, script)
    (work / "arm").touch()
    env = spark_cluster.driver_env(DSN=data.dsn, SCHEMA=data.schema, ENTITY=ENTITY,
                                   WORK=str(work))  # fmt: skip
    driver = start_driver(script, ["probe", "batch", "project", "rebuild"], env, work)
    killed: tuple[int, int] | None = None
    try:
        claimed = work / "claimed"
        deadline = time.monotonic() + DRIVER_TIMEOUT
        while killed is None and driver.poll() is None and time.monotonic() < deadline:
            text = claimed.read_text() if claimed.exists() else ""
            if text:
                pid = int(text)
                index = spark_cluster.worker_of(pid)
                assert index is not None, f"no worker runs handler process {pid}"
                (work / "arm").unlink()  # the retry applies instead of sleeping
                spark_cluster.kill_worker(index)
                assert gone(pid), "the handler's Python survived its worker"
                killed = (index, pid)
            time.sleep(0.2)
        out = finish_driver(driver, work, "the cluster job", spark_cluster.logs())
    finally:
        if driver.poll() is None:
            driver.kill()
        if killed is not None:
            spark_cluster.start_worker(killed[0])  # back to 2 workers for the next tests
    assert killed is not None, "no partition slept: nothing was killed"
    return JobRun(data, phases(out), work)


def check_executors(probe: dict[str, Any], python: Path) -> None:
    """Every executor ran `python` (not this venv's), with journal from the installed
    wheel and pyspark from the workers' pyspark.zip; nothing of this tree on its path
    (but SPARK_HOME, which is the pip-installed PySpark of this tree's venv)."""
    executors = probe["executors"]
    venv, home = python.parent.parent, str(spark_home())
    assert executors
    for where in executors:
        assert where["python"] == str(python), where
        assert Path(where["journal"]).is_relative_to(venv), where
        assert where["pyspark"].startswith(f"{home}/python/lib/pyspark.zip"), where
        ours = [p for p in where["path"] if p.startswith(str(ROOT)) and not p.startswith(home)]
        assert not ours and str(ROOT) not in where["path"], where
        assert str(ROOT) not in where["pythonpath"].replace(home, ""), where


@pytest.mark.timeout(900)
def test_executors_run_the_installed_wheel_on_their_own_python(
    cluster_run: JobRun, spark_cluster: SparkCluster
) -> None:
    check_executors(cluster_run.results["probe"], spark_cluster.python)


def check_batch(batch: dict[str, Any], data: Filled) -> None:
    """Each Spark partition is one slice range (of 4) and holds every event of it."""
    # (not the events a later `stream` phase appended, under pids "...|stream-N")
    expected = dict(data.rows("SELECT slice / 256, count(*) FROM {} WHERE persistence_id "
                              "NOT LIKE '%|stream-%' GROUP BY 1", "event_journal"))  # fmt: skip
    seen = {}
    for part, lo, hi, n in batch["partitions"]:
        assert lo // 256 == hi // 256 == part, (part, lo, hi)
        seen[part] = n
    assert seen == expected
    assert batch["distinct"] == PIDS * EVENTS_PER_PID


def test_a_batch_read_on_the_cluster_reads_every_event_once_per_slice_range(
    cluster_run: JobRun,
) -> None:
    check_batch(cluster_run.results["batch"], cluster_run.filled)


def test_project_applies_every_event_once_though_a_worker_dies_mid_batch(
    cluster_run: JobRun,
) -> None:
    data = cluster_run.filled
    assert cluster_run.results["project"]["exception"] is None
    applied = {(p, s) for p, s in data.rows("SELECT pid, seq_nr FROM {}", "applied")}
    assert applied == data.events()  # the primary key forbids a second application
    assert len(applied) == PIDS * EVENTS_PER_PID


def check_rebuild(rebuilt: dict[str, Any], data: Filled) -> None:
    per_pid = data.rows("SELECT persistence_id, count(*) FROM {} GROUP BY 1", "event_journal")
    assert rebuilt["events"] == sum(n for _, n in per_pid)
    assert rebuilt["tables"] == [f"{data.schema}.totals"]
    assert dict(data.rows("SELECT pid, events FROM {}", "totals")) == dict(per_pid)


def test_rebuild_on_the_cluster(cluster_run: JobRun) -> None:
    check_rebuild(cluster_run.results["rebuild"], cluster_run.filled)


# -- Spark Connect -------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_the_readme_spark_example_runs_unchanged_through_spark_connect(
    spark_connect: ConnectServer, pg_dsn: str, tmp_path: Path
) -> None:
    env = spark_connect.env()
    assert "MASTER" not in env and env["SPARK_REMOTE"] == spark_connect.url
    logs = spark_connect.cluster.logs()
    assert run_readme_example(env, pg_dsn, tmp_path, logs) == README_OUTPUT


@pytest.fixture(scope="module")
def connect_run(
    spark_connect: ConnectServer, filled: Any, tmp_path_factory: pytest.TempPathFactory
) -> JobRun:
    data: Filled = filled(uri=False)
    work = tmp_path_factory.mktemp("connect-job")
    script = work / JOB.name
    shutil.copy(JOB, script)
    env = spark_connect.env(DSN=data.dsn, SCHEMA=data.schema, ENTITY=ENTITY, WORK=str(work))
    args = ["probe", "batch", "project", "stream", "rebuild"]
    driver = start_driver(script, args, env, work)
    logs = spark_connect.daemon.describe() if spark_connect.daemon else ""
    return JobRun(data, phases(finish_driver(driver, work, "the Connect job", logs)), work)


@pytest.mark.timeout(900)
def test_over_spark_connect_the_executors_run_the_servers_python(
    connect_run: JobRun, spark_cluster: SparkCluster
) -> None:
    check_executors(connect_run.results["probe"], spark_cluster.python)


def test_over_spark_connect_a_batch_read_reads_every_event_once(
    connect_run: JobRun,
) -> None:
    data, results = connect_run.filled, connect_run.results
    check_batch(results["batch"], data)


def test_over_spark_connect_project_applies_every_event_once(
    connect_run: JobRun,
) -> None:
    data, results = connect_run.filled, connect_run.results
    assert results["project"]["exception"] is None
    # `applied` got the events before the stream phase appended more; `streamed` all.
    applied = {(p, s) for p, s in data.rows("SELECT pid, seq_nr FROM {}", "applied")}
    assert len(applied) == PIDS * EVENTS_PER_PID and applied <= data.events()
    stream = results["stream"]
    assert stream["active"] is True and stream["exception"] is None, stream
    streamed = {(p, s) for p, s in data.rows("SELECT pid, seq_nr FROM {}", "streamed")}
    assert streamed == data.events()
    assert stream["journal"] == stream["applied"] == len(streamed)
    # The client's telemetry sees the run start and stop. (Its micro-batches, read from
    # the query's lastProgress, did not reach it over Connect in these runs: README.)
    assert {"started", "stopped"} <= set(stream["telemetry"]), stream


def test_over_spark_connect_rebuild(
    connect_run: JobRun,
) -> None:
    data, results = connect_run.filled, connect_run.results
    check_rebuild(results["rebuild"], data)


def test_the_password_is_in_no_log_and_no_event_log_of_the_cluster(
    cluster_run: JobRun, connect_run: JobRun, spark_cluster: SparkCluster
) -> None:
    """The jobs' DSNs carried a password (one URI, one key=value): it is in no file the
    master, the workers, the executors, the Connect server or the drivers wrote (logs,
    event logs, checkpoints)."""
    skip = (spark_cluster.base / "executor-venv", spark_cluster.base / "dist")
    written = [
        p
        for base in (spark_cluster.base, cluster_run.work, connect_run.work)
        for p in base.rglob("*")
        if p.is_file() and not p.is_relative_to(skip[0]) and not p.is_relative_to(skip[1])
    ]
    assert any("eventlog" in str(p) for p in written), "no event log was written"
    for run in (cluster_run, connect_run):
        secret = run.filled.password.encode()
        assert secret in run.filled.dsn.encode()
        for path in written:
            assert secret not in path.read_bytes(), f"the password is in {path}"

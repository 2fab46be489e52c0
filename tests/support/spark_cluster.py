"""A real Spark standalone cluster (a master and workers) and a Spark Connect server,
started on 127.0.0.1 from PySpark's own scripts, for the cluster tests.

Local mode runs everything in one JVM with the driver's Python: it cannot show
what a cluster changes — executors in other JVMs, on another Python that has
only the installed wheel (not this source tree), a worker dying mid-batch, a
Spark Connect client that has no JVM at all. This module starts the real
thing from the pip-installed PySpark (`$SPARK_HOME/bin/spark-class`,
`spark-submit`), as an operator would, with everything in one temporary
directory (configuration, logs, work directories).

Every process runs in a process group of its own (and PySpark's Python
daemons make groups of their own), so `stop()` and `kill_worker()` kill the
whole tree of a daemon: its group and every descendant's group. Nothing of
the test process's environment leaks into the cluster: no `PYTHONPATH` (the
local-mode `spark` fixture points it at this tree), no `SPARK_*`/`PYSPARK_*`
settings; executors and the driver-side Python workers run `PYSPARK_PYTHON`,
the separate Python, and find PySpark through `$SPARK_HOME/python/lib/pyspark.zip`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import attrs
import psutil

# What the executors' Python needs beside the wheel (the `spark` extra without pyspark,
# which the workers put on the path themselves, and a psycopg with its libpq).
EXECUTOR_REQUIREMENTS = ("psycopg[binary]", "pyarrow>=15", "adbc-driver-postgresql>=1.0")

# Each application takes at most 2 cores, one per executor, so a driver and the
# Connect server (an application too) can run side by side on two 2-core workers.
SPARK_DEFAULTS = {
    "spark.cores.max": "2",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
START_TIMEOUT = 180.0  # a loaded 2-core machine starts a JVM in tens of seconds


def spark_home() -> Path:
    """The pip-installed PySpark's directory: its `bin/`, `jars/` and `python/lib/`."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def java_missing() -> str | None:
    """Why no Spark JVM can start here, or None."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return None
    if shutil.which("java"):
        return None
    return "no Java on this machine (Spark needs a JDK 17+: set JAVA_HOME or put java on PATH)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and all its descendants (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_tree(pid: int) -> None:
    """SIGKILL the process group of `pid` and of each of its descendants."""
    groups = set()
    for p in tree(pid):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(p.pid))
    groups.discard(os.getpgid(0))  # never our own group
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def gone(pid: int, within: float = 30.0) -> bool:
    """Whether process `pid` is dead (or a zombie nobody reaped yet) within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return "\n".join(line[:300] for line in text[-lines:] if not line.lstrip().startswith("at "))


@attrs.define
class Daemon:
    """A JVM this module started, with its log."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        kill_tree(self.process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)

    def describe(self) -> str:
        state = "running" if self.process.poll() is None else f"exited {self.process.returncode}"
        return f"--- {self.name} ({state}), {self.log}:\n{tail(self.log)}"


class SparkCluster:
    """A standalone master and `workers` workers on 127.0.0.1, all under `base`."""

    def __init__(self, base: Path, python: Path, *, workers: int = 2) -> None:
        """`python`: the executors' (and driver-side Python workers') interpreter."""
        self.base = base
        self.python = python
        self.home = spark_home()
        self.conf_dir = base / "conf"
        self.log_dir = base / "logs"
        self.port, self.ui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.master: Daemon | None = None
        self.workers: list[Daemon | None] = [None] * workers
        events = base / "events"
        for d in (self.conf_dir, self.log_dir, events):
            d.mkdir(parents=True, exist_ok=True)
        event_log = {  # uncompressed, so a test can read it
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
        }
        defaults = "".join(f"{k} {v}\n" for k, v in (SPARK_DEFAULTS | event_log).items())
        (self.conf_dir / "spark-defaults.conf").write_text(defaults)

    # -- environment ---------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment for anything of the cluster (daemons, drivers, Connect)."""
        leaks = ("PYTHON", "SPARK", "PYSPARK", "SLICEJOURNAL")
        env = {k: v for k, v in os.environ.items() if not k.startswith(leaks)}
        env.pop("MASTER", None)
        env |= {
            "SPARK_HOME": str(self.home),
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_LOG_DIR": str(self.log_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": str(self.python),
        }
        return env | extra

    def driver_env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver program on this cluster (`MASTER` set)."""
        return self.env(MASTER=self.master_url, **extra)

    # -- processes -----------------------------------------------------------------------------

    def _launch(self, name: str, args: list[str], **env: str) -> Daemon:
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env(**env), cwd=self.base, start_new_session=True,
            )  # fmt: skip
        return Daemon(name, process, log)

    def start(self) -> None:
        """Launch the master and the workers; `wait_ready()` waits for them."""
        spark_class = str(self.home / "bin" / "spark-class")
        self.master = self._launch("master", [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port),
        ])  # fmt: skip
        for i in range(len(self.workers)):
            self.start_worker(i, wait=False)

    def wait_ready(self) -> None:
        self.wait_for("the master", lambda: self.state().get("status") == "ALIVE")
        self.wait_for_workers()

    def start_worker(self, index: int, *, wait: bool = True) -> None:
        work = self.base / "work" / f"worker{index}"
        work.mkdir(parents=True, exist_ok=True)
        self.workers[index] = self._launch(
            f"worker{index}",
            [
                str(self.home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                self.master_url, "--host", "127.0.0.1", "--cores", "2", "--memory", "1g",
                "--webui-port", str(free_port()), "--work-dir", str(work),
            ],
            SPARK_WORKER_DIR=str(work),
        )  # fmt: skip
        if wait:
            self.wait_for_workers()

    def wait_for_workers(self) -> None:
        n = sum(w is not None for w in self.workers)
        self.wait_for(f"{n} workers", lambda: self.state().get("aliveworkers") == n)

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker `index` with its executors and their Python workers (a lost machine)."""
        worker = self.workers[index]
        assert worker is not None, f"worker {index} is not running"
        worker.kill()
        self.workers[index] = None
        self.wait_for_workers()  # the master saw it go

    def worker_of(self, pid: int) -> int | None:
        """Which worker's process tree holds process `pid`."""
        for i, worker in enumerate(self.workers):
            if worker is not None and any(p.pid == pid for p in tree(worker.process.pid)):
                return i
        return None

    def state(self) -> dict[str, object]:
        """The master's JSON status page ({} while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                return dict(json.loads(r.read()))
        except (OSError, ValueError):
            return {}

    def wait_for(self, what: str, ready: Callable[[], bool], within: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + within
        while not ready():
            dead = [d for d in self.daemons() if d.process.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise AssertionError(f"{what} not ready within {within:.0f} s\n{self.logs()}")
            time.sleep(0.5)

    def daemons(self) -> list[Daemon]:
        return [d for d in (self.master, *self.workers) if d is not None]

    def logs(self) -> str:
        """The tail of every daemon's log and of every executor's stderr."""
        executors = sorted((self.base / "work").glob("worker*/app-*/*/stderr"))
        parts = [d.describe() for d in self.daemons()]
        parts += [f"--- executor {p.parent}:\n{tail(p, 15)}" for p in executors[-4:]]
        return "\n".join(parts)

    def stop(self) -> None:
        for daemon in reversed(self.daemons()):
            daemon.kill()


class ConnectServer:
    """A Spark Connect server (`SparkConnectServer`, as `sbin/start-connect-server.sh`
    submits it) whose driver is an application of `cluster`."""

    def __init__(self, cluster: SparkCluster) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.daemon: Daemon | None = None

    def start(self) -> None:
        c = self.cluster
        self.daemon = c._launch("connect", [
            str(c.home / "bin" / "spark-submit"),
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name", "Spark Connect server", "--master", c.master_url,
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={self.port}",
            "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.sql.session.timeZone=UTC",
        ])  # fmt: skip
        daemon = self.daemon
        deadline = time.monotonic() + START_TIMEOUT
        while "Spark Connect server started" not in daemon.log.read_text(errors="replace"):
            if daemon.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the Connect server did not start\n{daemon.describe()}")
            time.sleep(0.5)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a Connect client program (`SPARK_REMOTE` set)."""
        return self.cluster.env(SPARK_REMOTE=self.url, **extra)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.kill()

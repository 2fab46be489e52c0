"""`slicejournal worker` subprocesses by worker id: started, signalled, killed, stopped.

The demo's fleet, the fleet tests' and the fleet benchmark's all run through
`WorkerProcesses`. Each worker runs `slicejournal worker TARGET` with this
Python and logs to a file of its own in `logs`; `stop_all` stops them as an
operator would (SIGTERM, after SIGCONT for a frozen one) and returns their exit
codes; `kill_all` is the cleanup after a failure.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from slicejournal.fleet_cli import worker_argv

PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the kernel SIGKILL the worker when this process dies
    (Linux), so that no worker outlives a run that was itself killed."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))

    return preexec


class WorkerProcesses:
    """The worker subprocesses running `target` on one schema, by worker id.

    `options` are further `slicejournal worker` flags (`instances=4`); `cwd` and
    `env` are the processes' (default: this process's); `log_prefix` starts each
    log file's name; `tied` makes each worker die with this process (Linux).
    """

    def __init__(
        self,
        target: str,
        *,
        dsn: str,
        schema: str,
        lease_ttl: float,
        logs: Path,
        log_prefix: str = "",
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        tied: bool = False,
        **options: object,
    ) -> None:
        self.target, self.dsn, self.schema, self.lease_ttl = target, dsn, schema, lease_ttl
        self.logs, self.log_prefix, self.cwd, self.env, self.tied = logs, log_prefix, cwd, env, tied
        self.options = {"log_level": "info", **options}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()
        self.stopping = False

    def log_path(self, worker_id: str) -> Path:
        return self.logs / f"{self.log_prefix}{worker_id}.log"

    def start(self, worker_id: str) -> None:
        argv = worker_argv(
            self.target,
            dsn=self.dsn,
            schema=self.schema,
            worker_id=worker_id,
            lease_ttl=self.lease_ttl,
            **self.options,
        )
        with self.log_path(worker_id).open("wb") as log:
            self.procs[worker_id] = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=None if self.env is None else dict(self.env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent() if self.tied else None,
            )

    def signal(self, worker_id: str, sig: signal.Signals) -> None:
        self.procs[worker_id].send_signal(sig)

    def kill(self, worker_id: str) -> None:
        """SIGKILL the worker and reap it."""
        self.killed.add(worker_id)
        self.procs[worker_id].kill()
        self.procs[worker_id].wait()

    def alive(self) -> list[str]:
        return [w for w, p in self.procs.items() if p.poll() is None]

    def check(self) -> None:
        """Raise if a worker exited that was neither killed nor asked to stop."""
        if self.stopping:
            return
        for worker_id, proc in self.procs.items():
            code = proc.poll()
            if code is not None and worker_id not in self.killed:
                raise RuntimeError(
                    f"worker {worker_id} exited with {code}:\n{self.tail(worker_id)}"
                )

    def log(self, worker_id: str) -> str:
        return self.log_path(worker_id).read_text(errors="replace")

    def tail(self, worker_id: str, lines: int = 15) -> str:
        return "\n".join(self.log(worker_id).splitlines()[-lines:])

    def count(self, level: str) -> int:
        """Lines logged at `level` (e.g. "ERROR") by any of the workers."""
        return sum(
            line.split(" ", 3)[2:3] == [level]
            for worker_id in self.procs
            for line in self.log(worker_id).splitlines()
        )

    def stop_all(self, within: float = 30.0) -> dict[str, int | None]:
        """SIGTERM every live worker (each finishes its batches, saves offsets and releases
        its leases; a frozen one is continued first) and wait; exit codes (a SIGKILLed one:
        -9; None: had to be killed after `within` s)."""
        self.stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        codes: dict[str, int | None] = {}
        for worker_id, proc in self.procs.items():
            try:
                codes[worker_id] = proc.wait(timeout=within)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes[worker_id] = None
        return codes

    def kill_all(self) -> None:
        self.stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()

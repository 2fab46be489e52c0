"""`slicejournal worker` subprocesses for the fleet tests, by worker id.

Each runs `tests.fleet_app:balances` on one schema, logging to a file of its
own; `stop_all` stops them as an operator would (SIGTERM, after SIGCONT for
a frozen one) and returns their exit codes; `kill_all` is the cleanup.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from slicejournal.fleet_cli import worker_argv

ROOT = Path(__file__).resolve().parent.parent
TTL = 2.0


class Fleet:
    def __init__(self, dsn: str, schema: str, logs: Path) -> None:
        self.dsn, self.schema, self.logs = dsn, schema, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, worker_id: str) -> None:
        with (self.logs / f"{worker_id}.log").open("wb") as log:
            self.procs[worker_id] = subprocess.Popen(
                worker_argv(
                    "tests.fleet_app:balances",
                    dsn=self.dsn,
                    schema=self.schema,
                    worker_id=worker_id,
                    lease_ttl=TTL,
                    log_level="info",
                ),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    def signal(self, worker_id: str, sig: signal.Signals) -> None:
        self.procs[worker_id].send_signal(sig)

    def alive(self) -> list[str]:
        return [w for w, p in self.procs.items() if p.poll() is None]

    def log(self, worker_id: str) -> str:
        return (self.logs / f"{worker_id}.log").read_text(errors="replace")

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for worker_id, proc in self.procs.items():
            try:
                codes[worker_id] = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes[worker_id] = None
        return codes

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

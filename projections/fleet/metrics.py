"""The worker's HTTP endpoints: /metrics, /healthz and /readyz, from a daemon thread.

`/metrics` is the Prometheus exposition of a registry (the worker's
`PrometheusTelemetry`; any in-process application can serve its own the same
way). `/healthz` answers 200 while `live()` is true — for a worker: its event
loop still runs callbacks — and `/readyz` while `ready()` is — connected, and
holding every lease the fleet gives it (or wanted none). Both answer 503 with
the reason otherwise, for a process manager or Kubernetes probes. The server
binds 127.0.0.1 unless told otherwise: the figures are not for the world.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import REGISTRY

# A check: None when all is well, else the reason it is not.
Check = Callable[[], str | None]

DEFAULT_ADDR = "127.0.0.1"


def _ok() -> str | None:
    return None


class MetricsServer:
    """A running /metrics, /healthz, /readyz server; `port` is the one bound."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host: str = str(server.server_address[0])
        self.port: int = int(server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_http(
    port: int,
    addr: str = DEFAULT_ADDR,
    *,
    registry: CollectorRegistry = REGISTRY,
    live: Check = _ok,
    ready: Check = _ok,
) -> MetricsServer:
    """Serve the three endpoints on `addr:port` (port 0: any free one) from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                problem = (live if path == "/healthz" else ready)()
                if problem is None:
                    self._send(200, b"ok\n")
                else:
                    self._send(503, f"{problem}\n".encode())
            else:
                self._send(404, b"not found: /metrics, /healthz, /readyz\n")

        def _send(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds: not worth a log line each

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="slicejournal-http", daemon=True)
    thread.start()
    return MetricsServer(server, thread)

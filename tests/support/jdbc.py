"""What a test of the read through Spark's JDBC source needs: the driver jar and TCP.

The embedded server listens on a Unix socket only, and JDBC speaks TCP only: a
TCP proxy (the benchmarks' `_latency_proxy.py` with no delay, a process of its
own) forwards 127.0.0.1 connections to the socket, where the server trusts them
as it trusts the tests' own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

from psycopg import conninfo

from tests.support import ROOT

# Debian's libpostgresql-jdbc-java (`.ci/run` installs it where apt-get can).
JDBC_JAR = "/usr/share/java/postgresql.jar"


@contextlib.contextmanager
def tcp_dsn(dsn: str) -> Iterator[str]:
    """`dsn` itself if it names a TCP host, else the DSN of a proxy to its socket."""
    params = conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or "")
    if host and not host.startswith("/"):
        yield dsn
        return
    socket = os.path.join(host or "/var/run/postgresql", f".s.PGSQL.{params.get('port') or 5432}")
    proxy = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "_latency_proxy.py"), socket, "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        port = int(proxy.stdout.readline().split()[-1])
        yield conninfo.make_conninfo(dsn, host="127.0.0.1", port=port)
    finally:
        proxy.terminate()
        proxy.wait(10)

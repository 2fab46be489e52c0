"""What the error tests share: a password no message may show, malformed DSNs carrying
it, and a local port that nothing listens on."""

from __future__ import annotations

import socket

from journal import JournalError

PASSWORD = "s3cr3t-Pa55w0rd"

MALFORMED = {
    "url missing a slash": f"postgresql:/nobody:{PASSWORD}@localhost/x?",
    "key without =": f"host=127.0.0.1 password={PASSWORD} bogus",
    "unknown query parameter": f"postgresql://nobody:{PASSWORD}@localhost/x?frobnicate=1",
    "unknown option": f"host=127.0.0.1 password={PASSWORD} frobnicate=1",
}


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def assert_one_line_without_password(error: BaseException) -> str:
    assert isinstance(error, JournalError)
    message = str(error)
    assert "\n" not in message
    assert PASSWORD not in message
    return message

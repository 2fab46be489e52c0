"""Where the journal's database is, and how to show that without leaking a password.

A DSN comes from an argument or `SLICEJOURNAL_DSN`; with neither, from a
*default database provider* — the embedded PostgreSQL of the application
layer, installed with the `slicejournal[embedded]` extra. The library finds
that provider through an entry point instead of importing it, so it never
imports upward and a production install carries no PostgreSQL build.

A DSN is printed by the CLI and named in error messages, so every display of
it goes through `display_dsn`, which masks the password.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Protocol
from urllib.parse import quote

from psycopg import conninfo

from journal.errors import ConnectionFailed, InvalidArgument

DSN_ENV = "SLICEJOURNAL_DSN"
DEFAULT_DATABASE_GROUP = "slicejournal.default_database"


class DefaultDatabase(Protocol):
    """A database started on demand when no DSN is configured."""

    def start(self) -> str:
        """Start (or join) it and return its DSN."""
        ...

    def stop(self) -> None:
        """Leave it (stopping it if this process was its last user)."""
        ...


def resolve_dsn(dsn: str | None) -> str | None:
    """The DSN to use: the argument, else `SLICEJOURNAL_DSN`, else None (a default database).

    An empty DSN is `InvalidArgument`, never "none": `--dsn "$DATABASE_URL"` with the
    variable unset must not quietly project into a private embedded server.
    """
    if dsn is not None:
        if not dsn.strip():
            raise InvalidArgument(
                "the DSN is empty: pass a PostgreSQL DSN, or none at all (no argument and "
                f"no {DSN_ENV}) for the embedded server"
            )
        return dsn
    env = os.environ.get(DSN_ENV)
    if env is not None and not env.strip():
        raise InvalidArgument(
            f"{DSN_ENV} is set but empty: set it to a PostgreSQL DSN, or unset it for the "
            "embedded server"
        )
    return env


def default_database() -> DefaultDatabase:
    """The installed default database provider (the embedded server), not yet started."""
    for entry in entry_points(group=DEFAULT_DATABASE_GROUP):
        factory = entry.load()
        provider: DefaultDatabase = factory()
        return provider
    raise ConnectionFailed(
        f"no database configured: pass a DSN or set {DSN_ENV}, or install the embedded "
        "PostgreSQL with `pip install 'slicejournal[embedded]'`"
    )


@contextlib.contextmanager
def database(dsn: str | None) -> Iterator[tuple[str, bool]]:
    """`(dsn, is_default)`: the configured DSN, or a default database for the block's duration."""
    resolved = resolve_dsn(dsn)
    if resolved is not None:
        yield resolved, False
        return
    provider = default_database()
    started = provider.start()
    try:
        yield started, True
    finally:
        provider.stop()


def display_dsn(dsn: str) -> str:
    """The DSN as a URI usable with `psql`, with any password replaced by `***`."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except Exception:  # malformed: show nothing of it that could be a secret
        return "<unparsable DSN>"
    if params.get("password"):
        params["password"] = "***"
    user = params.pop("user", None)
    password = params.pop("password", None)
    host = params.pop("host", None)
    port = params.pop("port", None)
    dbname = params.pop("dbname", None)
    auth = ""
    if user:
        auth = f"{user}:{password}@" if password else f"{user}@"
    netloc = ""
    query: dict[str, object] = dict(params)
    if host and str(host).startswith("/"):
        query = {"host": host, **query}  # a socket directory goes in the query, in full
        if port:
            query["port"] = port
    elif host:
        netloc = f"{host}:{port}" if port else str(host)
    path = f"/{dbname}" if dbname else "/"
    tail = "&".join(f"{k}={quote(str(v), safe='/:')}" for k, v in query.items())
    return f"postgresql://{auth}{netloc}{path}" + (f"?{tail}" if tail else "")

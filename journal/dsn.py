"""Where the journal's database is, and how to show that without leaking a password.

A DSN comes from an argument or `SLICEJOURNAL_DSN`; with neither, from a
*default database provider* — the embedded PostgreSQL of the application
layer, installed with the `slicejournal[embedded]` extra. The library finds
that provider through an entry point instead of importing it, so it never
imports upward and a production install carries no PostgreSQL build.

A DSN is printed by the CLI and named in error messages, so every display of
it goes through `display_dsn`, which masks the password, and every message that
may quote one through `mask_secrets` (journal/connection.py). Where the password
is comes from psycopg's own conninfo parser; a URI whose user name or password
holds an unescaped `/` or `@` is refused (`userinfo_problem`), since libpq would
read part of the password as a host, port or database name.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Protocol
from urllib.parse import quote, unquote

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


_URI = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)
# `password=secret`, `password = 'se cret'` (key=value form) or `password=secret` in a
# URI's query (up to the next `&`).
_KV_SECRET = re.compile(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)
# Anything that looks like a URI, a malformed one too (`postgresql:/u:pw@host`).
_URI_LIKE = re.compile(r"^\s*[a-z][a-z0-9+.-]*:/*", re.IGNORECASE)
REDACTED = "***"


def userinfo_problem(dsn: str) -> str | None:
    """Why a URI's user info cannot be read as its author meant, or None.

    libpq ends the user info at the first `@` or `/`: in
    `postgresql://u:pa/ss@host/db` it reads host `u`, port `pa` and database
    `ss@host/db`, so a connection error would show part of the password. An `@`
    left in the host or database part after that means exactly this.
    """
    match = _URI.match(dsn)
    if match is None:
        return None
    rest = dsn[match.end() :]
    stop = next((i for i, c in enumerate(rest) if c in "@/"), len(rest))
    after = rest[stop + 1 :] if rest[stop : stop + 1] == "@" else rest[stop:]
    if "@" not in after.split("?", 1)[0]:
        return None
    return (
        "its user name or password holds a character a URI needs percent-encoded "
        "('/' as %2F, '@' as %40, a space as %20), or use the key=value form "
        "(host=... user=... password='...')"
    )


def _uri_userinfo(dsn: str) -> str | None:
    match = _URI_LIKE.match(dsn)
    if match is None:
        return None
    rest = dsn[match.end() :]
    at = rest.rfind("@")
    return rest[:at] if at >= 0 else None


def dsn_secrets(dsn: str) -> list[str]:
    """Every substring of `dsn` that may be (part of) a password, longest first: what
    psycopg parses as the password, and, should it not parse, what stands in a
    password's place in a URI's user info, a `password=` option or a query."""
    found: set[str] = set()
    if userinfo_problem(dsn) is None:
        with contextlib.suppress(Exception):
            password = conninfo.conninfo_to_dict(dsn).get("password")
            if password:
                found.add(str(password))
    userinfo = _uri_userinfo(dsn)
    if userinfo is not None and ":" in userinfo:
        raw = userinfo.split(":", 1)[1]
        found |= {raw, unquote(raw)}
    for match in _KV_SECRET.finditer(dsn):
        raw = match.group(1)
        found |= {raw, unquote(raw)}
        if raw.startswith("'") and raw.endswith("'") and len(raw) > 1:
            found.add(re.sub(r"\\(.)", r"\1", raw[1:-1]))
    return sorted((s for s in found if s), key=len, reverse=True)


def redact_dsn(dsn: str) -> str:
    """The DSN as written, with its user info (in a URI) and any password option
    replaced by `***`: how a DSN that does not parse is shown."""
    match = _URI_LIKE.match(dsn)
    if match is not None:
        userinfo = _uri_userinfo(dsn)
        if userinfo is not None:
            dsn = dsn[: match.end()] + REDACTED + dsn[match.end() + len(userinfo) :]
    dsn = _KV_SECRET.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + REDACTED, dsn)
    for secret in dsn_secrets(dsn):
        if secret != REDACTED:
            dsn = dsn.replace(secret, REDACTED)
    return dsn


def display_dsn(dsn: str) -> str:
    """The DSN as a URI usable with `psql`, with any password replaced by `***`."""
    if userinfo_problem(dsn) is not None:
        return redact_dsn(dsn)
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except Exception:  # malformed: show nothing of it that could be a secret
        return redact_dsn(dsn)
    if params.get("password"):
        params["password"] = "***"
    user = params.pop("user", None)
    password = params.pop("password", None)
    host = params.pop("host", None)
    port = params.pop("port", None)
    dbname = params.pop("dbname", None)
    auth = ""
    if user:
        shown = quote(str(user), safe="")
        auth = f"{shown}:{password}@" if password else f"{shown}@"
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

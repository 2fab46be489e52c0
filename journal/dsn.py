"""Where the journal's database is, and how to show that without leaking a password.

A DSN comes from an argument, `SLICEJOURNAL_DSN`, or the embedded server. It
is printed by the CLI and named in error messages, so every display of it
goes through `display_dsn`, which masks the password.
"""

from __future__ import annotations

from urllib.parse import quote

from psycopg import conninfo


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

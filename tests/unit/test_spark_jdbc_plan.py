"""The pure parts of `read_events` through Spark's JDBC source: when it may run, the URL
it gives the driver, and which failures mean "no JDBC driver" (the fallback)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from projections.spark.jdbc import (
    _checked_properties,
    _driver_missing,
    _jdbc_unsupported,
    _jdbc_url,
    _partition_properties,
)
from projections.spark.options import SourceOptionError, parse_options


def _info(**fields: Any) -> Any:
    defaults = {"host": "db.example", "port": 5432, "dbname": "app", "user": "u", "password": ""}
    return SimpleNamespace(**{**defaults, **fields})


def test_the_url_is_the_connected_sessions_with_the_name_quoted_and_ipv6_bracketed() -> None:
    url, props = _jdbc_url(_info(dbname="a&b?c d", password="s3cret"), {"sslmode": "require"})
    assert url == "jdbc:postgresql://db.example:5432/a%26b%3Fc%20d"
    assert props["user"] == "u" and props["password"] == "s3cret"
    assert props["sslmode"] == "require" and "s3cret" not in url
    url, props = _jdbc_url(_info(host="::1", port=5433), {})
    assert url.startswith("jdbc:postgresql://[::1]:5433/") and "password" not in props


def test_only_a_missing_driver_class_falls_back() -> None:
    assert _driver_missing(RuntimeError("java.lang.ClassNotFoundException: org.postgresql.Driver"))
    assert _driver_missing(RuntimeError("java.sql.SQLException: No suitable driver"))
    # A connection failure names the driver in its stack frames: not a missing driver.
    refused = (
        "org.postgresql.util.PSQLException: Connection to 127.0.0.1:1 refused\n"
        "\tat org.postgresql.Driver.makeConnection(Driver.java:434)\n"
        "\tat org.postgresql.Driver.connect(Driver.java:291)"
    )
    assert not _driver_missing(RuntimeError(refused))


def test_what_jdbc_cannot_run_is_named() -> None:
    def why(**options: str) -> str | None:
        return _jdbc_unsupported(parse_options({"entityType": "A", **options}))

    assert why(dsn="postgresql://u@127.0.0.1/db") is None
    assert why(dsn="postgresql://u@/db?host=/tmp/sock") == (
        "the DSN names no single TCP host (JDBC has no Unix sockets)"
    )
    assert why(dsn="postgresql://u@h1,h2/db") is not None
    assert why(dsn="postgresql://u@h/db", tags="x") == "an event filter (manifests, tags, where)"
    assert why(dsn="postgresql://u@h/db", fromSnapshots="true") == "fromSnapshots"
    assert "durableState" in str(why(dsn="postgresql://u@h/db", read="durableState"))
    with pytest.raises(SourceOptionError, match="not a valid DSN"):
        why(dsn="host=h port")


def test_the_callers_jdbc_properties_come_last_but_never_rename_the_read() -> None:
    """`jdbc_properties` override what the read sets (binary rows, the fetch size, the
    user), but not the driver or the session name the visibility horizon leaves out;
    a bad one is refused without showing its value (it may be a password)."""
    options = parse_options({"dsn": "postgresql://u@127.0.0.1/db", "entityType": "A"})
    planned = {"driver": "org.postgresql.Driver", "ApplicationName": "slicejournal-reader"}
    planned |= {"user": "u"}
    default = _partition_properties(planned, options, {})
    assert default["prepareThreshold"] == "-1" and default["fetchsize"].isdigit()
    extra = _checked_properties({"prepareThreshold": "5", "fetchsize": "7", "user": "v"})
    mine = _partition_properties(planned, options, extra)
    assert (mine["prepareThreshold"], mine["fetchsize"], mine["user"]) == ("5", "7", "v")
    assert mine["ApplicationName"] == "slicejournal-reader"
    for name in ("ApplicationName", "applicationName", "driver"):
        with pytest.raises(SourceOptionError, match="cannot set"):
            _checked_properties({name: "x"})
    with pytest.raises(SourceOptionError, match="str to str") as refused:
        _checked_properties({"password": b"s3cret"})  # type: ignore[dict-item]
    assert "s3cret" not in str(refused.value)

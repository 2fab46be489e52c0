"""`arrow_read.adbc_errors`: what the ADBC driver raises becomes the journal's typed errors,
as `journal.connection.driver_errors` makes psycopg's (pure: errors built by hand)."""

from __future__ import annotations

import adbc_driver_manager
import pytest

from journal.errors import (
    ConnectionFailed,
    ConnectionLost,
    DatabaseError,
    JournalError,
    QueryCancelled,
)
from projections.spark.arrow_read import adbc_errors

DSN = "postgresql://someone:s3cret-pw@db.example:6543/journal"
_IO = 5  # ADBC's status code for I/O errors


@pytest.mark.parametrize(
    ("error", "expected", "words"),
    [
        (
            adbc_driver_manager.OperationalError(
                'IO: [libpq] Failed to connect: connection to server at "db.example", '
                "port 6543 failed: FATAL:  password authentication failed\n",
                status_code=_IO,
            ),
            ConnectionFailed,
            "db.example:6543",
        ),
        (
            adbc_driver_manager.OperationalError(
                "IO: canceling statement due to user request", status_code=_IO, sqlstate="57014"
            ),
            QueryCancelled,
            "cancelled",
        ),
        (
            adbc_driver_manager.OperationalError(
                "IO: server closed the connection unexpectedly", status_code=_IO
            ),
            ConnectionLost,
            "lost",
        ),
        (
            adbc_driver_manager.ProgrammingError(
                "INVALID_ARGUMENT: division by zero", status_code=_IO, sqlstate="22012"
            ),
            DatabaseError,
            "refused",
        ),
    ],
)
def test_adbc_errors_are_typed_and_keep_the_password_out(
    error: adbc_driver_manager.Error, expected: type[JournalError], words: str
) -> None:
    with pytest.raises(expected, match=words) as info, adbc_errors(DSN):
        raise error
    assert "s3cret-pw" not in str(info.value)
    assert info.value.__cause__ is error


def test_other_errors_pass_through() -> None:
    with pytest.raises(KeyError), adbc_errors(DSN):
        raise KeyError("x")
    with pytest.raises(ConnectionFailed), adbc_errors(DSN):
        raise ConnectionFailed("already typed")

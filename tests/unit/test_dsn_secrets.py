"""No error message carries a DSN's password, whatever it holds: spaces, `/`, `@`,
`?`, `%`-escapes, in a URI's user info, its query or the key=value form. A URI
whose user info libpq would misread (an unescaped `/` or `@`) is refused with
`InvalidArgument` before anything connects. Checked through the library
(`Journal.connect` against a closed port) and through the CLI (`migrate`).
"""

from __future__ import annotations

import pytest

from journal import ConnectionFailed, InvalidArgument, Journal, JournalError
from journal.connection import mask_secrets, parse_dsn
from journal.dsn import display_dsn, dsn_secrets
from slicejournal.cli import main
from tests.support.errors import closed_port

# Distinctive halves: neither may appear in any message.
LEFT, RIGHT = "Xq7vL", "Zr9wK"


def _dsns(port: int) -> dict[str, tuple[str, type[JournalError]]]:
    host = f"127.0.0.1:{port}"
    return {
        "slash in a URI": (f"postgresql://u:{LEFT}/{RIGHT}@{host}/db", InvalidArgument),
        "at sign in a URI": (f"postgresql://u:{LEFT}@{RIGHT}@{host}/db", InvalidArgument),
        "space in a URI": (f"postgresql://u:{LEFT} {RIGHT}@{host}/db", InvalidArgument),
        "slash and at": (f"postgresql://u:{LEFT}/@{RIGHT}@{host}/db", InvalidArgument),
        "question mark": (f"postgresql://u:{LEFT}?{RIGHT}@{host}/db", ConnectionFailed),
        "percent-escaped": (
            f"postgresql://u:{LEFT}%2F%40%20{RIGHT}@{host}/db",
            ConnectionFailed,
        ),
        "in the query": (
            f"postgresql://{host}/db?user=u&password={LEFT}%2F{RIGHT}",
            ConnectionFailed,
        ),
        "key=value quoted": (
            f"host=127.0.0.1 port={port} user=u password='{LEFT} /@{RIGHT}' dbname=db",
            ConnectionFailed,
        ),
        "key=value bare": (
            f"host=127.0.0.1 port={port} user=u password={LEFT}/@{RIGHT} dbname=db",
            ConnectionFailed,
        ),
        "key=value malformed": (
            f"host=127.0.0.1 password='{LEFT} {RIGHT}' bogus",
            InvalidArgument,
        ),
    }


CASES = list(_dsns(1))


def _assert_clean(text: str) -> None:
    assert LEFT not in text and RIGHT not in text, text


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", CASES)
async def test_the_library_never_shows_the_password(case: str) -> None:
    dsn, expected = _dsns(closed_port())[case]
    with pytest.raises(expected) as info:
        async with Journal.connect(dsn):
            pass
    message = str(info.value)
    assert "\n" not in message
    _assert_clean(message)
    _assert_clean(display_dsn(dsn))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", CASES)
def test_the_cli_never_shows_the_password(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    dsn, _ = _dsns(closed_port())[case]
    assert main(["migrate", "--dsn", dsn]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("slicejournal: error:")
    _assert_clean(out + err)


def test_a_slash_in_the_password_is_refused_naming_the_fix() -> None:
    dsn = f"postgresql://u:{LEFT}/{RIGHT}@127.0.0.1:1/db"
    with pytest.raises(InvalidArgument, match=r"percent-encoded.*%2F") as info:
        parse_dsn(dsn)
    assert "postgresql://***@127.0.0.1:1/db" in str(info.value)
    # libpq alone would read host "u", port LEFT: the old message named "u:Xq7vL".
    assert "u:" not in str(info.value)


def test_an_escaped_password_parses_and_is_masked_in_both_forms() -> None:
    dsn = f"postgresql://u:{LEFT}%2F%40{RIGHT}@db.example:6543/ledger"
    assert parse_dsn(dsn)["password"] == f"{LEFT}/@{RIGHT}"
    assert display_dsn(dsn) == "postgresql://u:***@db.example:6543/ledger"
    secrets = dsn_secrets(dsn)
    assert f"{LEFT}/@{RIGHT}" in secrets and f"{LEFT}%2F%40{RIGHT}" in secrets
    _assert_clean(mask_secrets(f"got {dsn} and {LEFT}/@{RIGHT}", dsn))


def test_an_at_sign_in_a_query_user_name_is_not_a_problem() -> None:
    dsn = "postgresql:///db?user=me@corp"
    assert parse_dsn(dsn)["user"] == "me@corp"
    assert display_dsn(dsn) == "postgresql://me%40corp@/db"

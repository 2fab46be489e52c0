"""The DSN password pattern Spark's string redaction gets (Java regex; the pattern uses
nothing Python's `re` reads differently): it covers the password of either DSN form,
as it appears in a Connect request's plan text, and nothing else of the DSN."""

from __future__ import annotations

import re

import pytest

from projections.spark.redaction import DSN_PASSWORD

REDACTED = "*********(redacted)"


def redact(text: str) -> str:
    return re.sub(DSN_PASSWORD, REDACTED, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'value: "user=app dbname=j host=/tmp/s password=s3cr=t port=5432"',
            f'value: "user=app dbname=j host=/tmp/s {REDACTED} port=5432"',
        ),
        ('value: "host=db PASSWORD = hunter2"', f'value: "host=db {REDACTED}"'),
        (
            'value: "postgresql://app:s3cr%40t@db.example:5432/j?sslmode=require"',
            f'value: "postgresql://{REDACTED}@db.example:5432/j?sslmode=require"',
        ),
        (
            'value: "postgres://app:pw@/j?host=/tmp/s"',
            f'value: "postgres://{REDACTED}@/j?host=/tmp/s"',
        ),
        # Nothing to hide: left alone.
        ('value: "postgresql://app@db/j"', 'value: "postgresql://app@db/j"'),
        ('value: "host=db user=app"', 'value: "host=db user=app"'),
        ("file:///tmp/checkpoint", "file:///tmp/checkpoint"),
    ],
)
def test_the_pattern_redacts_dsn_passwords_only(text: str, expected: str) -> None:
    assert redact(text) == expected

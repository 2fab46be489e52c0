"""tests/unit runs without PostgreSQL, Spark or any server: in seconds, anywhere.

Every fixture of tests/conftest.py that needs a database or Spark is replaced
here by one that fails the test, naming where it belongs instead.
"""

from __future__ import annotations

from typing import NoReturn

import pytest


def _refuse(request: pytest.FixtureRequest) -> NoReturn:
    pytest.fail(
        f"{request.node.nodeid} requests the `{request.fixturename}` fixture: tests/unit "
        "runs without PostgreSQL or Spark; a test that needs them belongs in tests/integration",
        pytrace=False,
    )


@pytest.fixture
def pg_dsn(request: pytest.FixtureRequest) -> NoReturn:
    _refuse(request)


@pytest.fixture
def schema(request: pytest.FixtureRequest) -> NoReturn:
    _refuse(request)


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> NoReturn:
    _refuse(request)


@pytest.fixture
def journal(request: pytest.FixtureRequest) -> NoReturn:
    _refuse(request)


@pytest.fixture
def bank_journal(request: pytest.FixtureRequest) -> NoReturn:
    _refuse(request)


@pytest.fixture
def spark(request: pytest.FixtureRequest) -> NoReturn:
    _refuse(request)


@pytest.fixture
def spark_cluster(request: pytest.FixtureRequest) -> NoReturn:
    _refuse(request)


@pytest.fixture
def spark_connect(request: pytest.FixtureRequest) -> NoReturn:
    _refuse(request)

"""A user's type checker sees every projection option (issue 30).

`Projection.exactly_once / grouped / at_least_once` (and their sync twins) used
to take `**options: Any`, so `mypy --strict` in a user's project checked none of
`settings`, `recovery`, `query_settings` or `telemetry`, and a misspelt option
failed only when the projection was built. This runs mypy itself over a small
user program: the correct one type-checks, each mistake is reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

PROGRAM = """
from typing import Any
from journal import Journal, SliceRange, SyncJournal
from projections import Projection, ProjectionSettings, RecoveryStrategy, SyncProjection

async def handler(conn: Any, env: Any) -> None: ...
def sync_handler(conn: Any, env: Any) -> None: ...

def build(j: Journal, sj: SyncJournal) -> None:
    Projection.exactly_once(
        j, name="n", entity_type="T", slice_range=SliceRange.FULL, handler=handler,
        {option},
    )
    SyncProjection.exactly_once(
        sj, name="n", entity_type="T", slice_range=SliceRange.FULL, handler=sync_handler,
        {option},
    )
"""


def check(tmp_path: Path, option: str) -> tuple[int, str]:
    source = tmp_path / "user_program.py"
    source.write_text(PROGRAM.format(option=option))
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(source)]
    )
    return status, out + err


@pytest.mark.timeout(120)
def test_options_are_type_checked(tmp_path: Path) -> None:
    status, out = check(tmp_path, "settings=ProjectionSettings(), recovery=RecoveryStrategy.fail()")
    assert status == 0, out
    status, out = check(tmp_path, "setings=ProjectionSettings()")
    assert status == 1 and 'Unexpected keyword argument "setings"' in out, out
    assert out.count("setings") >= 2  # both flavours
    status, out = check(tmp_path, "recovery=ProjectionSettings()")
    assert status == 1 and 'Argument "recovery"' in out, out

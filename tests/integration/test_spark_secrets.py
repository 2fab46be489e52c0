"""The DSN's password, passed as the `dsn` option, shows in no plan and no event log.

Spark's own redaction goes by names (`spark.redaction.regex`: `password`,
`token`...; `spark.sql.redaction.options.regex`: `url`), which `dsn` is not.
A program of its own (event logging must be on when its session starts)
reads the journal in batch with a URI DSN, explains the read, and runs
`project` with a key=value DSN; the test then looks for the password in
everything Spark wrote or printed: `explain()` (extended and formatted), the
query execution's string, the stream's progress and description, the
uncompressed event log, the checkpoint, and the program's output and log.
(On a cluster and through Spark Connect: tests/integration/test_spark_cluster.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from journal import JournalSettings, SyncJournal
from tests.support.pg import with_password

PROGRAM = """
import contextlib, io, json, os

from psycopg import Connection

from journal import EventEnvelope, JournalSettings
from projections.spark import local_session, project

URI_DSN, KV_DSN, SCHEMA, OUT = (os.environ[k] for k in ("URI_DSN", "KV_DSN", "SCHEMA", "OUT"))


def ignore(conn: Connection, envelopes: list[EventEnvelope]) -> None:
    pass


spark = local_session("secrets", config={
    "spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
    "spark.eventLog.dir": os.path.join(OUT, "events"),
})
df = (spark.read.format("slicejournal").option("dsn", URI_DSN).option("schema", SCHEMA)
      .option("entityType", "Note").load())
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    df.explain("extended")
    df.explain("formatted")
seen = {
    "explain": printed.getvalue(),
    "query_execution": df._jdf.queryExecution().toString(),
    "count": df.count(),
}
query = project(
    spark, dsn=KV_DSN, name="secrets", entity_type="Note", handler=ignore,
    checkpoint_location=os.path.join(OUT, "checkpoint"), trigger={"availableNow": True},
    settings=JournalSettings(schema=SCHEMA),
)
query.awaitTermination()
seen["progress"] = json.dumps(query.recentProgress, default=str)
last = query._jsq.streamingQuery().lastExecution()  # the last micro-batch's plan
seen["stream"] = query._jsq.toString() + last.toString()
spark.stop()
print(json.dumps(seen, default=str))
"""


@pytest.mark.timeout(300)
def test_the_password_shows_in_no_plan_and_no_event_log(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    password, uri_dsn, kv_dsn = with_password(pg_dsn)
    with SyncJournal.connect(uri_dsn, JournalSettings(schema=schema), create_schema=True) as j:
        j.append("Note|1", [{"n": 1}, {"n": 2}], expected_seq_nr=0)
    (tmp_path / "program.py").write_text(PROGRAM)
    (tmp_path / "events").mkdir()
    env = {**os.environ, "URI_DSN": uri_dsn, "KV_DSN": kv_dsn, "SCHEMA": schema,
           "OUT": str(tmp_path)}  # fmt: skip
    done = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["count"] == 2
    assert "BatchScan slicejournal" in seen["explain"] and seen["query_execution"]
    assert json.loads(seen["progress"]) and seen["stream"]
    for what, text in seen.items():
        assert password not in str(text), f"the password is in {what}: {text}"
    assert password not in done.stderr, "the password is in the program's log"
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "program.py"]
    assert any("eventlog" in str(p) for p in written), written
    for path in written:
        assert password.encode() not in path.read_bytes(), f"the password is in {path}"

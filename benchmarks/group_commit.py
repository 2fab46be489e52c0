"""Group commit's bound: `Journal.append` at several `append_statements`, against none.

    .venv/bin/python benchmarks/group_commit.py [--dsn DSN] [--rtt-ms MS] [--seconds 5]
        [--rounds 2] [--quick] [--writers 8,16,32] [--bounds 2,8]

(the defaults shown; the README's figures: `--seconds 2.5 --rounds 4`). With
`--dsn`, each run creates and drops a schema of its own and runs `CHECKPOINT`:
point it at a test database.

Why: the bound (`JournalSettings.append_statements`, "auto" = 2 for the asyncio
`Journal`) decides how many append statements run at once; appends arriving
meanwhile wait for one to end and go together. That saves the client CPU per
append, which is what limits one process on a local server, but each grouped
append waits for a statement to end first, which across a network is a round
trip. This shows both sides on the same workload.

For each `--writers` count, `Journal.append` of single events (append.py's
event and id rotation, pool `writers + 2`), once per bound in `--bounds` and
once with `append_statements=None` (every append its own statement: the
baseline), each run in a fresh schema whose stored rows are checked against
the rate (append.py's `run_journal`), interleaved (reversed every other
round); the best run of each is shown with the client CPU per append (median
of the rounds) and its ratio to the baseline. No goal: it is the data behind
the README's advice on choosing the bound.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _common import (
    Timing,
    best,
    database,
    format_rate,
    format_ratio,
    parse_timed_args,
    positive_ints,
    print_environment,
    print_table,
    run,
)
from append import Case, run_journal


async def main_async(config: tuple[Timing, list[int], list[int]], dsn: str | None) -> int:
    timing, writer_counts, bounds = config
    variants: list[int | None] = [*bounds, None]
    with database(dsn) as db:
        await print_environment(db)
        rows = []
        for writers in writer_counts:
            rates: dict[int | None, list[float]] = {v: [] for v in variants}
            cpu: dict[int | None, list[float]] = {v: [] for v in variants}
            for round_ in range(timing.rounds):
                for bound in variants if round_ % 2 == 0 else variants[::-1]:
                    measured = await run_journal(db.dsn, Case(writers, 1), timing, statements=bound)
                    rates[bound].append(measured.per_second)
                    cpu[bound].append(measured.cpu_us_per_op(1))
                    print(
                        f"  {writers} writers, round {round_ + 1}, append_statements={bound}: "
                        f"{format_rate(measured.per_second)} events/s, "
                        f"{measured.cpu_us_per_op(1):.0f} us CPU/append",
                        flush=True,
                    )
            baseline = best(rates[None])
            for bound in variants:
                rows.append(
                    [
                        f"{writers} writers",
                        "None (baseline)" if bound is None else str(bound),
                        format_rate(best(rates[bound])),
                        format_ratio(best(rates[bound]) / baseline),
                        f"{statistics.median(cpu[bound]):.0f}",
                    ]
                )
    print()
    print_table(["case", "append_statements", "events/s", "/ None", "us CPU/append"], rows)
    print("events/s: best run; us CPU/append: client CPU per append, median of the rounds.")
    return 0


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, tuple[Timing, list[int], list[int]]]:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--writers", default="8,16,32")
    extra.add_argument("--bounds", default="2,8")
    known, rest = extra.parse_known_args(argv)
    writers = positive_ints(known.writers, "--writers")
    bounds = positive_ints(known.bounds, "--bounds")
    args, timing = parse_timed_args(
        __doc__,
        seconds_help="measured seconds per run (default 5)",
        rounds_help="interleaved runs of each bound (default 2)",
        argv=rest,
    )
    return args, (timing, writers, bounds)


def main() -> int:
    return run(parse_args(sys.argv[1:]), main_async)


if __name__ == "__main__":
    sys.exit(main())

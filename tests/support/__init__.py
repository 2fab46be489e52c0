"""Helpers the tests share (imported as a library; pytest fixtures live in conftest.py).

- `pg`: the test database's schemas, query settings scaled down, reading rows
  back on a connection of the test's own.
- `bank`: the bank workload of the projection tests, on the shared example
  domain `slicejournal.examples.bank` (its read model and handlers).
- `projections`: the projection tests' fast settings, journal and assertions.
- `fleet`: the projection `slicejournal worker` runs in the fleet tests, and
  the worker processes that run it.
- `spark`: the bank handlers Spark executors import.
- `pekko`: rows written the way Pekko's R2DBC journal writes them.
- `projection_worker`: a projection in a process of its own (SIGKILL test).
- `readme`: the README's examples, and a database of their own to run them in.
- `wheel`: the project's wheel built and installed in a virtualenv of its own.
- `spark_cluster`: a Spark standalone cluster and a Spark Connect server started
  from PySpark's scripts; `spark_cluster_job.py` is the driver program the
  cluster tests run on them (a script, never imported).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the project root

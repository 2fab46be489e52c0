"""slicejournal on Apache Spark (PySpark): the journal as a data source, projections exactly once.

    spark = spark_session()  # local[2], or MASTER / SPARK_REMOTE; or yours, then register(spark)
    df = spark.read.format("slicejournal").option("dsn", dsn).option("entityType", "Account").load()
    df = read_events(spark, {"dsn": dsn, "entityType": "Account"})  # by Spark's JDBC source
    query = project(spark, dsn=dsn, name="balances", entity_type="Account",
                    handler=apply_batch, checkpoint_location="/tmp/ckpt")

Needs the `spark` extra (`pip install 'slicejournal[spark]'`: pyspark, pyarrow)
and Java 17+. On a cluster, the executors must be able to import `journal`
and `projections`: install the wheel on the workers, or ship it with
`spark.submit.pyFiles`.

Importing this package loads neither pyspark nor psycopg: the pure modules
(`options`, `offsets`) are what an executor or a test needs without them, so
everything that drives Spark or the database is imported on first use
(PEP 562, see `journal/_lazy.py`).
"""

from typing import TYPE_CHECKING

from journal._lazy import lazy_attributes, moved, private
from projections.spark.options import SourceOptionError

# pyspark, pyarrow and psycopg: imported on first use.
if TYPE_CHECKING:
    from projections.spark.driver import (
        RebuildResult,
        project,
        project_changes,
        rebuild,
        store_start,
    )
    from projections.spark.jdbc import ReadExecutor, read_events
    from projections.spark.leases import DEFAULT_LEASE_TTL, ProjectionBusy
    from projections.spark.session import local_session, register, spark_session

__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(("DEFAULT_LEASE_TTL", "ProjectionBusy"), "projections.spark.leases"),
        **dict.fromkeys(
            ("RebuildResult", "project", "project_changes", "rebuild", "store_start"),
            "projections.spark.driver",
        ),
        **dict.fromkeys(("ReadExecutor", "read_events"), "projections.spark.jdbc"),
        **dict.fromkeys(
            ("local_session", "register", "spark_session"), "projections.spark.session"
        ),
    },
    # Exported by 0.2.0, deprecated in 0.3.0: each use warns, naming what to use instead.
    deprecated={
        # The handler of `project` / `rebuild` is a grouped handler: one name for one thing.
        "SparkHandler": moved("projections.sync.runner", "SyncGroupedHandler", "projections"),
        "is_spark_session": private("projections.spark.session", "is_spark_session"),
    },
)

__all__ = [
    "DEFAULT_LEASE_TTL",
    "ProjectionBusy",
    "ReadExecutor",
    "RebuildResult",
    "SourceOptionError",
    "local_session",
    "project",
    "project_changes",
    "read_events",
    "rebuild",
    "register",
    "spark_session",
    "store_start",
]

"""slicejournal on Apache Spark (PySpark): the journal as a data source, projections exactly once.

    spark = local_session()                      # or your own session, then register(spark)
    df = spark.read.format("slicejournal").option("dsn", dsn).option("entityType", "Account").load()
    query = project(spark, dsn=dsn, name="balances", entity_type="Account",
                    handler=apply_batch, checkpoint_location="/tmp/ckpt")

Needs the `spark` extra (`pip install 'slicejournal[spark]'`: pyspark, pyarrow)
and Java 17+. On a cluster, the executors must be able to import `journal`
and `projections`: install the wheel on the workers, or ship it with
`spark.submit.pyFiles`.
"""

from projections.spark.leases import DEFAULT_LEASE_TTL, ProjectionBusy
from projections.spark.options import SourceOptionError
from projections.spark.project import RebuildResult, project, rebuild, store_start
from projections.spark.register import local_session, register
from projections.spark.sink import SparkHandler

__all__ = [
    "DEFAULT_LEASE_TTL",
    "ProjectionBusy",
    "RebuildResult",
    "SourceOptionError",
    "SparkHandler",
    "local_session",
    "project",
    "rebuild",
    "register",
    "store_start",
]

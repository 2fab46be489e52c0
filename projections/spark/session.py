"""Registering the data source with a session, and a local session for the embedded case.

Spark refuses a Python reader that implements `pushFilters` unless the session
enables `spark.sql.python.filterPushdown.enabled`, so `register` looks at that
setting and registers the variant that fits: with it, equality on
persistence_id / entity_type and ranges on slice / db_timestamp are evaluated
by PostgreSQL; without it, Spark filters the rows itself. Either way the
results are the same.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from projections.spark.redaction import redact_dsn_passwords
from projections.spark.source import FilteringJournalDataSource, JournalDataSource

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def is_spark_session(spark: object) -> bool:
    """Whether `spark` is a session: a classic one, or a Spark Connect client's (another
    class, importable only with the `connect` extra's dependencies)."""
    if isinstance(spark, SparkSession):
        return True
    kind = type(spark)
    return kind.__name__ == "SparkSession" and kind.__module__ == "pyspark.sql.connect.session"


def is_connect_session(spark: object) -> bool:
    """Whether `spark` is a Spark Connect client's session: no JVM in this process, so
    nothing here can reach Spark's internals (its server does that, per session)."""
    return is_spark_session(spark) and getattr(spark, "_jvm", None) is None


def _configured(
    builder: SparkSession.Builder, config: Mapping[str, str] | None
) -> SparkSession.Builder:
    """`builder` with the caller's further settings applied."""
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    return builder


def register(spark: SparkSession) -> None:
    """Register the `slicejournal` data source with `spark` (again after changing
    `spark.sql.python.filterPushdown.enabled`), and have the session redact DSN
    passwords in the text it shows (`redaction.py`)."""
    redact_dsn_passwords(spark)
    pushdown = (spark.conf.get(PUSHDOWN_CONF, "false") or "false").lower() == "true"
    spark.dataSource.register(FilteringJournalDataSource if pushdown else JournalDataSource)


def spark_session(
    app_name: str = "slicejournal", *, cores: int = 2, config: Mapping[str, str] | None = None
) -> SparkSession:
    """The session a program gets without choosing one, with the data source registered.

    Where it runs is the environment's choice, as with `spark-submit`: Spark
    Connect when `SPARK_REMOTE` is set (`sc://host:15002`; the server's own
    Python must have this package), the cluster at `MASTER` when that is set
    (`spark://host:7077`; the executors' Python must have it: install the wheel
    there or ship it with `spark.submit.pyFiles`), else `local_session(cores=cores)`.
    `config`: further Spark settings for a session this call creates.
    """
    remote = os.environ.get("SPARK_REMOTE")
    master = os.environ.get("MASTER")
    if not remote and not master:
        return local_session(app_name, cores=cores, config=config)
    builder = _configured(SparkSession.builder.appName(app_name), config)
    if remote:
        builder = builder.remote(remote)
    else:
        builder = builder.master(str(master)).config("spark.sql.session.timeZone", "UTC")
        local_ip = os.environ.get("SPARK_LOCAL_IP")
        if local_ip:  # the driver must listen where the executors can reach it
            builder = builder.config("spark.driver.host", local_ip).config(
                "spark.driver.bindAddress", local_ip
            )
    spark = builder.getOrCreate()
    register(spark)
    return spark


def local_session(
    app_name: str = "slicejournal", *, cores: int = 2, config: Mapping[str, str] | None = None
) -> SparkSession:
    """A local-mode session (`local[cores]`) whose Python workers run this interpreter,
    with the data source registered: what the demo, the tests and the benchmark use.
    `config`: further Spark settings (e.g. `{"spark.jars": path}`)."""
    # Executors must import this package: locally they are this Python, on a cluster
    # the package is installed on the workers (or shipped with spark.submit.pyFiles).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Local mode talks to itself only: over loopback, whatever the host's interfaces.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        _configured(SparkSession.builder, config)
        .master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark

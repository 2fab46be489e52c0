"""The batch read planned by slicejournal and executed by Spark's own JDBC source.

Why a second executor: the `slicejournal` data source reads in Python workers,
and every row it returns crosses from them into the JVM; on a machine whose
cores the database, the JVM and the workers share, that made its batch read
about 0.6x Spark's JDBC source over the same table (docs/benchmarks.md). The
JDBC reader runs in the executors' JVMs and pays none of it. What it cannot do
is plan a journal read: which rows count (tombstones, not deleted rows), up to
where every writer has committed, which columns in which types. `read_events`
plans exactly that in the driver, as the source would, and hands the JDBC
reader one statement and a slice range per partition:

- the options are the source's, checked the same way (`SourceOptionError`);
- partitions are `numPartitions` contiguous slice ranges, so an id's events are
  in one partition, in (db_timestamp, seq_nr) order unless `ordered` is false —
  sorted in the executors (`sortWithinPartitions`), not by the database;
- every partition reads below one bound taken in the driver: the visibility
  horizon of the moment (the oldest write still open, less the margin), as a
  stream's `availableNow` batch, so the read is one consistent cut;
- the DataFrame has the source's schema (`arrow.SCHEMA_DDL`): JSON payloads as
  text in `event`, others as bytes in `event_bytes`, metadata as text;
- the rows travel in PostgreSQL's binary format (the driver's
  `prepareThreshold=-1`) and the payloads as they are stored: the executors turn
  a JSON payload's bytes into text and a missing tag list into an empty one,
  where JDBC would otherwise have the server print the payload as hex or as
  validated text, the timestamps and numbers as text, and every row's tags, and
  then parse them all back (measured: 0.82-0.88x of Spark's plain JDBC read of
  the table without this, 0.95-1.08x with it, at the same CPU; docs/benchmarks.md).

It needs the PostgreSQL JDBC driver on Spark's classpath (`spark.jars`, e.g.
Debian's /usr/share/java/postgresql.jar) and a server reachable over TCP (the
DSN's host; JDBC has no Unix sockets). Without them, or for what the plan does
not cover (event filters, `fromSnapshots`, durable state), `read_events` returns
the source's DataFrame, with the same columns, and logs why. The rows differ in
one way: the source has no common bound, so each of its partitions reads what
has committed when it runs, transactions still open at planning included.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import attrs
import psycopg
from psycopg import ClientCursor, ConnectionInfo, conninfo

from journal.errors import ProtocolError
from journal.model import EPOCH
from journal.query import sql as journal_sql
from journal.query.horizon import READER_APPLICATION, horizon_from_row
from journal.serialization import JSON_SERIALIZER_ID
from journal.sync.migrate import require_table
from journal.sync.pool import open_connection
from journal.tables import Tables
from projections.spark.arrow import SCHEMA_DDL
from projections.spark.offsets import StreamOffset, batch_bound
from projections.spark.options import EVENTS, SourceOptionError, SourceOptions, parse_options
from projections.spark.sql import ReadPlan, partition_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_log = logging.getLogger("slicejournal.projections.spark")

ReadExecutor = Literal["auto", "jdbc", "source"]
"""Who reads: `jdbc` (Spark's JDBC source; an error if it cannot), `source` (the
`slicejournal` data source) or `auto` (JDBC where it can, else the source)."""

JDBC_DRIVER = "org.postgresql.Driver"

# The partition statement's columns (`sql.PARTITION_COLUMNS`) as the server has them:
# the payloads as stored and the tags as they are (`_columns` gives them the source's
# schema in the executors, as `arrow.spark_batch` does in the Python workers).
_OUTER = (
    "SELECT persistence_id, slice, seq_nr, db_timestamp, event_payload AS payload, "
    "event_ser_id AS ser_id, event_ser_manifest AS ser_manifest, tags, writer, "
    "meta_json AS metadata, deleted FROM ({inner}) AS journal_rows"
)
# The driver's properties for the partitions' reads: a server-side statement from the
# first execution, so that the rows come in the binary format (bytea as bytes instead
# of hex, timestamps and numbers without printing and parsing).
_BINARY_ROWS = {"prepareThreshold": "-1"}


def read_events(
    spark: SparkSession,
    options: Mapping[str, str],
    *,
    executor: ReadExecutor = "auto",
    jdbc_properties: Mapping[str, str] | None = None,
) -> DataFrame:
    """A batch read of the journal's events, with the `slicejournal` source's options
    and schema, executed by Spark's JDBC source where it can be (see the module).

    `executor="jdbc"` raises `SourceOptionError` (saying why) where JDBC cannot run
    the read; `"source"` always uses the `slicejournal` data source.
    `jdbc_properties` are PostgreSQL JDBC driver properties for the partitions'
    connections, applied last: e.g. `{"prepareThreshold": "5"}` behind a
    connection pooler without prepared statements (the read asks for `-1`, rows in
    the binary format), or TLS settings the DSN does not carry. Raises
    `SourceOptionError` for bad options and `SchemaNotInitialized` /
    `ConnectionFailed` as the source does, before Spark reads anything.
    """
    if executor not in ("auto", "jdbc", "source"):
        raise SourceOptionError(
            f"read_events: executor must be 'auto', 'jdbc' or 'source', got {executor!r}"
        )
    extra = _checked_properties(jdbc_properties or {})
    parsed = parse_options(options)
    why_not = "asked for the source" if executor == "source" else _jdbc_unsupported(parsed)
    if why_not is not None:
        if executor == "jdbc":
            raise SourceOptionError(f"read_events: Spark's JDBC source cannot run it: {why_not}")
        return _source(spark, options, why_not)
    try:
        frame = _jdbc_frame(spark, parsed, extra)
        frame.schema  # noqa: B018 - the JDBC source connects (and loads its driver) by now
    except Exception as e:
        if not _driver_missing(e):
            raise
        why = f"no {JDBC_DRIVER} on Spark's classpath (spark.jars)"
        if executor == "jdbc":
            raise SourceOptionError(f"read_events: Spark's JDBC source cannot run it: {why}") from e
        return _source(spark, options, why)
    return frame


def _driver_missing(error: BaseException) -> bool:
    """Whether Spark failed because the PostgreSQL JDBC driver is not on its classpath
    (and not, say, because the driver could not connect: its stack frames name it too)."""
    text = str(error)
    return f"ClassNotFoundException: {JDBC_DRIVER}" in text or "No suitable driver" in text


def _jdbc_unsupported(options: SourceOptions) -> str | None:
    """Why Spark's JDBC source cannot run this read (None: it can)."""
    if options.read != EVENTS:
        return f"it reads {options.read!r}, not events"
    if options.from_snapshots:
        return "fromSnapshots"
    if options.event_filter is not None:
        return "an event filter (manifests, tags, where)"
    try:
        host = str(conninfo.conninfo_to_dict(options.dsn).get("host") or "")
    except psycopg.ProgrammingError as e:
        raise SourceOptionError(f"read_events: option 'dsn' is not a valid DSN: {e}") from None
    if not host or host.startswith("/") or "," in host:
        return "the DSN names no single TCP host (JDBC has no Unix sockets)"
    return None


def _source(spark: SparkSession, options: Mapping[str, str], why: str) -> DataFrame:
    from projections.spark.session import register

    _log.info("slicejournal batch read through the slicejournal source: %s", why)
    register(spark)
    return spark.read.format("slicejournal").options(**options).load()


def _jdbc_plan(options: SourceOptions) -> tuple[str, str, dict[str, str]]:
    """The statement every partition reads (values bound), and the JDBC URL and connection
    properties of the server, user and database the planning connection reached (libpq's
    defaults, environment and password file applied), after checking the journal exists:
    the source's rows of the whole slice range below one bound taken now."""
    tables = Tables(options.settings)
    with open_connection(
        options.dsn, options.settings, application_name=READER_APPLICATION
    ) as conn:
        require_table(conn, tables)
        reading = horizon_from_row(
            _one(conn.execute(*journal_sql.horizon(tables, READER_APPLICATION)).fetchone())
        )
        plan = ReadPlan(
            attrs.evolve(options, ordered=False),  # sorted by the executors, not the server
            options.slice_range,
            options.from_timestamp,
            until_exclusive=batch_bound(StreamOffset(EPOCH), reading, options),
            to_inclusive=options.to_timestamp,
        )
        inner = ClientCursor(conn).mogrify(*partition_rows(plan))
        url, properties = _jdbc_url(conn.info, conninfo.conninfo_to_dict(options.dsn))
    return _OUTER.format(inner=inner), url, properties


def _one(row: tuple[Any, ...] | None) -> tuple[Any, ...]:
    if row is None:  # pragma: no cover - the horizon statement is an aggregate
        raise ProtocolError("the database returned no row")
    return row


def _jdbc_url(info: ConnectionInfo, dsn: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """The JDBC URL and properties (user, password, TLS) of a connected session."""
    host = info.host
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    url = f"jdbc:postgresql://{host}:{info.port}/{quote(info.dbname, safe='')}"
    properties = {"driver": JDBC_DRIVER, "ApplicationName": READER_APPLICATION}
    properties["user"] = info.user
    if info.password:
        properties["password"] = info.password
    for name in ("sslmode", "sslrootcert", "sslcert", "sslkey"):
        if dsn.get(name):
            properties[name] = str(dsn[name])
    return url, properties


# Properties `jdbc_properties` may not set: the driver class, and the session name the
# visibility horizon leaves out (the read's own open transactions must not hold it back).
_FIXED_PROPERTIES = ("driver", "applicationname")


def _checked_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """`read_events`' `jdbc_properties`, refused (`SourceOptionError`) unless they map str
    to str and leave the driver and the session name alone; values never appear in the
    message (a password may be among them)."""
    checked: dict[str, str] = {}
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise SourceOptionError(
                f"read_events: jdbc_properties must map str to str, got {name!r} -> "
                f"{type(value).__name__}"
            )
        if name.lower() in _FIXED_PROPERTIES:
            raise SourceOptionError(
                f"read_events: jdbc_properties cannot set {name!r}: the read names its "
                "driver and its sessions itself"
            )
        checked[name] = value
    return checked


def _partition_properties(
    planned: Mapping[str, str], options: SourceOptions, extra: Mapping[str, str]
) -> dict[str, str]:
    """The JDBC properties of every partition's connection: the planned connection's
    (URL user, password, TLS, driver, session name), binary rows, the fetch size, then
    the caller's `jdbc_properties` over them."""
    return {**planned, **_BINARY_ROWS, "fetchsize": str(options.batch_rows), **extra}


def _jdbc_frame(spark: SparkSession, options: SourceOptions, extra: Mapping[str, str]) -> DataFrame:
    statement, url, planned = _jdbc_plan(options)
    properties = _partition_properties(planned, options, extra)
    predicates = [
        f"slice BETWEEN {r.min_slice} AND {r.max_slice}" for r in options.partition_ranges()
    ]
    frame = spark.read.jdbc(
        url,
        f"({statement}) AS slicejournal_read",
        predicates=predicates,
        properties=properties,
    )
    frame = frame.select(*_columns(options.entity_type))
    if options.ordered:
        frame = frame.sortWithinPartitions("db_timestamp", "seq_nr")
    return frame


def _columns(entity_type: str) -> list[Any]:
    """The source's columns (`SCHEMA_DDL`) from the partition statement's (`_OUTER`): a
    JSON payload's UTF-8 bytes as text in `event` (a cast, no copy through a Java
    string; bytes that are not UTF-8 fail the read, as the source's do), any other
    payload in `event_bytes`, metadata as text, no tags an empty list."""
    from pyspark.sql import functions as f

    json = f.col("ser_id") == JSON_SERIALIZER_ID
    computed = {
        "entity_type": f.lit(entity_type),
        "event": f.when(json, f.validate_utf8(f.col("payload").cast("string"))),
        "event_bytes": f.when(~json, f.col("payload")),
        "tags": f.coalesce(f.col("tags"), f.array().cast("array<string>")),
        "metadata": f.validate_utf8(f.col("metadata").cast("string")),
    }
    columns: list[Any] = []
    for field in SCHEMA_DDL.split(", "):
        name, kind = field.split(" ", 1)
        columns.append(computed.get(name, f.col(name)).cast(kind).alias(name))
    return columns

"""The streaming job: Kafka events in, alerts and dead letters out.

source (fencewatch-kafka, or Spark's own Kafka source: JobOptions.kafka_source)
  -> route each record to the buckets of its cluster that need it (Spark SQL:
     streaming/routing.py, the split of detectors.buckets)
  -> groupBy(cluster bucket).transformWithStateInPandas(DetectorProcessor), RocksDB state
  -> foreachBatch: webhook outbox, alerts topic + console, dead-letter topic,
     detector snapshots -> Prometheus metrics
A StreamingQueryListener on the driver turns the query's progress into metrics.
The job refuses compacted alerts and dead-letter topics, and keeps its publish
marks with the checkpoint (streaming/delivery_ledger.py).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from prometheus_client import CollectorRegistry

from detectors.config import DetectorConfig
from streaming.bucket_layout import resolve_buckets
from streaming.checkpoint_lock import local_directory
from streaming.delivery_ledger import DeliveryLedger
from streaming.kafka_source import read_events
from streaming.listener import JobListener
from streaming.metrics import Metrics
from streaming.processor import DetectorProcessor
from streaming.query_start import start_query
from streaming.routing import route
from streaming.schema import OUTPUT_SCHEMA
from streaming.sinks import Sinks, TopicSink, refuse_compacted_topics
from streaming.spark_home import compiled_spark_home
from streaming.spark_kafka import PYTHON_SOURCE

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from webhooks import Dispatcher

QUERY_NAME = "fencewatch"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
# The state store every query of the job runs on (the provider must be set
# before the session's first stateful query).
STATE_STORE_SETTINGS = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    # Commit a changelog per batch instead of a new RocksDB snapshot each time:
    # the state commit took 149-172 ms instead of 234-350 ms (docs/performance.md).
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # Counting rows makes RocksDB read every key before it writes or removes it;
    # nothing here reads the count (the state operator's numRowsTotal metric).
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
}


@dataclass(frozen=True)
class JobOptions:
    bootstrap_servers: str
    topic: str
    checkpoint: str
    alerts_topic: str = "fencewatch-alerts"
    dead_letter_topic: str = "fencewatch-dead-letters"
    kafka_config: dict[str, str] = field(default_factory=dict)  # librdkafka settings (TLS/SASL)
    starting_offsets: str = "earliest"
    max_events_per_trigger: int | None = None
    trigger_seconds: float = 1.0
    idle_flush_ms: int = 10_000
    # Which source reads the topic (kafka_source.SOURCES): ours, or Spark's own,
    # which needs a session with its connector (spark_session(kafka_connector=True)).
    kafka_source: str = PYTHON_SOURCE
    # Buckets per cluster (detectors.buckets); None: the checkpoint's, or the default.
    buckets: int | None = None
    # DetectorConfig's own default leaves clocks unmeasured; fencewatch run passes the
    # command's settings, which measure them unless told not to. A benchmark of the job
    # as users run it passes DetectorConfig(measure_clocks=True) (docs/performance.md,
    # "The streaming benchmark with clocks measured").
    detector: DetectorConfig = field(default_factory=DetectorConfig)


def spark_session(
    master: str = "local[2]",
    app_name: str = "fencewatch",
    shuffle_partitions: int = 2,
    log_file: str | None = None,
    jvm_options: str = "",
    kafka_connector: bool = False,
) -> SparkSession:
    """A session set up for the job: RocksDB state, workers on this interpreter.

    jvm_options: Java options of the driver's and the executors' JVMs (their
    ``extraJavaOptions``; "": Spark's settings); the driver's apply when this
    process starts the JVM. ``-XX:TieredStopAtLevel=1`` (HotSpot's C1 compiler
    alone) made a job's first minutes cheaper, and 4M events dearer
    (docs/performance.md, "... and the JVM's compilers").

    log_file: append everything the JVM prints (log4j's console output, Java
    stack traces) and what its Python workers print to this file instead of
    this process's stdout and stderr. Applies when the session starts this
    process's JVM (the first session; later ones share it).

    kafka_connector: load Spark's Kafka source (streaming/spark_kafka.py),
    downloaded from Maven Central on first use; applies when the session
    starts this process's JVM, as ``log_file`` does."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    # Spark starts Python workers from the JVM's environment: use this venv's interpreter,
    # importing its compiled pyspark (streaming/spark_home.py).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_HOME", compiled_spark_home())
    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName(app_name)
        .set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .set("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.driver.host", os.environ.get("FENCEWATCH_DRIVER_HOST", "127.0.0.1"))
    )
    if kafka_connector:
        from streaming import spark_kafka

        conf.setAll(list(spark_kafka.package_conf().items()))
    if jvm_options:
        for role in ("driver", "executor"):
            conf.set(f"spark.{role}.extraJavaOptions", jvm_options)
    if log_file is not None and SparkContext._gateway is None:
        # pyspark's documented hook for capturing the JVM's output (launch_gateway's
        # popen_kwargs); Python workers are the JVM's children and inherit it. The
        # context built on this gateway is the one the builder below returns.
        with open(log_file, "ab") as log:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
        SparkContext(conf=conf, gateway=gateway)
    session = SparkSession.builder.config(conf=conf).getOrCreate()
    # Alerts go to stdout; Spark's INFO/WARN chatter would bury them.
    session.sparkContext.setLogLevel(os.environ.get("FENCEWATCH_SPARK_LOG_LEVEL", "ERROR"))
    return session


def detect(
    events: DataFrame,
    detector: DetectorConfig,
    scope: str,
    idle_flush_ms: int,
    buckets: int,
    share_clocks: bool = False,
) -> DataFrame:
    """The job's stateful part, whatever the source: ``events`` (the columns of
    ``kafka_source.read_events``; each key's rows are judged in (partition,
    offset) order) routed to the buckets of their cluster, and the detector run
    on each bucket. Rows of ``OUTPUT_SCHEMA``. ``scope`` names the query (its
    checkpoint); see ``DetectorProcessor`` for ``idle_flush_ms`` and
    ``share_clocks``. Also used by the file backfill (streaming/file_source.py),
    which has no topic to share clocks through."""
    processor = DetectorProcessor(
        detector, scope=scope, idle_flush_ms=idle_flush_ms, buckets=buckets, share_clocks=share_clocks
    )
    return (
        route(events, buckets)
        .groupBy("key")
        .transformWithStateInPandas(
            statefulProcessor=processor,
            outputStructType=OUTPUT_SCHEMA,
            outputMode="Append",
            timeMode="ProcessingTime",
        )
    )


def start(
    spark: SparkSession,
    options: JobOptions,
    console: TextIO | None = sys.stdout,
    on_alert: Callable[[str], None] | None = None,
    metrics: Metrics | None = None,
    webhooks: Dispatcher | None = None,
    on_started: Callable[[], None] | None = None,
) -> StreamingQuery:
    """Start the job; it runs until the returned query is stopped. With
    ``metrics``, the query's progress and the detector's counters feed them;
    with ``webhooks``, every alert enters its outbox (the caller starts it);
    ``on_started`` is called once the query first runs, before it returns.
    Raises ``CompactedSinkTopic`` if the alerts or dead-letter topic is
    compacted, ``LayoutMismatch`` if the checkpoint has another bucket count."""
    refuse_compacted_topics(
        options.bootstrap_servers, (options.alerts_topic, options.dead_letter_topic), options.kafka_config
    )
    for name, value in STATE_STORE_SETTINGS.items():
        spark.conf.set(name, value)
    if local_directory(options.checkpoint) is not None:
        # Hadoop's FileSystem instead of its FileContext for the checkpoint's
        # files: on a local disk both write a temporary file and rename it
        # (atomic there), but the batch's commits took 16/12 ms instead of
        # 133/157 ms (state) and 22/27 instead of 72/65 ms (offset log) in an
        # A/B on this machine (docs/performance.md). Other file systems keep
        # Spark's default, which HDFS and object stores need.
        spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", FILE_SYSTEM_CHECKPOINTS)
    # With processing-time timers Spark runs a no-data batch every trigger,
    # which kept a core busy on an idle topic. Our source plans an empty batch
    # when the idle flush is due instead (kafka_source.py, idle ticks); Spark's
    # connector cannot, so with it the no-data batches stay.
    python_source = options.kafka_source == PYTHON_SOURCE
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", str(not python_source).lower())
    source_options = {
        "kafka.bootstrap.servers": options.bootstrap_servers,
        "subscribe": options.topic,
        "startingOffsets": options.starting_offsets,
        **{f"kafka.{k}": v for k, v in options.kafka_config.items()},
    }
    if options.max_events_per_trigger:
        source_options["maxEventsPerTrigger"] = str(options.max_events_per_trigger)
    # One cluster's records share a key, so a partition: read each batch of it on every core.
    source_options["minPartitions"] = str(spark.sparkContext.defaultParallelism)
    if python_source:
        source_options["idleTriggerMs"] = str(options.idle_flush_ms)
    buckets = resolve_buckets(spark, options.checkpoint, options.buckets)
    events = read_events(spark, source_options, source=options.kafka_source, route_buckets=buckets)
    # Split clusters measure each clock once for all their buckets: every bucket's
    # bounds go to the others through the event topic (detectors.clock_exchange).
    share_clocks = buckets > 1 and options.detector.measure_clocks
    detected = detect(
        events, options.detector, options.checkpoint, options.idle_flush_ms, buckets, share_clocks
    )
    sinks = Sinks(
        TopicSink(options.bootstrap_servers, options.alerts_topic, options.kafka_config),
        TopicSink(options.bootstrap_servers, options.dead_letter_topic, options.kafka_config),
        DeliveryLedger(spark, options.checkpoint),
        console=console,
        on_alert=on_alert,
        metrics=metrics,
        webhooks=webhooks,
        clock_evidence=(
            TopicSink(options.bootstrap_servers, options.topic, options.kafka_config)
            if share_clocks
            else None
        ),
    )
    # Without a caller's metrics, a private registry: the listener still
    # closes the sinks' producers when the query stops.
    metrics = metrics or Metrics(CollectorRegistry())
    spark.streams.addListener(JobListener(metrics, QUERY_NAME, options.topic, on_terminated=sinks.close))
    return start_query(
        detected.writeStream.foreachBatch(sinks)
        .option("checkpointLocation", options.checkpoint)
        .trigger(processingTime=f"{options.trigger_seconds} seconds")
        .queryName(QUERY_NAME),
        on_started=on_started,
    )

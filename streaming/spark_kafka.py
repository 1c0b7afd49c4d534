"""Spark's own Kafka source (``spark-sql-kafka-0-10``): its package, and the job's
events read through it.

The connector is not in the pyspark wheel. ``package_conf`` has Spark's Ivy
fetch it from Maven Central when the session's JVM starts (``spark.jars.packages``
is read by SparkSubmit, before any session exists) into a cache of ours, so it
is downloaded once. Only Maven Central is asked: Spark's default chain also
tries ``~/.m2``, where a Maven run that fetched a POM without its jar makes Ivy
fail (it did here, on slf4j-api), and repos.spark-packages.org.

Its rows become ``kafka_source.EVENT_SCHEMA`` rows, with the semantics of our
Python source: the key decoded as UTF-8 with U+FFFD for bytes that are not,
the record timestamp in epoch milliseconds (null where the record has none),
and offsets ``[start, end)`` per partition kept in Spark's checkpoint, so a
restart re-reads exactly the batch that was planned.

Against the embedded broker (tansu) this source does not read the tail of a
topic: it plans a batch's end from ListOffsets' latest offset
(``KafkaOffsetReaderAdmin``), which tansu reports as the last *batch's* base
offset + 1 (NOTES.md), so in a quiet topic every record after the first of the
last batch of each partition stays unread. Our Python source corrects that from
a fetch response (``KafkaStreamReader._log_spans``); here it cannot be.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# What can read the event topic (kafka_source.read_events): our Python source, or this one.
PYTHON_SOURCE, SPARK_SOURCE = "python", "spark"
SOURCES = (PYTHON_SOURCE, SPARK_SOURCE)
# pyspark is 4.3.0, but Maven Central serves this connector up to 4.2.0 (its
# maven-metadata.xml, 2026-12-07; spark-core and spark-sql 4.3.0 are there).
# The 4.2.0 connector runs on Spark 4.3.0: tests/integration/test_spark_kafka_source.py.
PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
# Dependencies of the connector the wheel already ships at the same versions
# (pyspark/jars; tests/unit/test_spark_kafka.py checks): not downloaded again.
# The two Hadoop client jars alone are 50 MB of the 63 MB.
WHEEL_SHIPS = (
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "at.yawk.lz4:lz4-java",
    "org.xerial.snappy:snappy-java",
    "org.slf4j:slf4j-api",
    "com.google.code.findbugs:jsr305",
    "org.scala-lang.modules:scala-parallel-collections_2.13",
)
CACHE_ENV = "FENCEWATCH_SPARK_PACKAGES_DIR"
_IVY_SETTINGS = f"""<ivysettings>
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="{MAVEN_CENTRAL}"/>
  </resolvers>
</ivysettings>
"""
# Spark's connector's options for ours (kafka_source.SourceOptions); options of
# ours it has no counterpart for are left out.
_RENAMED = {"maxeventspertrigger": "maxOffsetsPerTrigger", "maxeventspersplit": "maxRecordsPerPartition"}
_OURS_ONLY = {"probetimeoutms", "readtimeoutms", "idletriggerms", "routebuckets"}


def cache_dir() -> Path:
    """Where Ivy keeps the connector: ``$FENCEWATCH_SPARK_PACKAGES_DIR``, else
    ``$XDG_CACHE_HOME/fencewatch/spark-packages`` (``~/.cache/...``)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "fencewatch" / "spark-packages"


def connector_jar() -> Path:
    """The connector's jar where Ivy puts it once resolved (``<cache>/jars``)."""
    group, artifact, version = PACKAGE.split(":")
    return cache_dir() / "jars" / f"{group}_{artifact}-{version}.jar"


def is_cached() -> bool:
    return connector_jar().is_file()


def package_conf() -> dict[str, str]:
    """The SparkConf entries that load the connector when the JVM starts."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    settings = cache / "ivysettings.xml"
    if not settings.is_file() or settings.read_text() != _IVY_SETTINGS:
        draft = settings.with_suffix(f".{os.getpid()}.tmp")
        draft.write_text(_IVY_SETTINGS)
        draft.replace(settings)  # whole, for another process starting at once
    return {
        "spark.jars.packages": PACKAGE,
        "spark.jars.excludes": ",".join(WHEEL_SHIPS),
        "spark.jars.ivy": str(cache),
        "spark.jars.ivySettings": str(settings),
    }


class UnsupportedClientSetting(ValueError):
    """A librdkafka setting (``--kafka-config``) Spark's Kafka source cannot be given."""


# librdkafka settings that mean the same in the Java client, under the same name.
_SAME_NAME = {
    "client.id",
    "client.rack",
    "socket.connection.setup.timeout.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "retry.backoff.ms",
    "metadata.max.age.ms",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "isolation.level",
    "check.crcs",
    "ssl.cipher.suites",
}
# The settings java_client_settings translates (the rest must be _SAME_NAME).
_translated = {
    "security.protocol",
    "enable.ssl.certificate.verification",
    "ssl.endpoint.identification.algorithm",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.key.location",
    "ssl.key.pem",
    "ssl.key.password",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
}
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def java_client_settings(librdkafka: Mapping[str, str]) -> dict[str, str]:
    """The Java client's settings (Spark's source, as ``kafka.<name>``) for the
    librdkafka settings users give every client (``--kafka-config``).

    TLS: a CA file or PEM (``ssl.ca.location``, ``ssl.ca.pem``) becomes a PEM
    trust store, a client certificate and key (``ssl.certificate.*``,
    ``ssl.key.*``) a PEM key store holding their text (Kafka's
    ``SslConfigs``/``DefaultSslEngineFactory``, KIP-651: the key must be PKCS#8);
    ``ssl.endpoint.identification.algorithm=none`` is the Java client's empty
    value. SASL PLAIN and SCRAM: ``sasl.username``/``sasl.password`` become
    the ``sasl.jaas.config`` of the mechanism's login module. A setting with no
    counterpart raises ``UnsupportedClientSetting`` naming it."""
    given = {name.strip().lower(): value for name, value in librdkafka.items()}
    out: dict[str, str] = {}
    for name in given.keys() - _translated:
        if name not in _SAME_NAME:
            raise UnsupportedClientSetting(
                f"--kafka-config {name} has no counterpart fencewatch gives Spark's Kafka source "
                "(the Java client)"
            )
        out[name] = given[name]
    if "security.protocol" in given:
        out["security.protocol"] = given["security.protocol"].upper()
    if given.get("enable.ssl.certificate.verification", "true").lower() in ("false", "0"):
        raise UnsupportedClientSetting(
            "--kafka-config enable.ssl.certificate.verification=false has no counterpart in "
            "Spark's Kafka source (the Java client always verifies the broker's certificate)"
        )
    if "ssl.endpoint.identification.algorithm" in given:
        algorithm = given["ssl.endpoint.identification.algorithm"].lower()
        out["ssl.endpoint.identification.algorithm"] = "" if algorithm == "none" else algorithm
    if "ssl.ca.location" in given or "ssl.ca.pem" in given:
        out["ssl.truststore.type"] = "PEM"
        if "ssl.ca.pem" in given:
            out["ssl.truststore.certificates"] = given["ssl.ca.pem"]
        else:
            out["ssl.truststore.location"] = _pem_file(given["ssl.ca.location"], "ssl.ca.location")
    certificate = _pem(given, "ssl.certificate")
    key = _pem(given, "ssl.key")
    if (certificate is None) != (key is None):
        raise UnsupportedClientSetting(
            "--kafka-config gives a client certificate without its key, or a key without its certificate"
        )
    if certificate is not None and key is not None:
        out.update({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": certificate})
        out["ssl.keystore.key"] = key
        if "ssl.key.password" in given:
            out["ssl.key.password"] = given["ssl.key.password"]
    mechanism = given.get("sasl.mechanism", given.get("sasl.mechanisms"))
    if mechanism is not None:
        mechanism = mechanism.upper()
        if mechanism not in _JAAS_MODULES:
            raise UnsupportedClientSetting(
                f"--kafka-config sasl.mechanism={mechanism}: fencewatch gives Spark's Kafka source "
                f"{', '.join(_JAAS_MODULES)} only"
            )
        out["sasl.mechanism"] = mechanism
        username, password = given.get("sasl.username", ""), given.get("sasl.password", "")
        out["sasl.jaas.config"] = (
            f"{_JAAS_MODULES[mechanism]} required "
            f'username="{_jaas_quoted(username)}" password="{_jaas_quoted(password)}";'
        )
    return out


def _pem_file(path: str, setting: str) -> str:
    if not os.path.isfile(path):
        raise UnsupportedClientSetting(
            f"--kafka-config {setting}={path} is not a file (Spark's Kafka source needs a PEM file, "
            "not a directory)"
        )
    return path


def _pem(given: Mapping[str, str], prefix: str) -> str | None:
    """The PEM text of ``<prefix>.pem``, or of the file ``<prefix>.location``."""
    if f"{prefix}.pem" in given:
        return given[f"{prefix}.pem"]
    if f"{prefix}.location" not in given:
        return None
    path = _pem_file(given[f"{prefix}.location"], f"{prefix}.location")
    with open(path) as f:
        return f.read()


def _jaas_quoted(value: str) -> str:
    """``value`` inside a JAAS option's double quotes (Kafka's ``JaasConfig``
    reads them with a StreamTokenizer: backslash escapes)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


class ConnectorNotLoaded(RuntimeError):
    """Spark's Kafka source was asked for, but the session has no connector jar."""


def read_events(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """``kafka_source.EVENT_SCHEMA`` rows of one topic read by Spark's source.
    ``options`` are our source's (kafka_source.SourceOptions): ``kafka.*``
    librdkafka settings become the Java client's (``java_client_settings``),
    ``maxEventsPerTrigger`` ``maxOffsetsPerTrigger``, ``maxEventsPerSplit``
    ``maxRecordsPerPartition``; ours alone are left out. Offsets that vanish
    before they are read fail the query (the connector's ``failOnDataLoss``)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    client = {k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")}
    servers = client.pop("bootstrap.servers")
    spark_options = {
        _RENAMED.get(k.lower(), k): v
        for k, v in options.items()
        if not k.lower().startswith("kafka.") and k.lower() not in _OURS_ONLY
    }
    spark_options["kafka.bootstrap.servers"] = servers
    spark_options.update({f"kafka.{k}": v for k, v in java_client_settings(client).items()})
    try:
        raw = spark.readStream.format("kafka").options(**spark_options).load()
    except AnalysisException as exc:
        # Spark 4.3 raises KAFKA_DATA_SOURCE_NOT_ENABLED; older ones DATA_SOURCE_NOT_FOUND.
        if exc.getCondition() not in ("KAFKA_DATA_SOURCE_NOT_ENABLED", "DATA_SOURCE_NOT_FOUND"):
            raise
        raise ConnectorNotLoaded(
            f"Spark's Kafka source is not loaded: start the session with {PACKAGE} "
            "(streaming.job.spark_session(kafka_connector=True), or spark.jars.packages)"
        ) from exc
    # NO_TIMESTAMP_TYPE (-1, Kafka's TimestampType): the record has no time.
    timestamp = F.when(F.col("timestampType") != -1, F.unix_millis(F.col("timestamp")))
    return raw.select(
        F.make_valid_utf8(F.col("key").cast("string")).alias("key"),
        F.col("value"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        timestamp.alias("timestamp"),
    )

"""Spark's Kafka source's settings: the librdkafka settings users pass become
the Java client's, and the package's downloads leave out what the wheel ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from streaming import spark_kafka
from streaming.spark_kafka import UnsupportedClientSetting, java_client_settings


def test_sasl_scram_over_tls_becomes_a_jaas_config_and_a_pem_trust_store(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n")
    settings = java_client_settings(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "fencewatch",
            "sasl.password": 'p"w\\d',
            "ssl.ca.location": str(ca),
            "ssl.endpoint.identification.algorithm": "none",
            "client.id": "fw",
        }
    )
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="fencewatch" password="p\\"w\\\\d";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca),
        "ssl.endpoint.identification.algorithm": "",
        "client.id": "fw",
    }


def test_a_client_certificate_and_key_become_a_pem_key_store(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("CERT")
    (tmp_path / "k.pem").write_text("KEY")
    settings = java_client_settings(
        {
            "security.protocol": "SSL",
            "ssl.ca.pem": "CA",
            "ssl.certificate.location": str(tmp_path / "c.pem"),
            "ssl.key.location": str(tmp_path / "k.pem"),
            "ssl.key.password": "kp",
        }
    )
    assert settings == {
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": "CA",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "CERT",
        "ssl.keystore.key": "KEY",
        "ssl.key.password": "kp",
    }


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"socket.keepalive.enable": "true"}, "socket.keepalive.enable"),
        ({"sasl.mechanism": "GSSAPI"}, "GSSAPI"),
        ({"enable.ssl.certificate.verification": "false"}, "enable.ssl.certificate.verification"),
        ({"ssl.certificate.pem": "CERT"}, "without its key"),
        ({"ssl.ca.location": "/nonexistent/ca.pem"}, "/nonexistent/ca.pem"),
    ],
)
def test_a_setting_without_a_counterpart_is_named(config: dict[str, str], named: str) -> None:
    with pytest.raises(UnsupportedClientSetting, match=named):
        java_client_settings(config)


def test_the_dependencies_left_out_are_in_the_wheel_at_the_versions_the_connector_wants() -> None:
    """The connector's POM (4.2.0) asks for these versions; the wheel must ship
    the same, or leaving them out would run the connector on others."""
    import pyspark

    wanted = {
        "org.apache.hadoop:hadoop-client-api": "hadoop-client-api-3.5.0.jar",
        "org.apache.hadoop:hadoop-client-runtime": "hadoop-client-runtime-3.5.0.jar",
        "at.yawk.lz4:lz4-java": "lz4-java-1.11.0.jar",
        "org.xerial.snappy:snappy-java": "snappy-java-1.1.10.8.jar",
        "org.slf4j:slf4j-api": "slf4j-api-2.0.17.jar",
        "com.google.code.findbugs:jsr305": "jsr305-3.0.0.jar",
        "org.scala-lang.modules:scala-parallel-collections_2.13": "scala-parallel-collections_2.13-1.2.0.jar",
    }
    assert set(spark_kafka.WHEEL_SHIPS) == set(wanted)
    jars = Path(pyspark.__file__).parent / "jars"
    assert all((jars / jar).is_file() for jar in wanted.values())


def test_package_conf_asks_maven_central_alone_and_caches_where_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(spark_kafka.CACHE_ENV, str(tmp_path / "cache"))
    conf = spark_kafka.package_conf()
    assert conf["spark.jars.packages"] == spark_kafka.PACKAGE
    assert conf["spark.jars.ivy"] == str(tmp_path / "cache")
    settings = Path(conf["spark.jars.ivySettings"]).read_text()
    assert spark_kafka.MAVEN_CENTRAL in settings and settings.count("<ibiblio") == 1
    assert not spark_kafka.is_cached()

"""Tiered storage is turned on only where the storage test jar holds
LocalTieredStorage: Kafka 3.x serves a kafka-storage test jar too (3.2.3 and
3.3.2 resolved with one), but the class came with tiered storage in 3.6."""

from __future__ import annotations

import zipfile
from pathlib import Path

from localkafka.fetch import KafkaJars

CLASS = "org/apache/kafka/server/log/remote/storage/LocalTieredStorage.class"


def _jar(path: Path, *names: str) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, b"\xca\xfe\xba\xbe")


def test_a_3x_test_jar_without_the_class_turns_tiered_storage_off(tmp_path: Path) -> None:
    _jar(
        tmp_path / "kafka-storage-3.2.3-test.jar",
        "org/apache/kafka/server/log/remote/storage/RemoteLogSegmentId.class",
    )
    assert not KafkaJars("3.2.3", tmp_path).has_tiered_storage_test_jar


def test_a_test_fixtures_jar_with_the_class_turns_it_on(tmp_path: Path) -> None:
    _jar(tmp_path / "kafka-storage-4.4.0-test-fixtures.jar", CLASS)
    assert KafkaJars("4.4.0", tmp_path).has_tiered_storage_test_jar


def test_a_test_jar_with_the_class_turns_it_on(tmp_path: Path) -> None:
    _jar(tmp_path / "kafka-storage-3.9.1-test.jar", CLASS)
    assert KafkaJars("3.9.1", tmp_path).has_tiered_storage_test_jar


def test_no_test_jar_or_a_broken_one_leaves_it_off(tmp_path: Path) -> None:
    assert not KafkaJars("4.4.0", tmp_path).has_tiered_storage_test_jar
    (tmp_path / "kafka-storage-4.3.0-test.jar").write_bytes(b"not a zip")
    assert not KafkaJars("4.3.0", tmp_path).has_tiered_storage_test_jar

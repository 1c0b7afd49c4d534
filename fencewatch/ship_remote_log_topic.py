"""``fencewatch ship remote-log-metadata --from-topic``: the command's wiring
(producers.remote_log_metadata_topic reads the watched cluster's
``__remote_log_metadata`` and ships it, its position saved per partition)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fencewatch.shipping import load_state, open_publisher, say, ship_until_stopped
from producers.kafka_publisher import KafkaPublisher, parse_config_pairs

SOURCE_SASL_PASSWORD_ENV = "FENCEWATCH_SOURCE_SASL_PASSWORD"
REMOTE_TOPIC_STATE_FILE = "remote-log-metadata.fencewatch-offset"


def run(args: argparse.Namespace, publisher: KafkaPublisher, prog: str) -> int:
    # Imported here: only this input needs kafka-python's schema loader.
    from producers.remote_log_metadata_topic import TopicReader, TopicShipper, TopicState

    state = TopicState(args.state_file or REMOTE_TOPIC_STATE_FILE)
    usable, saved = load_state(prog, state)
    if not usable:
        return 1
    if saved is not None:
        state.cluster_id = saved[0]
    config: dict[str, Any] = {
        "bootstrap.servers": args.source_bootstrap_servers,
        **parse_config_pairs(args.source_kafka_config),
    }
    if "sasl.password" not in config and os.environ.get(SOURCE_SASL_PASSWORD_ENV):
        config["sasl.password"] = os.environ[SOURCE_SASL_PASSWORD_ENV]
    if not open_publisher(publisher, prog, args):
        return 1
    shipper = TopicShipper(
        publisher,
        state,
        cluster=args.cluster,
        status_interval_seconds=args.status_interval,
        flush_timeout_seconds=args.flush_timeout,
        status=say,
    )
    reader = TopicReader(
        config,
        start=saved[1] if saved else None,
        expected_cluster_id=saved[0] if saved else None,
        once=args.once,
        on_idle=shipper.on_idle,
    )

    return ship_until_stopped(
        prog,
        lambda: shipper.run(reader),
        reader.stop,
        shipper.summary,
        state_path=state.path,
    )

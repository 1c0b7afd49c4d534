"""Append-to-publish latency of ``fencewatch ship metadata-log``, against the embedded broker.

    .venv/bin/python benchmarks/metadata_log_ship_latency.py                 # 300 batches
    .venv/bin/python benchmarks/metadata_log_ship_latency.py --batches 1000 --poll-interval 0.1

A writer appends one-record batches to a ``__cluster_metadata-0`` segment at
random intervals (0-100 ms, rolling to a new segment every 100 batches), as
the active controller does; ``fencewatch ship metadata-log`` (a child
process, default poll interval) follows the directory; a consumer reads the
topic. For each record: the time from the write that completed its batch to
the consumer receiving it, which bounds append-to-publish from above. Prints
p50/p99/max, and checks that every offset arrived once, in order.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import orjson
from confluent_kafka import Consumer, TopicPartition
from metadata_log_files import Batch, Record, batch_bytes, segment_name

from streaming.broker import EmbeddedBroker

REPO = Path(__file__).resolve().parent.parent
ROLL_EVERY = 100


def noop(offset: int) -> bytes:
    record = Record(int(time.time() * 1000), {"type": "NO_OP_RECORD", "version": 0, "data": {}})
    return batch_bytes(Batch(offset, 1, [record]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--poll-interval", type=float, default=None, help="the shipper's (default: its own)")
    args = parser.parse_args()
    received: dict[int, float] = {}
    order: list[int] = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        broker.create_topics({"events": 1})
        directory = Path(tmp) / "__cluster_metadata-0"
        directory.mkdir()
        (directory / segment_name(0)).write_bytes(b"")
        argv = [sys.executable, "-m", "fencewatch", "ship", "metadata-log"]
        argv += ["--bootstrap-servers", broker.bootstrap_servers, "--topic", "events", "--cluster", "bench"]
        argv += ["--status-interval", "0", "--state-file", str(Path(tmp) / "state")]
        if args.poll_interval is not None:
            argv += ["--poll-interval", str(args.poll_interval)]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        shipper = subprocess.Popen([*argv, str(directory)], env=env, stderr=subprocess.PIPE)
        # fetch.wait.max.ms low: the consumer must not add its own wait to the figure.
        consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": "latency", "fetch.wait.max.ms": 10}
        )
        consumer.assign([TopicPartition("events", 0, 0)])
        done = threading.Event()

        def consume() -> None:
            while not done.is_set():
                for msg in consumer.consume(1000, 0.02):
                    if msg.error() is None:
                        offset = orjson.loads(msg.value())["offset"]
                        received.setdefault(offset, time.time())
                        order.append(offset)

        reading = threading.Thread(target=consume)
        reading.start()
        time.sleep(3)  # the shipper and the consumer start; not measured
        appended: dict[int, float] = {}
        segment = directory / segment_name(0)
        for offset in range(args.batches):
            if offset and offset % ROLL_EVERY == 0:
                segment = directory / segment_name(offset)
            with open(segment, "ab") as f:
                f.write(noop(offset))
            appended[offset] = time.time()
            time.sleep(random.uniform(0, 0.1))
        deadline = time.monotonic() + 30
        while len(received) < args.batches and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
        reading.join()
        consumer.close()
        shipper.terminate()
        _, err = shipper.communicate(timeout=30)
    latencies = sorted((received[o] - appended[o]) * 1000 for o in appended if o in received)
    missing = sorted(set(appended) - set(received))
    in_order = order == sorted(order) and len(order) == len(set(order))
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"{len(latencies)} of {args.batches} records shipped once each, in order: {in_order}; "
        f"append-to-consume latency ms: p50 {statistics.median(latencies):.0f}, p99 {p99:.0f}, "
        f"max {latencies[-1]:.0f}; missing {missing[:10]}"
    )
    print(err.decode().strip().splitlines()[-1])


if __name__ == "__main__":
    main()

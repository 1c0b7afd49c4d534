"""How fast ``__cluster_metadata-0`` files decode (producers.metadata_log), on one core.

    .venv/bin/python benchmarks/metadata_log_decode.py                    # 1,000,000-record snapshot
    .venv/bin/python benchmarks/metadata_log_decode.py --records 200000

Writes the snapshot of a large cluster (per topic one TOPIC_RECORD and 100
PARTITION_RECORD v1 with three replicas, their directories and ISR, plus a
CONFIG_RECORD of a setting no rule reads; 100 brokers registered) in batches of
up to 8,000 records, as ``RecordsSnapshotWriter`` packs them, then reads it
back through ``iter_metadata_log_file`` ``--repeat`` times (CPU time of this
process, so one core) and prints each run's records per second, their median,
and the snapshot's median load time. Also times the real Kafka 3.7.0 segment
in tests/data/native (one record per batch, the live log's shape: almost all
NoOp) as often.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from metadata_log_files import Batch, Record, batch_bytes, raw_metadata_value, snapshot_name

from producers.metadata_log import MetadataLogStats, iter_metadata_log_file

REPO = Path(__file__).resolve().parent.parent
DIRS = ["uHY7hO6-42Q7O4k0zLMmtg", "b1Cq8XoPTWyl9sRk2Ud0vA", "Hn5tJ0mVS-eaQ7xL3kPz4w"]
BATCH_RECORDS = 8000
TS_MS = 1795169580000


def topic_id(n: int) -> str:
    return base64.urlsafe_b64encode(n.to_bytes(16, "big")).rstrip(b"=").decode()


def cluster_records(count: int) -> list[Record]:
    records = []
    for broker in range(100):
        data = {
            "brokerId": broker,
            "isMigratingZkBroker": False,
            "incarnationId": topic_id(10**9 + broker),
            "brokerEpoch": 10 + broker,
            "endPoints": [
                {"name": "PLAINTEXT", "host": f"kafka-{broker}", "port": 9092, "securityProtocol": 0}
            ],
            "features": [{"name": "metadata.version", "minSupportedVersion": 7, "maxSupportedVersion": 25}],
            "rack": None,
            "fenced": False,
            "inControlledShutdown": False,
            "logDirs": DIRS[:1],
        }
        records.append(Record(TS_MS, {"type": "REGISTER_BROKER_RECORD", "version": 3, "data": data}))
    topic = 0
    while len(records) < count:
        tid = topic_id(topic)
        records.append(
            Record(
                TS_MS, {"type": "TOPIC_RECORD", "version": 0, "data": {"name": f"t{topic}", "topicId": tid}}
            )
        )
        records.append(Record(TS_MS, {}, value=raw_metadata_value(4, 0, b"\x02\x02t\x02x\x02y\x00")))
        for partition in range(100):
            replicas = [(partition + i) % 100 for i in range(3)]
            data = {
                "partitionId": partition,
                "topicId": tid,
                "replicas": replicas,
                "isr": replicas,
                "removingReplicas": [],
                "addingReplicas": [],
                "leader": replicas[0],
                "leaderEpoch": 3,
                "partitionEpoch": 7,
                "directories": DIRS,
            }
            records.append(Record(TS_MS, {"type": "PARTITION_RECORD", "version": 1, "data": data}))
        topic += 1
    return records[:count]


def write_snapshot(path: Path, records: list[Record]) -> None:
    with open(path, "wb") as f:
        header = Record(TS_MS, {"version": 0, "lastContainedLogTimestamp": TS_MS}, control="SNAPSHOT_HEADER")
        f.write(batch_bytes(Batch(0, 1, [header])))
        for start in range(0, len(records), BATCH_RECORDS):
            f.write(batch_bytes(Batch(1 + start, 1, records[start : start + BATCH_RECORDS])))
        footer = Record(TS_MS, {"version": 0}, control="SNAPSHOT_FOOTER")
        f.write(batch_bytes(Batch(1 + len(records), 1, [footer])))


def timed(path: Path) -> tuple[MetadataLogStats, float]:
    stats = MetadataLogStats()
    start = time.process_time()
    for _ in iter_metadata_log_file(str(path), cluster="bench", stats=stats):
        pass
    return stats, time.process_time() - start


def runs(path: Path, repeat: int) -> tuple[MetadataLogStats, list[float]]:
    """The stats of one read of ``path`` and the CPU seconds of each of ``repeat`` reads."""
    results = [timed(path) for _ in range(repeat)]
    return results[0][0], [cpu for _, cpu in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the snapshot")
    parser.add_argument("--repeat", type=int, default=3, help="reads of each file; the median is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / snapshot_name(args.records + 1, 1)
        write_snapshot(snapshot, cluster_records(args.records))
        stats, cpus = runs(snapshot, args.repeat)
        read = stats.records + stats.unread
        print(
            f"snapshot: {snapshot.stat().st_size / 1e6:.1f} MB, {read} records ({stats.unread} without a "
            f"schema here), {stats.dead_letters} dead letters"
        )
        print("  runs: " + ", ".join(f"{cpu:.2f} s CPU ({read / cpu:,.0f} records/s)" for cpu in cpus))
        median = statistics.median(cpus)
        print(f"  median: {read / median:,.0f} records/s; loads in {median:.2f} s CPU")
        segment = Path(tmp) / "00000000000000000000.log"
        segment.write_bytes(
            gzip.decompress((REPO / "tests/data/native/kraft-3.7.0-cluster-metadata-0.log.gz").read_bytes())
        )
        stats, cpus = runs(segment, args.repeat)
        read = stats.records + stats.unread
        median = statistics.median(cpus)
        print(
            f"Kafka 3.7.0 segment: {stats.batches} batches, {read} records; median {median:.3f} s CPU: "
            f"{read / median:,.0f} records/s"
        )


if __name__ == "__main__":
    main()

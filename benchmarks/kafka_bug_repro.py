"""A real Kafka bug caught: KAFKA-13916 (a fenced replica admitted to the ISR)
on Apache Kafka 3.2.3, and the same scenario on 3.3.2, where KIP-841 fixed it.

    .venv/bin/python benchmarks/kafka_bug_repro.py --seed 1
    .venv/bin/python benchmarks/kafka_bug_repro.py --seed 7 --keep /tmp/kafka-13916
    .venv/bin/python benchmarks/kafka_bug_repro.py --seed 1 --live    # also watched live

For each version: the scenario of localkafka.fenced_follower (one controller,
three brokers; the seed's broker has its heartbeats dropped until the
controller fences it, while it keeps replicating, then gets them back), then
fencewatch on Kafka's own files, as a user runs it (``fencewatch convert`` of
every request log and of the controller's metadata log, ``fencewatch
replay``); with ``--live`` also as it happens, ``fencewatch ship`` of every
node's request log, the controller's metadata log and quorum-state and
``fencewatch run`` on an embedded broker's event topic (lab.watch),
whose alerts must be replay's, id for id. Prints, side by side, what
fencewatch raised (rule, partition, node, evidence) and Kafka's own records
of the run: the brokers' fencing and the partition changes from the metadata
log as Kafka's DumpLogSegments prints them, the AlterPartition answers from
the controller's request log, and the ISRs Kafka's metadata described while
the broker was fenced. Exits 1 unless the buggy version shows the bug and
fencewatch raises ISR_INELIGIBLE_REPLICA_ADMITTED on exactly the partitions
Kafka admitted the fenced broker to, naming that broker, and nothing else;
and the fixed version shows neither. Each version took 70-100 s here (two
cores shared with other work), 8 minutes with ``--live`` (the streaming job's
first micro-batch); Kafka's jars are fetched from Maven Central on first use.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fencewatch_on_kafka import Judged, alter_partition_lines, broker_state_and_isr_records, judge

from lab.watch import IDLE_FLUSH_MS, Watchers
from localkafka.cluster import LocalKafkaCluster
from localkafka.fenced_follower import FencedFollowerRun, run_fenced_follower
from localkafka.fetch import fetch_kafka
from streaming.broker import EmbeddedBroker

RULE = "ISR_INELIGIBLE_REPLICA_ADMITTED"
MARKER = "Completed request:"
# The streaming job's first micro-batch takes minutes on a loaded two-core machine.
LIVE_TIMEOUT_SECONDS = 900.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="picks the broker cut off and the traffic")
    parser.add_argument("--buggy", default="3.2.3", help="a Kafka version with KAFKA-13916")
    parser.add_argument("--fixed", default="3.3.2", help="a Kafka version with KIP-841's fix")
    parser.add_argument("--keep", type=Path, help="keep the clusters' files here (default: deleted)")
    parser.add_argument(
        "--live", action="store_true", help="also watch each run live with fencewatch ship and run"
    )
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    root = args.keep or Path(tempfile.mkdtemp(prefix="kafka-13916-"))
    ok = True
    try:
        for version, buggy in ((args.buggy, True), (args.fixed, False)):
            started = time.monotonic()
            jars = fetch_kafka(version, progress=print)
            live: Live | None = None
            if args.live:
                live = run_watched_live(jars.version, root / version, args.seed)
                run = live.run
            else:
                run = run_fenced_follower(jars, root / version, seed=args.seed)
            judged = judge(run, root / version / "fencewatch")
            print_run(run, judged, time.monotonic() - started)
            problems = check(run, judged, buggy)
            if live is not None:
                problems += check_live(live, judged)
            for problem in problems:
                print(f"  FAILED: {problem}")
            if not problems:
                what = "admitted the fenced broker, and fencewatch raised exactly that"
                if not buggy:
                    what = "kept the fenced broker out, and fencewatch raised nothing"
                print(f"  as expected: Kafka {version} {what}")
            ok = ok and not problems
            print()
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


@dataclass
class Live:
    """A run watched live: the job's alerts and each shipper's last line at its stop."""

    run: FencedFollowerRun
    alerts: list[dict[str, Any]]
    shippers: dict[str, str]
    # Whether the job read every record shipped and then stood still (else it timed out).
    judged_all: bool


def run_watched_live(version: str, root: Path, seed: int) -> Live:
    """The scenario with fencewatch watching from the moment the cluster is up,
    as kafka-lab does; the job's alerts once it has judged all that was shipped."""
    watchers: list[Watchers] = []
    with EmbeddedBroker() as events:

        def watch(cluster: LocalKafkaCluster) -> None:
            watcher = Watchers(cluster, events.bootstrap_servers, root / "live", cluster_name="kafka")
            watchers.append(watcher)
            watcher.start_job()
            watcher.start_shippers()

        try:
            run = run_fenced_follower(fetch_kafka(version), root, seed=seed, on_start=watch)
            watcher = watchers[0]
            time.sleep(5)  # the cluster has stopped: a few polls and the shippers are at the files' ends
            shippers = watcher.stop_shippers()
            shipped = sum(
                int(m.group(1)) for line in shippers.values() if (m := re.search(r"(\d+) delivered", line))
            )
            judged_all = _wait_until_judged(watcher, shipped)
        finally:
            for watcher in watchers:
                watcher.stop()
    return Live(run, [json.loads(line) for line in watcher.alert_lines], shippers, judged_all)


def _wait_until_judged(watcher: Watchers, shipped: int) -> bool:
    """Wait until the job has read all ``shipped`` records and its counters
    stood still past two idle flushes (what waited is judged): True; False if
    the time ran out first."""
    deadline = time.monotonic() + LIVE_TIMEOUT_SECONDS
    last: tuple[int, ...] | None = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        counters = watcher.counters()
        now = None if counters is None else (counters.read, counters.judged, sum(counters.alerts.values()))
        if now != last:
            last, since = now, time.monotonic()
        elif (
            counters is not None
            and counters.read >= shipped
            and time.monotonic() - since > 2 * IDLE_FLUSH_MS / 1000
        ):
            return True
        time.sleep(2)
    return False


def check_live(live: Live, judged: Judged) -> list[str]:
    """The job's alerts must be replay's, id for id, from shippers that read every file to its end."""
    problems = [
        f"{name} did not finish its file: {line}"
        for name, line in live.shippers.items()
        if "lag 0 bytes" not in line and "request-log" in name
    ]
    if not live.judged_all:
        problems.append(f"the job did not judge every record shipped within {LIVE_TIMEOUT_SECONDS:.0f} s")
    live_ids = sorted(a["alert_id"] for a in live.alerts)
    replay_ids = sorted(a["alert_id"] for a in judged.alerts)
    same = "the same ids as replay's" if live_ids == replay_ids else "not replay's ids"
    print(f"  live (ship + run): {len(live.alerts)} alerts, {same}")
    if live_ids != replay_ids:
        problems.append(f"the job raised {live_ids}, replay {replay_ids}")
    return problems


def check(run: FencedFollowerRun, judged: Judged, buggy: bool) -> list[str]:
    """What is wrong with this run's outcome, if anything."""
    problems = []
    if judged.dead_letters:
        problems.append(f"{judged.dead_letters} dead letters from Kafka's own files")
    alerted = {a["partition"] for a in judged.alerts}
    if buggy:
        if not run.isr_with_fenced:
            problems.append(
                f"Kafka {run.version} never showed broker {run.cut_broker} in an ISR while fenced"
            )
        others = [a for a in judged.alerts if a["rule"] != RULE or a["node"] != run.cut_broker]
        if others:
            problems.append(f"alerts other than {RULE} for broker {run.cut_broker}: {others}")
        if alerted != set(run.isr_with_fenced):
            problems.append(
                f"fencewatch alerted partitions {sorted(alerted)}, Kafka admitted the fenced broker to "
                f"{sorted(run.isr_with_fenced)}"
            )
    else:
        if run.isr_with_fenced:
            problems.append(f"Kafka {run.version} admitted the fenced broker: {run.isr_with_fenced}")
        if judged.alerts:
            problems.append(f"{len(judged.alerts)} alerts on a version that fences correctly")
    return problems


def print_run(run: FencedFollowerRun, judged: Judged, seconds: float) -> None:
    def at(ms: int) -> str:
        return f"+{(ms - run.cut_started_ms) / 1000:.1f} s"

    print(f"== Kafka {run.version}, seed {run.seed}: {seconds:.0f} s")
    print(
        f"  broker {run.cut_broker}'s heartbeats dropped from +0.0 s ({run.heartbeats_dropped} dropped); "
        f"fenced by {at(run.fenced_seen_ms)}, unfenced by {at(run.unfenced_seen_ms)}; "
        f"{run.records_produced} records produced (acks=all)"
    )
    seen = ", ".join(f"{p}: {isr}" for p, isr in sorted(run.isr_with_fenced.items())) or "none"
    print(f"  ISRs holding broker {run.cut_broker} while it was fenced (Kafka's metadata): {seen}")
    print("  Kafka's metadata log (its DumpLogSegments --cluster-metadata-decoder):")
    for line in broker_state_and_isr_records(run):
        print(f"    {_short_dump_line(line)}")
    print("  the controller's AlterPartition answers (its kafka.request.logger):")
    for line in alter_partition_lines(run):
        print(f"    {_short_request_line(line)}")
    print(f"  fencewatch: {len(judged.alerts)} alerts, {judged.dead_letters} dead letters")
    for alert in judged.alerts:
        where = f"{alert['topic']}-{alert['partition']} node {alert['node']}"
        print(f"    {alert['rule']} {where}: {alert['message']}")
        for item in alert["evidence"]:
            print(f"      {item['role']}: metadata offset {item['offset']}: {item['summary']}")


def _short_request_line(line: str) -> str:
    """A request-log entry of an AlterPartition as its time, request and answer per partition."""
    stamp = line[: line.index("]") + 1]
    body = json.loads(line[line.index(MARKER) + len(MARKER) : line.rindex(" (kafka.request.logger)")])
    request, response = body["request"], body["response"]
    answers = {
        (t.get("name") or t.get("topicId"), p["partitionIndex"]): p
        for t in response["topics"]
        for p in t["partitions"]
    }
    parts = []
    for topic in request["topics"]:
        name = topic.get("name") or topic.get("topicId")
        for p in topic["partitions"]:
            answer = answers.get((name, p["partitionIndex"]), {})
            asked = f"leaderEpoch {p['leaderEpoch']} partitionEpoch {p['partitionEpoch']}"
            isr = p.get("newIsr") or p.get("newIsrWithEpochs")
            got = f"errorCode {answer.get('errorCode')} isr {answer.get('isr')}"
            got += f" partitionEpoch {answer.get('partitionEpoch')}"
            parts.append(f"{name}-{p['partitionIndex']} {asked} newIsr {isr} -> {got}")
    version = body["requestHeader"]["requestApiVersion"]
    return f"{stamp} AlterPartition v{version} from broker {request['brokerId']}: {'; '.join(parts)}"


def _short_dump_line(line: str) -> str:
    """``offset: N CreateTime: T ... payload: {json}`` as ``offset N at T: type data``."""
    head, _, payload = line.partition("payload: ")
    fields = head.split()
    offset = fields[fields.index("offset:") + 1] if "offset:" in fields else "?"
    created = fields[fields.index("CreateTime:") + 1] if "CreateTime:" in fields else "?"
    record = json.loads(payload)
    data = json.dumps(record["data"])
    return f"offset {offset} CreateTime {created}: {record['type']} v{record['version']} {data}"


if __name__ == "__main__":
    sys.exit(main())

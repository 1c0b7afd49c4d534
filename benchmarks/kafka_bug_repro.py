"""A real Kafka bug caught: KAFKA-13916 (a fenced replica admitted to the ISR)
on Apache Kafka 3.2.3, and the same scenario on 3.3.2, where KIP-841 fixed it.

    .venv/bin/python benchmarks/kafka_bug_repro.py --seed 1
    .venv/bin/python benchmarks/kafka_bug_repro.py --seed 7 --fixed 4.4.0 --keep /tmp/kafka-13916

For each version: the scenario of localkafka.fenced_follower (one controller,
three brokers; the seed's broker has its heartbeats dropped until the
controller fences it, while it keeps replicating, then gets them back), then
fencewatch on Kafka's own files, as a user runs it (``fencewatch convert`` of
every request log and of the controller's metadata log, ``fencewatch
replay``). Prints, side by side, what fencewatch raised (rule, partition,
node, evidence) and Kafka's own records of the run: the brokers' fencing and
the partition changes from the metadata log as Kafka's DumpLogSegments prints
them, the AlterPartition answers from the controller's request log, and the
ISRs Kafka's metadata described while the broker was fenced. Exits 1 unless
the buggy version shows the bug and fencewatch raises
ISR_INELIGIBLE_REPLICA_ADMITTED on exactly the partitions Kafka admitted the
fenced broker to, naming that broker, and nothing else; and the fixed version
shows neither. Each version takes about one to two minutes on two cores
(Kafka's jars are fetched from Maven Central on first use).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fencewatch_on_kafka import Judged, alter_partition_lines, broker_state_and_isr_records, judge

from localkafka.fenced_follower import FencedFollowerRun, run_fenced_follower
from localkafka.fetch import fetch_kafka

RULE = "ISR_INELIGIBLE_REPLICA_ADMITTED"
MARKER = "Completed request:"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="picks the broker cut off and the traffic")
    parser.add_argument("--buggy", default="3.2.3", help="a Kafka version with KAFKA-13916")
    parser.add_argument("--fixed", default="3.3.2", help="a Kafka version with KIP-841's fix")
    parser.add_argument("--keep", type=Path, help="keep the clusters' files here (default: deleted)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    root = args.keep or Path(tempfile.mkdtemp(prefix="kafka-13916-"))
    ok = True
    try:
        for version, buggy in ((args.buggy, True), (args.fixed, False)):
            started = time.monotonic()
            run = run_fenced_follower(fetch_kafka(version, progress=print), root / version, seed=args.seed)
            judged = judge(run, root / version / "fencewatch")
            print_run(run, judged, time.monotonic() - started)
            problems = check(run, judged, buggy)
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

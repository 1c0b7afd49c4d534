"""The detector: envelopes in, alerts out. The same object runs under
``fencewatch replay`` and inside the streaming job's stateful operator, so both
raise the same alerts from the same events.

Metadata, quorum and remote-log records update the view as they arrive (each
comes from one ordered source). Judgments of request outcomes wait, per
cluster, until the event-time watermark (newest ``ts_ms`` minus
``lateness_ms``) has passed ``ts_ms + grace_ms``: then every event that can
change the verdict is in, whatever order the sources arrived in.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from detectors import rules
from detectors.alerts import Alert, Evidence
from detectors.cluster import ClusterState, Counters
from detectors.config import DetectorConfig
from detectors.envelope import BadRecord, DeadLetter, Envelope, Unverified
from detectors.fields import INT16, get_int, get_obj
from detectors.history import History
from detectors.requests import (
    ALTER_PARTITION,
    API_NAMES,
    BEGIN_QUORUM_EPOCH,
    END_QUORUM_EPOCH,
    FETCH,
    LEADER_AND_ISR,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    STOP_REPLICA,
    VOTE,
    Header,
    alter_partition,
    header,
    is_quorum_fetch,
    leader_and_isr,
    partition_outcomes,
    stop_replica,
)
from detectors.rules.base import Deferred
from detectors.stats import cluster_snapshot
from detectors.view import PartitionState, own_topic_key

Judgment = Callable[[], None]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _without_body(env: Envelope) -> Envelope:
    # Spelled out: dataclasses.replace costs several times more on this hot path.
    return Envelope(env.cluster, env.node, env.ts_ms, env.kind, env.offset, {}, env.position, env.seq)


# The events counter's key per request API, made once instead of per event.
_REQUEST_EVENT_KEYS = {api_key: f"request:{name}" for api_key, name in API_NAMES.items()}


class _Cluster(ClusterState):
    """A cluster's state plus its own watermark and pending judgments."""

    def __init__(self, *args: object, **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.max_ts_ms: int | None = None
        self.pending: list[tuple[int, int, int, Judgment]] = []
        self.expired_at_ms = 0

    @property
    def watermark_ms(self) -> int | None:
        return None if self.max_ts_ms is None else self.max_ts_ms - self.config.lateness_ms


class Detector:
    """Feed envelopes with :meth:`ingest`; collect alerts with :meth:`drain`;
    call :meth:`flush` at the end of a finite input to judge what is pending."""

    def __init__(self, config: DetectorConfig | None = None, now_ms: Callable[[], int] = wall_clock_ms):
        self.config = config or DetectorConfig()
        self.now_ms = now_ms
        self.counters = Counters()
        self.clusters: dict[str, _Cluster] = {}
        self._arrivals = 0

    def cluster(self, name: str) -> _Cluster:
        cs = self.clusters.get(name)
        if cs is None:
            cs = self.clusters[name] = _Cluster(name, self.config, self.counters, self.now_ms)
        return cs

    def ingest(self, env: Envelope) -> DeadLetter | None:
        """Take one event. Returns a dead letter if its body cannot be used."""
        cs = self.cluster(env.cluster)
        if cs.max_ts_ms is not None and env.ts_ms < cs.max_ts_ms - self.config.lateness_ms:
            self.counters.late += 1
        try:
            judgments = self._dispatch(cs, env)
        except BadRecord as exc:
            self.counters.bump(self.counters.events, "dead_letter")
            letter = exc.dead_letter(env.position)
            self.dead_letter(letter)
            return letter
        except Unverified as exc:
            cs.unverified(exc.reason)
            judgments = []
        if judgments:
            self._schedule(cs, env, judgments)
        if cs.max_ts_ms is None or env.ts_ms > cs.max_ts_ms:
            cs.max_ts_ms = env.ts_ms
            self._judge_due(cs, cs.watermark_ms)
        elif judgments and env.ts_ms + self.config.grace_ms <= (cs.watermark_ms or 0):
            self._judge_due(cs, cs.watermark_ms)  # a late event's window is complete already
        return None

    def _schedule(self, cs: _Cluster, env: Envelope, judgments: list[Deferred]) -> None:
        """Queue each judgment until the watermark passes ``ts_ms + grace_ms``,
        bound to the event without its body (see rules.base.Deferred)."""
        due = env.ts_ms + self.config.grace_ms
        lean = _without_body(env)
        for judge, facts in judgments:
            self._arrivals += 1
            judgment: Judgment = partial(judge, cs, lean, *facts)
            heapq.heappush(cs.pending, (due, env.ts_ms, self._arrivals, judgment))

    def dead_letter(self, letter: DeadLetter) -> None:
        """Count a record that could not be used, by its class."""
        # The plain string: counters are pickled with the detector and exported as labels.
        self.counters.bump(self.counters.dead_letters, letter.kind.value)

    def snapshot(self, cluster: str) -> dict[str, Any]:
        """Counters and state sizes of one cluster (see detectors.stats)."""
        return cluster_snapshot(self.cluster(cluster))

    def drain(self) -> list[Alert]:
        """Alerts raised since the last call, in the order they were raised."""
        out: list[Alert] = []
        for cs in self.clusters.values():
            if cs.out:
                out.extend(cs.out)
                cs.out.clear()
        return out

    def flush(self) -> None:
        """End of input: judge everything still waiting for its grace window."""
        for cs in self.clusters.values():
            self._judge_due(cs, None)

    def pending_count(self) -> int:
        return sum(len(cs.pending) for cs in self.clusters.values())

    def _judge_due(self, cs: _Cluster, watermark_ms: int | None) -> None:
        pending = cs.pending
        while pending and (watermark_ms is None or pending[0][0] <= watermark_ms):
            _, _, _, judgment = heapq.heappop(pending)
            try:
                judgment()
            except Unverified as exc:
                cs.unverified(exc.reason)
        if watermark_ms is not None and watermark_ms - cs.expired_at_ms > self.config.retention_ms:
            cs.expired_at_ms = watermark_ms
            cs.view.expire(watermark_ms)
            cs.quorum.prune(watermark_ms - self.config.retention_ms - 2 * self.config.quorum_fetch_timeout_ms)

    # ---- per-kind handling -----------------------------------------------------------

    def _dispatch(self, cs: _Cluster, env: Envelope) -> list[Deferred]:
        kind = env.kind
        if kind == "metadata":
            self.counters.bump(self.counters.events, "metadata")
            last = cs.view.last_metadata_offset
            if env.offset is not None:
                if last is not None and env.offset <= last:
                    self.counters.duplicates += (
                        1  # re-shipped or dumped twice: applying it again would corrupt epochs
                    )
                    return []
                cs.view.last_metadata_offset = env.offset
            change = cs.view.apply(env)
            if change is not None:
                rules.isr.judge_change(cs, change)
            return []
        if kind == "request":
            return self._request(cs, env)
        if kind == "quorum_state":
            self.counters.bump(self.counters.events, "quorum_state")
            return rules.quorum.ingest_state(cs, env)
        self.counters.bump(self.counters.events, "remote_log_metadata")
        return rules.remote.ingest(cs, env)

    def _request(self, cs: _Cluster, env: Envelope) -> list[Deferred]:
        h = header(env.body)
        self.counters.bump(self.counters.events, _REQUEST_EVENT_KEYS.get(h.api_key, "request:unchecked"))
        body = env.body
        if h.api_key == PRODUCE:
            acks = get_int(get_obj(body, "request", "body"), "acks", "body.request", bounds=INT16)
            return [(rules.produce.judge, (h, acks, partition_outcomes(PRODUCE, body)))]
        if h.api_key == FETCH and is_quorum_fetch(body):
            return rules.quorum.ingest_request(cs, env, h)
        if h.api_key in (FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH):
            outcomes = rules.fetch.judged(partition_outcomes(h.api_key, body))
            return [(rules.fetch.judge, (h, outcomes))] if outcomes else []
        if h.api_key == STOP_REPLICA:
            request = stop_replica(h.api_version, body)
            if request.error == 0:
                self._accepted_controller_epoch(cs, env, request.controller_epoch)
            return [(rules.stop_replica.judge, (h, request))]
        if h.api_key == LEADER_AND_ISR:
            self._leader_and_isr(cs, env, h)
            return []
        if h.api_key == ALTER_PARTITION:
            return [(rules.alter_partition.judge, (h, alter_partition(body)))]
        if h.api_key in (VOTE, BEGIN_QUORUM_EPOCH, END_QUORUM_EPOCH):
            return rules.quorum.ingest_request(cs, env, h)
        return []

    def _accepted_controller_epoch(self, cs: _Cluster, env: Envelope, epoch: int) -> None:
        node = env.node
        assert node is not None
        history = cs.controller_epochs.get(node)
        summary = f"broker {node} accepted controller epoch {epoch}"
        if history is None:
            cs.controller_epochs[node] = History(env.ts_ms, (epoch, Evidence.of("view", env, summary)))
        elif epoch > history.latest[0]:
            history.prune(env.ts_ms - self.config.retention_ms)
            history.append(env.ts_ms, (epoch, Evidence.of("view", env, summary)))

    def _leader_and_isr(self, cs: _Cluster, env: Envelope, h: Header) -> None:
        """ZooKeeper mode: an accepted LeaderAndIsr is the epoch source where no
        metadata log is shipped."""
        controller_epoch, error, partitions = leader_and_isr(env.body)
        if error != 0:
            return
        self._accepted_controller_epoch(cs, env, controller_epoch)
        if cs.view.last_metadata_offset is not None:
            return  # the metadata log is authoritative
        for p in partitions:
            if p.error != 0:
                continue
            key = own_topic_key(p.topic, p.topic_id)
            state = PartitionState(
                leader=p.leader,
                leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch,
                isr=p.isr,
                replicas=p.replicas,
                elr=(),
                source=Evidence.of(
                    "view", env, f"LeaderAndIsr {p.topic}-{p.partition} epoch {p.leader_epoch}"
                ),
            )
            cs.view.set_partition_from_request((key, p.partition), p.topic, env.ts_ms, state)

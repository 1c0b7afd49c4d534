"""``fencewatch simulate``: a deterministic (seeded) KRaft cluster that emits
envelope events in Kafka's native shapes, injects faults at chosen rates, and
writes the ground truth of what it injected.

With ``native_forms`` its quorum states and remote log metadata take the path
a real cluster's take: each is rendered as the quorum-state file or formatter
line Kafka writes, and read back with fencewatch's parsers
(producers.native_forms); the events are then what ``fencewatch ship``
publishes. The native segment line has no cleaner offsets; a zombie upload
is caught there from its ``segmentLeaderEpochs`` and ``endOffset`` alone.

Clocks: every node's clock runs off true time by a fixed base skew within
``skew_ms``; ``clocks`` breaks chosen nodes' clocks further (offsets, steps,
drift: producers.sim_clocks), and ``failovers`` forces Raft elections, which
hand the metadata log's clock (CreateTime: the active controller's) to another
controller; a failover's ``silence_ms`` leaves the metadata log silent that
long from its time (no records, no NoOps: the voters wait out the lost
leader, ``controller.quorum.fetch.timeout.ms``) and elects at its end, while
whatever needs the controller (``sim_traffic.CONTROLLER_ACTIONS``,
``sim_faults.CONTROLLER_RULES``) waits and the brokers keep serving.
``Simulator.clock_offset_ms`` and ``clock_record`` are the clock ground truth;
the truth records carry both a violation's ``ts_ms`` (its writer's clock) and
its ``true_ms``."""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from producers import shapes
from producers.native_forms import NATIVE_KINDS, NativeRoute
from producers.sim_clocks import ClockFault, Clocks, Failover
from producers.sim_faults import CONTROLLER_RULES, Faults
from producers.sim_model import CONTROLLER_IDS, HANDLING_MS, ClusterModel
from producers.sim_traffic import CONTROLLER_ACTIONS, Traffic

# A weight per legitimate action; roughly how often it happens per simulated step.
ACTION_WEIGHTS = {
    "produce": 45.0,
    "consumer_fetch": 25.0,
    "follower_fetch": 8.0,
    "quorum_fetch": 8.0,
    "list_offsets": 3.0,
    "upload": 2.0,
    "isr_expand": 1.5,
    "isr_shrink": 1.2,
    "retention": 0.8,
    "elect_leader": 0.6,
    "produce_unknown_topic": 0.2,
    "stale_alter_partition_rejected": 0.2,
    "failed_upload": 0.2,
    "unfence": 0.12,
    "fence": 0.08,
    "reassign": 0.08,
    "controlled_restart": 0.04,
    "create_topic": 0.02,
    "delete_topic": 0.015,
    "raft_election": 0.002,
}


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. Times are milliseconds of simulated time."""

    seed: int = 1
    cluster: str = "sim-1"
    brokers: int = 6
    topics: int = 6
    partitions_per_topic: int = 8
    fault_rate: float = 0.0005  # chance per simulated action that a fault is injected
    faults: tuple[str, ...] = ()  # rule ids to inject; empty: every rule
    grace_ms: int = 2000  # the detector's grace window the faults must stay clear of
    clock_slack_ms: int = 1000  # the detector's clock slack (DetectorConfig.clock_slack_ms), likewise
    # KRaft's metadata.max.idle.interval.ms (KIP-835, Kafka 3.3+): a NoOp record
    # this often in the metadata log; 0 writes none, as older Kafka did.
    noop_interval_ms: int = 500
    # Request lines stamped when the response completes (producers.sim_model.stamped_at);
    # False stamps them at arrival, as histories simulated before 2026-11-27 were.
    stamp_requests_at_completion: bool = True
    # Each election's LeaderChange record, which Kafka's new quorum leader writes
    # first in its epoch; False writes none, as histories simulated before
    # 2026-11-27 11:00 have (the upgrade tests' checkpoints).
    leader_change_records: bool = True
    skew_ms: int = 200  # each node's clock is off by up to this much
    metadata_version: int = 21  # KRaft feature level; below 12 ISR shrinks bump the leader epoch
    events_per_second: int = 2000  # simulated traffic rate
    start_ms: int = 1_763_720_000_000
    warmup_ms: int = 10_000  # no faults before the cluster has settled
    native_forms: bool = False  # quorum and remote-segment events through Kafka's forms and the parsers
    # Clock faults on top of the base skew (producers.sim_clocks), beyond the
    # skew limit on purpose: the detector is not expected to stay exact.
    clocks: tuple[ClockFault, ...] = ()
    failovers: tuple[Failover, ...] = ()  # forced Raft elections
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Only the base skew is held to the grace window; clock faults are not.
        if self.skew_ms * 4 > self.grace_ms:
            raise ValueError(
                "skew_ms must be at most a quarter of grace_ms, or legitimate lag looks like a fault"
            )
        if not 0 <= self.fault_rate <= 1:
            raise ValueError("fault_rate is a probability between 0 and 1")
        if self.brokers < 4:
            raise ValueError("simulate at least 4 brokers (3 stay active while one is fenced)")
        nodes = f"brokers 1..{self.brokers}, controllers {CONTROLLER_IDS[0]}-{CONTROLLER_IDS[-1]}"
        for fault in self.clocks:
            if not (1 <= fault.node <= self.brokers or fault.node in CONTROLLER_IDS):
                raise ValueError(
                    f"clock fault {fault.node}={fault.spec}: there is no node {fault.node} "
                    f"-- name one of {nodes}"
                )
        times = [f.at_ms for f in self.failovers]
        if any(t <= 0 for t in times) or len(set(times)) < len(times):
            raise ValueError(
                f"forced failovers at {sorted(times)} ms -- give each failover its own time after the start"
            )
        for failover in self.failovers:
            if failover.silence_ms < 0:
                raise ValueError(
                    f"failover at {failover.at_ms} ms: silence of {failover.silence_ms} ms "
                    "-- give a silence of 0 ms or more"
                )
        for failover, after in pairwise(sorted(self.failovers, key=lambda f: f.at_ms)):
            if after.at_ms <= failover.at_ms + failover.silence_ms:
                raise ValueError(
                    f"failover at {after.at_ms} ms falls in the {failover.silence_ms} ms silence of the "
                    f"one at {failover.at_ms} ms -- let each silence end before the next failover"
                )
        for failover in self.failovers:
            if failover.to is not None and failover.to not in CONTROLLER_IDS:
                raise ValueError(
                    f"failover to {failover.to}: not a controller "
                    f"-- name one of {', '.join(map(str, CONTROLLER_IDS))}"
                )


class Simulator:
    """``native_dir``: with ``config.native_forms``, also keep the native files
    there (producers.native_forms.NativeRoute)."""

    def __init__(self, config: SimConfig, native_dir: str | None = None):
        self.config = config
        self.rng = random.Random(config.seed)
        self.model = ClusterModel(
            config.cluster,
            self.rng,
            skew_ms=config.skew_ms,
            metadata_version=config.metadata_version,
            clocks=Clocks(config.clocks, config.start_ms),
            handling_ms=HANDLING_MS if config.stamp_requests_at_completion else 0,
        )
        # Forced elections to come, in true-time order: (true time, winner or None, silence).
        self._forced = sorted((config.start_ms + f.at_ms, f.to, f.silence_ms) for f in config.failovers)
        self.model.raft.forced_ms = [at for at, _, _ in self._forced]
        self.traffic = Traffic(self.model, config.grace_ms, config.leader_change_records)
        self.faults = Faults(self.model, self.traffic, config.grace_ms, config.skew_ms, config.clock_slack_ms)
        unknown = set(config.faults) - set(self.faults.injectors)
        if unknown:
            raise ValueError(
                f"no fault injector for {sorted(unknown)}; known: {sorted(self.faults.injectors)}"
            )
        self.enabled = sorted(config.faults or self.faults.injectors)
        self.injected: dict[str, int] = {}
        self._actions = list(ACTION_WEIGHTS)
        self._weights = list(ACTION_WEIGHTS.values())
        self._remote_offset = 0
        if native_dir is not None and not config.native_forms:
            raise ValueError("native_dir keeps native files: it needs native_forms")
        self.native = NativeRoute(config.cluster, native_dir) if config.native_forms else None

    @property
    def truth(self) -> list[dict[str, Any]]:
        """The violations injected so far, as alert-matchable records."""
        return self.faults.truth

    def _setup(self, t: int) -> None:
        m, cfg = self.model, self.config
        m.emit("metadata", t, shapes.feature_level(cfg.metadata_version))
        m.raft.epoch, m.raft.elected_ms = 5, t
        m.raft.history.append((t, m.raft.leader))
        for voter in m.raft.voters:
            m.emit(
                "quorum_state",
                t,
                shapes.quorum_state(m.raft.leader, 5, m.raft.leader, list(m.raft.voters)),
                node=voter,
            )
        for broker in range(1, cfg.brokers + 1):
            m.register(broker, t)
            m.set_fenced(broker, False, t)
        for n in range(cfg.topics):
            m.create_topic(f"topic-{n}", cfg.partitions_per_topic, 3, t)

    def events(self, limit: int) -> Iterator[dict[str, Any]]:
        """About ``limit`` envelopes (every event of a started action is
        emitted), in true-time order; ``ts_ms`` carries each node's clock."""
        for _, env in self.timed_events(limit):
            yield env

    def timed_events(self, limit: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """``events`` with the true time of each: ``(true_ms, envelope)``."""
        cfg, m, rng = self.config, self.model, self.rng
        clock = float(cfg.start_ms)
        t = cfg.start_ms
        mean_step_ms = 1000.0 / cfg.events_per_second
        pending: list[tuple[int, int, dict[str, Any]]] = []
        seq = 0
        emitted = 0
        self._setup(t)
        noop_every = cfg.noop_interval_ms
        next_noop_ms = t + noop_every if noop_every else None
        while True:
            for true_ms, env in m.out:
                heapq.heappush(pending, (true_ms, seq, env))
                seq += 1
            m.out.clear()
            while pending and pending[0][0] <= t:
                true_ms, _, env = heapq.heappop(pending)
                yield true_ms, self._positioned(env)
                emitted += 1
            if emitted + len(pending) >= limit:
                break
            clock += rng.expovariate(1.0 / mean_step_ms)
            t = int(clock)
            while True:
                # Forced elections and NoOps in their time order (an election first
                # at the same moment: the NoOp is then the new leader's).
                election = self._forced[0][0] if self._forced and self._forced[0][0] <= t else None
                noop = next_noop_ms if next_noop_ms is not None and next_noop_ms <= t else None
                if election is not None and (noop is None or election <= noop):
                    # At its own time: every event yielded so far is earlier.
                    at, to, silence = self._forced.pop(0)
                    m.raft.forced_ms.pop(0)
                    if silence > 0:
                        # The leader is lost: the metadata log is silent while the
                        # voters wait out their fetch timeout; then they elect, and
                        # the new leader writes (the next failover comes later).
                        m.raft.silences.append((at, at + silence))
                        self._forced.insert(0, (at + silence, to, -1))
                        m.raft.forced_ms.insert(0, at + silence)
                    else:
                        # silence -1: the election that ends a silence; the lost
                        # leader serves nothing more
                        self.traffic.raft_election(at, candidate=to, old_leader_lost=silence < 0)
                elif noop is not None and m.raft.silent(noop):
                    # No heartbeat while no leader serves: the new leader's first
                    # NoOp comes when the silence ends.
                    next_noop_ms = m.raft.silence_ended_ms(noop)
                elif noop is not None:
                    # KRaft's controller writes a NoOp while nothing else changes
                    # (metadata.max.idle.interval.ms): the metadata log's heartbeat.
                    m.emit("metadata", noop, shapes.no_op())
                    next_noop_ms = noop + noop_every
                else:
                    break
            if t - cfg.start_ms > cfg.warmup_ms and rng.random() < cfg.fault_rate:
                rule = rng.choice(self.enabled)
                if rule in CONTROLLER_RULES and m.raft.silent(t):
                    continue  # no controller to write, log or send it
                if self.faults.injectors[rule](t):
                    self.injected[rule] = self.injected.get(rule, 0) + 1
                continue
            action = rng.choices(self._actions, self._weights)[0]
            if action in CONTROLLER_ACTIONS and m.raft.silent(t):
                # Not done now: there is no controller. The traffic draws such
                # actions at the same rate once the new leader writes.
                continue
            if action == "raft_election" and t < m.raft.frozen_until_ms:
                continue
            getattr(self.traffic, action)(t)
        while pending:
            true_ms, _, env = heapq.heappop(pending)
            yield true_ms, self._positioned(env)

    # ---- the clock ground truth ---------------------------------------------------------------

    @property
    def leader_history(self) -> list[tuple[int, int]]:
        """``(true_ms, leader)`` of the first quorum leader and of every
        election so far: whose clock stamped the metadata log from when."""
        return list(self.model.raft.history)

    def metadata_clock_node(self, true_ms: int) -> int:
        """The active controller at true time ``true_ms``, whose clock stamps
        the metadata log's records (as far as the run has got)."""
        return self.model.metadata_clock_node(true_ms)

    def node_clock_ms(self, node: int, true_ms: int) -> int:
        """What ``node``'s clock reads at true time ``true_ms``: true time,
        its base skew and its clock faults. ValueError for a node that has
        written nothing yet (its base skew is drawn when it first writes)."""
        return self.model.clock_ms(node, true_ms)

    def clock_offset_ms(self, node: int, true_ms: int) -> int:
        """``node``'s clock minus the metadata log's clock (the active
        controller's) at true time ``true_ms``: how far ``node``'s ``ts_ms``
        run ahead of the metadata records written at the same moment."""
        return self.node_clock_ms(node, true_ms) - self.node_clock_ms(
            self.metadata_clock_node(true_ms), true_ms
        )

    def clock_record(self) -> dict[str, Any]:
        """The clock ground truth of the run so far, as JSON
        (``fencewatch simulate -o FILE`` writes it to ``FILE.clocks.json``):

        - ``start_ms``: true time at the start; steps and drifts count from it;
        - ``skew_ms``: the bound of the base skews;
        - ``nodes``: per node that wrote anything or has clock faults,
          ``base_skew_ms`` (null if it never wrote) and its clock ``faults``
          (``offset``: ``offset_ms``; ``step``: ``offset_ms`` from ``at_ms``
          after the start; ``drift``: ``ppm`` microseconds per
          second, whole milliseconds rounded toward zero), each with its ``spec``;
        - ``raft_leaders``: ``[true_ms, leader]`` per election, first leader
          first: the metadata log is stamped by the last one at or before a time.

        A node's clock at true time T reads T + base_skew_ms + its faults' offsets."""
        m = self.model
        return {
            "start_ms": self.config.start_ms,
            "skew_ms": self.config.skew_ms,
            "nodes": [
                {
                    "node": node,
                    "base_skew_ms": m.clock_skew.get(node),
                    "faults": [f.to_json() for f in m.clocks.of(node)],
                }
                for node in sorted(m.clock_skew.keys() | {f.node for f in m.clocks.faults})
            ],
            "raft_leaders": [[at, leader] for at, leader in m.raft.history],
        }

    def _positioned(self, env: dict[str, Any]) -> dict[str, Any]:
        """Remote log metadata gets its offset in the ``__remote_log_metadata``
        topic, which records it in the order the brokers wrote it (true time),
        whatever their clocks say; a shipper following that topic knows it.
        In native forms it is, like a quorum state, what the parser reads from
        Kafka's form instead: no offset (the formatter's cannot be used)."""
        if self.native is not None and env["kind"] in NATIVE_KINDS:
            return self.native.envelope(env)
        if env["kind"] == "remote_log_metadata":
            env["offset"] = self._remote_offset
            self._remote_offset += 1
        return env

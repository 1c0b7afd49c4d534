"""The authoritative cluster view, replayed from KRaft metadata records exactly
as Kafka computes it (SPEC 1.3): brokers, topics and partitions, each kept as a
short event-time history so rules can judge any moment of a grace window."""

from __future__ import annotations

from collections import deque
from collections.abc import MutableMapping
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

from detectors.alerts import Evidence
from detectors.envelope import BadRecord, DeadLetterClass, Envelope, Unverified
from detectors.fast_init import fast_init
from detectors.fields import INT64, get_bool, get_int, get_list, get_str, int_list
from detectors.history import History
from detectors.metadata_configs import BROKER, CLUSTER_DEFAULT, READ_CONFIGS, TOPIC
from detectors.pickling import fast_pickle
from detectors.stats import UnverifiedReason

NO_LEADER = -1
NO_LEADER_CHANGE = -2
# MetadataVersion 3.6-IV0 (feature level 12) stopped bumping the leader epoch
# when the controller shrinks the ISR (KAFKA-15021).
MV_3_6_IV0 = 12
# The highest offset a log read from its beginning can start at: offset 0 holds
# the first leader's LeaderChange control record (KafkaRaftClient appends one on
# becoming leader), offset 1 the first metadata record after it (the bootstrap
# records of ActivationRecordsGenerator). A view whose first record is further
# on started mid-log; a snapshot's records carry no offset and state everything.
LOG_START_MAX_OFFSET = 1

PartitionKey = tuple[str, int]  # (topic id, or "name:<topic>" where no id exists; index)
NULL_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # Kafka's zero UUID: "no topic id" in requests


def own_topic_key(name: str | None, topic_id: str | None) -> str:
    """The key a request's own topic fields give, without the view: its topic id,
    else ``name:<topic>``."""
    return topic_id if topic_id and topic_id != NULL_TOPIC_ID else f"name:{name}"


@fast_pickle
@fast_init
@dataclass(frozen=True, slots=True)
class BrokerState:
    epoch: int
    incarnation: str | None
    fenced: bool
    shutting_down: bool
    registered: bool
    source: Evidence

    def ineligibility(self) -> str | None:
        """Why KIP-841 forbids this broker in the ISR or as leader, or None."""
        if not self.registered:
            return "unregistered"
        if self.fenced:
            return "fenced"
        if self.shutting_down:
            return "in controlled shutdown"
        return None


@fast_pickle
@fast_init
@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    elr: tuple[int, ...]
    source: Evidence


# A partition's history as plain values, for the streaming job's store
# (streaming.state.PartitionStore): pickled as objects, each history looks its
# three classes up and calls a reducer per object, 7.7-12.9 us against 2.3-2.4
# us, and a cluster's snapshot writes one per partition (docs/performance.md, "A
# million partitions' records applied").
_STATE_VALUES = attrgetter(*(f.name for f in fields(PartitionState) if f.name != "source"))
_SOURCE_AT = [f.name for f in fields(PartitionState)].index("source")
_EVIDENCE_VALUES = attrgetter(*(f.name for f in fields(Evidence)))
PlainHistory = tuple[list[int], list[tuple[tuple[Any, ...], tuple[Any, ...]]]]


def plain_history(history: History[PartitionState]) -> PlainHistory:
    """``history`` as plain values (:func:`history_of_plain` takes them back)."""
    times, states = history.items()
    return times, [(_STATE_VALUES(state), _EVIDENCE_VALUES(state.source)) for state in states]


def history_of_plain(plain: PlainHistory) -> History[PartitionState]:
    """The history :func:`plain_history` gave ``plain`` of. Values of fields
    added since are absent at the end and take their defaults, as
    detectors.pickling's reducers do."""
    times, states = plain
    at = _SOURCE_AT
    return History.of(
        times,
        [
            PartitionState(*values[:at], Evidence(*evidence), *values[at:])  # type: ignore[call-arg]
            for values, evidence in states
        ],
    )


@fast_pickle
@fast_init
@dataclass(frozen=True, slots=True)
class PartitionChange:
    """What one PARTITION_RECORD or PARTITION_CHANGE_RECORD did."""

    key: PartitionKey
    before: PartitionState | None
    after: PartitionState
    env: Envelope


@fast_pickle
@dataclass(slots=True)
class Topic:
    name: str
    partition_count: int = 0  # Kafka numbers partitions 0..n-1 and never shrinks n
    deleted_ms: int | None = None
    # Whether this view applied the topic's first record, so that every partition
    # it keeps a history of is below partition_count. A topic of a view pickled by
    # state format 5 or before is not: those reset the count when a snapshot
    # stated the topic again.
    counted: bool = False

    def saw(self, index: int) -> None:
        if index >= self.partition_count:
            self.partition_count = index + 1


class ClusterView:
    """Everything one cluster's metadata log says, with short histories."""

    def __init__(
        self,
        retention_ms: int,
        partitions: MutableMapping[PartitionKey, History[PartitionState]] | None = None,
    ):
        """``partitions`` may be any mapping: the streaming job passes one backed
        by Spark's state store, so a million partitions need not sit in memory."""
        self.retention_ms = retention_ms
        self.brokers: dict[int, History[BrokerState]] = {}
        self.topics: dict[str, Topic] = {}
        # name -> which topic id it named over time (None: no topic); names are reused
        self.topic_ids_by_name: dict[str, History[str | None]] = {}
        self.partitions = partitions if partitions is not None else {}
        self.metadata_version: int | None = None
        self._deletions: deque[tuple[int, str]] = deque()
        # None until the first record is applied; True if that record was past
        # the log's start without a snapshot before it.
        self.started_mid_log: bool | None = None
        # broker -> when the view first heard of it (kept only for a view started
        # mid-log): its state before then is unknown, not absent.
        self.brokers_seen_ms: dict[int, int] = {}
        # (ConfigResource.Type id, resource name) -> config name -> (value, the
        # CONFIG_RECORD that set it), for the names the rules read
        # (detectors.metadata_configs.READ_CONFIGS): a topic's by its name, a
        # node's by its id, the cluster default by "".
        self.configs: dict[tuple[int, str], dict[str, tuple[str, Evidence]]] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A view pickled before mid-log starts were recognised judged as one
        read from the start: it keeps doing so."""
        self.__dict__.update(state)
        self.__dict__.setdefault("started_mid_log", False)
        self.__dict__.setdefault("brokers_seen_ms", {})
        self.__dict__.setdefault("configs", {})

    # ---- lookups used by the rules -------------------------------------------------

    def broker_at(self, broker_id: int, ts_ms: int) -> BrokerState | None:
        history = self.brokers.get(broker_id)
        return history.at(ts_ms) if history else None

    def broker_window(self, broker_id: int, lo_ms: int, hi_ms: int) -> list[BrokerState]:
        history = self.brokers.get(broker_id)
        return history.window(lo_ms, hi_ms) if history else []

    def broker_unseen_at(self, broker_id: int, ts_ms: int) -> bool:
        """Whether the broker's state at ``ts_ms`` is unknown because the view
        started mid-log after it: its registration there was not seen, and a
        state first heard of later (a re-registration, a change record) says
        nothing about the time before it."""
        if not self.started_mid_log:
            return False
        seen_ms = self.brokers_seen_ms.get(broker_id)
        return seen_ms is None or ts_ms < seen_ms

    def resolve_topic(self, name: str | None, topic_id: str | None, ts_ms: int | None = None) -> str | None:
        """The key under which a topic's partitions are kept, or None if unknown.
        A name resolves to the topic it named at ``ts_ms`` (default: now), since
        a deleted topic's name can be reused."""
        if topic_id and topic_id != NULL_TOPIC_ID:
            return topic_id if topic_id in self.topics else None
        if name is None:
            return None
        named = self.topic_ids_by_name.get(name)
        if named is not None:
            return named.latest if ts_ms is None else named.at(ts_ms)
        legacy = own_topic_key(name, None)
        return legacy if legacy in self.topics else None

    def topic_key(self, name: str | None, topic_id: str | None, ts_ms: int) -> str:
        """For naming an alert's partition where the verdict needs no view: the
        topic as the view resolves it at ``ts_ms``, else as the request names it
        (a topic created or re-created within the clock skew resolves to nothing)."""
        return self.resolve_topic(name, topic_id, ts_ms) or own_topic_key(name, topic_id)

    def topic_name(self, key: str | None) -> str | None:
        topic = self.topics.get(key) if key else None
        return topic.name if topic else None

    def partition(self, key: PartitionKey) -> History[PartitionState] | None:
        return self.partitions.get(key)

    def topic_config(self, topic: str, name: str) -> tuple[str, Evidence] | None:
        """The value of the topic configuration ``name`` (one of READ_CONFIGS)
        for the topic named ``topic``, as the active controller resolves it
        from what the log set (KafkaConfigSchema.resolveEffectiveTopicConfig,
        by ConfigurationControlManager.getTopicConfig: the topic's own, then
        the active controller's node setting, then the cluster default), with
        the record that set it. None when the log does not decide it: set
        nowhere (the controllers' server.properties or Kafka's default decide,
        and the log holds neither), or set for some node to other than what
        holds for the rest (only the active controller's own setting counts,
        and the view does not follow which controller is active)."""
        own = self.configs.get((TOPIC, topic), {}).get(name)
        if own is not None:
            return own
        cluster = self.configs.get((BROKER, CLUSTER_DEFAULT), {}).get(name)
        default = cluster[0] if cluster is not None else None
        for (kind, resource), configs in self.configs.items():
            node = configs.get(name)
            if kind == BROKER and resource != CLUSTER_DEFAULT and node is not None and node[0] != default:
                return None
        return cluster

    # ---- applying metadata ----------------------------------------------------------

    def apply(self, env: Envelope) -> PartitionChange | None:
        """Apply one metadata record. Returns the partition change it made, if any.

        Raises BadRecord for records that are not well-formed, and Unverified for
        changes to brokers, topics or partitions never seen (their state cannot
        be derived), so that gap is counted instead of guessed."""
        body = env.body
        record_type = get_str(body, "type", "body")
        data = body.get("data")
        if not isinstance(data, dict):
            raise BadRecord("body.data must be an object", DeadLetterClass.WRONG_TYPE)
        if self.started_mid_log is None:
            self.started_mid_log = env.offset is not None and env.offset > LOG_START_MAX_OFFSET
        handler = _HANDLERS.get(record_type or "")
        if handler is None:
            # Kafka has dozens of record types (configs, ACLs, ...) that carry no fencing state.
            return None
        change: PartitionChange | None = handler(self, env, data)
        return change

    def _set_broker(self, broker_id: int, ts_ms: int, state: BrokerState) -> None:
        history = self.brokers.get(broker_id)
        if history is None:
            self.brokers[broker_id] = History(ts_ms, state)
            if self.started_mid_log:
                self.brokers_seen_ms[broker_id] = ts_ms
        else:
            history.prune(ts_ms - self.retention_ms)
            history.append(ts_ms, state)

    def _register_broker(self, env: Envelope, data: dict[str, Any]) -> None:
        broker_id = get_int(data, "brokerId", "data")
        state = BrokerState(
            epoch=get_int(data, "brokerEpoch", "data", bounds=INT64),
            incarnation=get_str(data, "incarnationId", "data", default=None),
            fenced=get_bool(data, "fenced", "data", default=True),
            shutting_down=get_bool(data, "inControlledShutdown", "data", default=False),
            registered=True,
            source=Evidence.of("view", env, f"broker {broker_id} registered"),
        )
        self._set_broker(broker_id, env.ts_ms, state)

    def _change_broker(self, env: Envelope, data: dict[str, Any]) -> None:
        broker_id = get_int(data, "brokerId", "data")
        epoch = get_int(data, "brokerEpoch", "data", bounds=INT64)
        fenced = get_int(data, "fenced", "data", bounds=(-1, 1), default=0)
        shutdown = get_int(data, "inControlledShutdown", "data", bounds=(0, 1), default=0)
        self._update_broker(env, broker_id, epoch, fenced, shutdown == 1)

    def _fence_broker(self, env: Envelope, data: dict[str, Any], fenced: int) -> None:
        broker_id = get_int(data, "id", "data")
        epoch = get_int(data, "epoch", "data", bounds=INT64)
        self._update_broker(env, broker_id, epoch, fenced, False)

    def _update_broker(self, env: Envelope, broker_id: int, epoch: int, fenced: int, shutdown: bool) -> None:
        history = self.brokers.get(broker_id)
        if history is None:
            raise Unverified(UnverifiedReason.BROKER_CHANGE_BEFORE_REGISTRATION)
        old = history.latest
        summary = {1: "fenced", -1: "unfenced", 0: "changed"}[fenced]
        # Built whole rather than with dataclasses.replace, which looks every field up
        # by name: every bucket applies each broker change (detectors.buckets).
        # (tests/unit/test_view.py holds it to replace's result, every field).
        state = BrokerState(
            epoch=epoch,
            incarnation=old.incarnation,
            fenced=old.fenced if fenced == 0 else fenced == 1,
            shutting_down=old.shutting_down or shutdown,
            registered=old.registered,
            source=Evidence.of(
                "view",
                env,
                f"broker {broker_id} {summary}" + (", in controlled shutdown" if shutdown else ""),
            ),
        )
        self._set_broker(broker_id, env.ts_ms, state)

    def _unregister_broker(self, env: Envelope, data: dict[str, Any]) -> None:
        broker_id = get_int(data, "brokerId", "data")
        history = self.brokers.get(broker_id)
        epoch = get_int(data, "brokerEpoch", "data", bounds=INT64, default=-1)
        base = history.latest if history else None
        state = BrokerState(
            epoch=epoch if epoch >= 0 or base is None else base.epoch,
            incarnation=base.incarnation if base else None,
            fenced=True,
            shutting_down=False,
            registered=False,
            source=Evidence.of("view", env, f"broker {broker_id} unregistered"),
        )
        self._set_broker(broker_id, env.ts_ms, state)

    def _topic(self, env: Envelope, data: dict[str, Any]) -> None:
        name = get_str(data, "name", "data")
        topic_id = get_str(data, "topicId", "data")
        assert name is not None and topic_id is not None
        known = self.topics.get(topic_id)
        if known is None:
            self.topics[topic_id] = Topic(name, counted=True)
        else:  # stated again (a snapshot): the partitions seen of it stay seen
            self.topics[topic_id] = Topic(name, known.partition_count, counted=known.counted)
        self._name(name, env.ts_ms, topic_id)

    def _remove_topic(self, env: Envelope, data: dict[str, Any]) -> None:
        topic_id = get_str(data, "topicId", "data")
        assert topic_id is not None
        topic = self.topics.get(topic_id)
        if topic is None:
            raise Unverified(UnverifiedReason.TOPIC_REMOVAL_NOT_SEEN)
        topic.deleted_ms = env.ts_ms
        # Its configs go with it (ConfigurationControlManager.deleteTopicConfigs):
        # a topic created again under its name starts without them.
        self.configs.pop((TOPIC, topic.name), None)
        named = self.topic_ids_by_name.get(topic.name)
        if named is not None and named.latest == topic_id:
            self._name(topic.name, env.ts_ms, None)
        self._deletions.append((env.ts_ms, topic_id))

    def _name(self, name: str, ts_ms: int, topic_id: str | None) -> None:
        named = self.topic_ids_by_name.get(name)
        if named is None:
            self.topic_ids_by_name[name] = History(ts_ms, topic_id)
        else:
            named.prune(ts_ms - self.retention_ms)
            named.append(ts_ms, topic_id)

    def _config(self, env: Envelope, data: dict[str, Any]) -> None:
        """A CONFIG_RECORD: kept if it sets or deletes (value null) a config the
        rules read (ConfigurationControlManager.replay); every other is ignored."""
        name = data.get("name")
        if name not in READ_CONFIGS:
            return
        resource_type = get_int(data, "resourceType", "data", bounds=(-128, 127))
        if resource_type not in (TOPIC, BROKER):
            return
        resource = get_str(data, "resourceName", "data")
        assert resource is not None
        value = get_str(data, "value", "data", default=None)
        key = (resource_type, resource)
        configs = self.configs.setdefault(key, {})
        if value is None:
            configs.pop(name, None)
            if not configs:
                del self.configs[key]
        else:
            what = f"topic {resource}" if resource_type == TOPIC else f"node {resource}"
            if key == (BROKER, CLUSTER_DEFAULT):
                what = "cluster default"
            configs[name] = (value, Evidence.of("view", env, f"{what} config {name}={value}"))

    def _feature_level(self, env: Envelope, data: dict[str, Any]) -> None:
        if get_str(data, "name", "data") == "metadata.version":
            self.metadata_version = get_int(data, "featureLevel", "data", bounds=(0, 2**15 - 1))

    def _partition_record(self, env: Envelope, data: dict[str, Any]) -> PartitionChange:
        key, topic = self._topic_partition(data)
        seen = topic.partition_count
        topic.saw(key[1])
        history: History[PartitionState] | None
        if key[1] < seen or not topic.counted:
            history = self.partitions.get(key)
        else:
            # Past every index of the topic seen so far: no history here or beyond
            # it. A store that reads histories on demand learns that it need not
            # look (streaming.state.PartitionStore.none_stored_from): a snapshot's
            # new topics would cost a read per group of their partitions.
            history = None
            tell = getattr(self.partitions, "none_stored_from", None)
            if tell is not None:
                tell(key[0], seen)
        leader = get_int(data, "leader", "data")
        leader_epoch = get_int(data, "leaderEpoch", "data")
        partition_epoch = get_int(data, "partitionEpoch", "data")
        isr = get_list(data, "isr", "data")
        replicas = get_list(data, "replicas", "data")
        after = PartitionState(
            leader=leader,
            leader_epoch=leader_epoch,
            partition_epoch=partition_epoch,
            isr=int_list(isr, "data.isr"),
            replicas=int_list(replicas, "data.replicas"),
            elr=int_list(
                get_list(data, "eligibleLeaderReplicas", "data", default=[]),
                "data.eligibleLeaderReplicas",
            ),
            # _describe's text, written out: all five fields are required and
            # checked, and a snapshot of a million partitions builds a million.
            source=Evidence.of(
                "view",
                env,
                f"partition created {key[0]}-{key[1]} {{'leader': {leader}, 'leaderEpoch': {leader_epoch}, "
                f"'partitionEpoch': {partition_epoch}, 'isr': {isr!r}, 'replicas': {replicas!r}}}",
            ),
        )
        before = history.latest if history else None
        self._set_partition(key, env.ts_ms, after, history)
        return PartitionChange(key, before, after, env)

    def _partition_change(self, env: Envelope, data: dict[str, Any]) -> PartitionChange:
        key, topic = self._topic_partition(data)
        topic.saw(key[1])
        history = self.partitions.get(key)
        if history is None:
            # Its epochs cannot be derived without the PARTITION_RECORD: start dumps at a snapshot.
            raise Unverified(UnverifiedReason.PARTITION_CHANGE_BEFORE_RECORD)
        before = history.latest
        leader = get_int(data, "leader", "data", default=NO_LEADER_CHANGE)
        isr = data.get("isr")
        replicas = data.get("replicas")
        new_isr = int_list(isr, "data.isr") if isinstance(isr, list) else before.isr
        new_replicas = int_list(replicas, "data.replicas") if isinstance(replicas, list) else before.replicas
        elr = data.get("eligibleLeaderReplicas")
        bump = leader != NO_LEADER_CHANGE
        if not set(new_isr) >= set(before.isr) and (
            self.metadata_version is not None and self.metadata_version < MV_3_6_IV0
        ):
            bump = True  # pre-3.6 controllers bump the leader epoch on every ISR shrink
        if not set(new_replicas) >= set(before.replicas):
            bump = True  # a reassignment that removes replicas fences them with a new epoch
        after = PartitionState(
            leader=before.leader if leader == NO_LEADER_CHANGE else leader,
            leader_epoch=before.leader_epoch + 1 if bump else before.leader_epoch,
            partition_epoch=before.partition_epoch + 1,
            isr=new_isr,
            replicas=new_replicas,
            elr=int_list(elr, "data.eligibleLeaderReplicas") if isinstance(elr, list) else before.elr,
            source=Evidence.of("view", env, _describe("partition changed", data)),
        )
        self._set_partition(key, env.ts_ms, after, history)
        return PartitionChange(key, before, after, env)

    def _topic_partition(self, data: dict[str, Any]) -> tuple[PartitionKey, Topic]:
        topic_id = get_str(data, "topicId", "data")
        index = get_int(data, "partitionId", "data", bounds=(0, 2**31 - 1))
        assert topic_id is not None
        topic = self.topics.get(topic_id)
        if topic is None:
            raise Unverified(UnverifiedReason.PARTITION_BEFORE_TOPIC)
        return (topic_id, index), topic

    def set_partition_from_request(
        self, key: PartitionKey, name: str, ts_ms: int, state: PartitionState
    ) -> None:
        """ZooKeeper mode has no metadata log: an accepted LeaderAndIsr is the
        epoch source. Only newer epochs move the view (requests can be reordered).

        LeaderAndIsr v5+ names a topic by id and by name, and the view keys it by
        id; StopReplica names it by name only, so the name is recorded to resolve
        to that id as a TOPIC_RECORD would. Brokers' logs interleave out of order:
        a request older than the name's latest mapping (a re-created topic's
        previous id, arriving late) must not re-point the name."""
        topic_key, index = key
        topic = self.topics.setdefault(topic_key, Topic(name))
        topic.saw(index)
        if not topic_key.startswith("name:"):
            named = self.topic_ids_by_name.get(name)
            if named is None or (named.latest != topic_key and ts_ms >= named.latest_ts_ms):
                self._name(name, ts_ms, topic_key)
        history = self.partitions.get(key)
        if history is None or state.leader_epoch > history.latest.leader_epoch:
            self._set_partition(key, ts_ms, state, history)

    def _set_partition(
        self, key: PartitionKey, ts_ms: int, state: PartitionState, history: History[PartitionState] | None
    ) -> None:
        """Append ``state`` to ``history``, the partition's (None: it has none yet)."""
        if history is None:
            self.partitions[key] = History(ts_ms, state)
        else:
            history.prune(ts_ms - self.retention_ms)
            history.append(ts_ms, state)

    def expire(self, watermark_ms: int) -> int:
        """Drop deleted topics' state once no judgment can need it. Returns how many
        partitions were dropped."""
        dropped = 0
        while self._deletions and self._deletions[0][0] < watermark_ms - self.retention_ms:
            _, topic_id = self._deletions.popleft()
            topic = self.topics.pop(topic_id, None)
            if topic is None:
                continue
            for index in range(topic.partition_count):
                dropped += self.partitions.pop((topic_id, index), None) is not None
        return dropped


def _describe(what: str, data: dict[str, Any]) -> str:
    shown = {k: data[k] for k in ("leader", "leaderEpoch", "partitionEpoch", "isr", "replicas") if k in data}
    return f"{what} {data.get('topicId')}-{data.get('partitionId')} {shown}"


_HANDLERS = {
    "REGISTER_BROKER_RECORD": ClusterView._register_broker,
    "BROKER_REGISTRATION_CHANGE_RECORD": ClusterView._change_broker,
    "FENCE_BROKER_RECORD": lambda self, env, data: self._fence_broker(env, data, 1),
    "UNFENCE_BROKER_RECORD": lambda self, env, data: self._fence_broker(env, data, -1),
    "UNREGISTER_BROKER_RECORD": ClusterView._unregister_broker,
    "TOPIC_RECORD": ClusterView._topic,
    "REMOVE_TOPIC_RECORD": ClusterView._remove_topic,
    "FEATURE_LEVEL_RECORD": ClusterView._feature_level,
    "CONFIG_RECORD": ClusterView._config,
    "PARTITION_RECORD": ClusterView._partition_record,
    "PARTITION_CHANGE_RECORD": ClusterView._partition_change,
}

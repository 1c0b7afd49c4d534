"""The configurations a CONFIG_RECORD sets that the rules read, and what of
the others an envelope may carry.

A CONFIG_RECORD (``metadata/.../ConfigRecord.json``) sets, or with a null
``value`` deletes, one configuration of one resource: ``resourceType`` is
Kafka's ``ConfigResource.Type`` id (TOPIC 2, BROKER 4; BROKER_LOGGER 8,
CLIENT_METRICS 16 and GROUP 32 carry nothing the rules read), ``resourceName``
the topic's name, a node's id, or ``""`` for the cluster-wide default of every
broker (``ConfigResource.DEFAULT``). The controller replays them
(``ConfigurationControlManager.replay``) and drops a topic's on its
REMOVE_TOPIC_RECORD.

The metadata log holds every dynamic configuration in clear text, passwords
included (the controller's own log line hides them: ``RecordRedactor``,
``KafkaConfigSchema.isSensitive``, which treats a name it does not know as
sensitive). fencewatch knows only the names it reads, so both metadata readers
(the dump's text and the native files) keep the value of those and print every
other config's value, and a SCRAM credential's salt and keys, as Kafka's
``(redacted)``: no secret reaches an envelope or the events topic.
"""

from __future__ import annotations

from typing import Any

TOPIC = 2  # ConfigResource.Type.TOPIC
BROKER = 4  # ConfigResource.Type.BROKER
CLUSTER_DEFAULT = ""  # a BROKER resource named "" (ConfigResource.DEFAULT): every broker's default

UNCLEAN_LEADER_ELECTION_ENABLE = "unclean.leader.election.enable"
MIN_INSYNC_REPLICAS = "min.insync.replicas"
# What the rules read; a topic's setting and the brokers' one have the same
# name (KafkaConfigSchema's log config synonyms).
READ_CONFIGS = frozenset({UNCLEAN_LEADER_ELECTION_ENABLE, MIN_INSYNC_REPLICAS})

REDACTED = "(redacted)"  # RecordRedactor's mark
_SCRAM_SECRETS = ("salt", "storedKey", "serverKey")


def redacted(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (``{"type", "version", "data"}``) with no secret: a
    CONFIG_RECORD's value of a config not in :data:`READ_CONFIGS`, and a
    USER_SCRAM_CREDENTIAL_RECORD's salt and keys, replaced by ``(redacted)``.
    Every other body is returned as it is."""
    kind = body.get("type")
    data = body.get("data")
    if kind == "CONFIG_RECORD" and isinstance(data, dict):
        if data.get("name") in READ_CONFIGS or data.get("value") is None:
            return body
        return {**body, "data": {**data, "value": REDACTED}}
    if kind == "USER_SCRAM_CREDENTIAL_RECORD" and isinstance(data, dict):
        return {**body, "data": {**data, **{key: REDACTED for key in _SCRAM_SECRETS if key in data}}}
    return body


def parse_boolean(value: str) -> bool:
    """Java's ``Boolean.parseBoolean``, as the controller reads the setting
    (``ConfigurationControlManager.uncleanLeaderElectionEnabledForTopic``)."""
    return value.lower() == "true"

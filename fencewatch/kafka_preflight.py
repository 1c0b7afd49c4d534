"""Before a command starts Spark or publishes: can it reach Kafka, and does
the topic exist? A problem ends the command in one line that names the cause
and what to do (``fencewatch.options.fail``), instead of a minute of client
retries and a Spark stack trace. A listener that refuses the client's settings
is named for what it refused: the SASL credentials, a certificate the client
does not trust (ssl.ca.location), or a plaintext client on a TLS listener."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from fencewatch.listener_tls import tls_listener
from fencewatch.options import fail
from producers.client_errors import ClientErrors
from producers.kafka_publisher import parse_config_pairs, with_env_password

CHECK_TIMEOUT_SECONDS = 10.0
# list_topics blocks; in slices this long the client's errors are served between them.
_SLICE_SECONDS = 0.5
SETTINGS_TODO = (
    "fix --kafka-config (librdkafka's setting names: "
    "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)"
)


def kafka_settings(prog: str, pairs: list[str]) -> dict[str, str]:
    """``--kafka-config KEY=VALUE`` pairs as client settings, the SASL password
    from the environment unless given; a malformed pair ends the command."""
    try:
        settings = parse_config_pairs(pairs)
    except ValueError as exc:
        raise SystemExit(f"{prog}: {exc}") from None
    return with_env_password(settings)


def check_kafka(
    prog: str,
    bootstrap_servers: str,
    config: Mapping[str, str],
    topic: str | None,
    *,
    topic_must_exist: bool = True,
    must_reach: bool = True,
    timeout_seconds: float = CHECK_TIMEOUT_SECONDS,
) -> None:
    """Return once a broker of ``bootstrap_servers`` answers a metadata request
    for ``topic`` (None: for none in particular; with ``topic_must_exist``, the
    topic exists); else end the command with one line.

    must_reach: False lets a command go on while no broker answers (a shipper
    waits for its brokers), unless the listener refuses the client's settings:
    credentials, a certificate it does not trust, TLS spoken one side only."""
    errors = ClientErrors()
    settings: dict[str, Any] = {
        **config,
        "bootstrap.servers": bootstrap_servers,
        # A metadata request may create the topic on brokers with
        # auto.create.topics.enable (the tansu broker too): asking must not create it.
        "allow.auto.create.topics": False,
        # A TLS client talking to a plaintext listener hears nothing back; give
        # up on the connection within the check, not after librdkafka's 30 s, but
        # late in it: a TLS and SCRAM exchange with a loaded broker takes seconds.
        "socket.connection.setup.timeout.ms": int(timeout_seconds * 800),
        **errors.callbacks(),
    }
    try:
        admin = AdminClient(settings)
    except KafkaException as exc:
        fail(prog, f"invalid Kafka client setting: {exc.args[0].str()}", SETTINGS_TODO)
    except (ValueError, TypeError) as exc:
        fail(prog, f"invalid Kafka client setting: {exc}", SETTINGS_TODO)
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            metadata = admin.list_topics(topic, timeout=_SLICE_SECONDS)
            break
        except KafkaException:
            admin.poll(0)  # serve error_cb and the log lines
            if _settled(errors) or time.monotonic() >= deadline:
                refused = _refused(bootstrap_servers, config, errors)
                if refused is not None:
                    fail(prog, *refused)
                if not must_reach:
                    return
                _unreachable(prog, bootstrap_servers, errors, timeout_seconds)
    if topic is None:
        return
    found = metadata.topics.get(topic)
    error = None if found is None else found.error
    if found is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        if topic_must_exist:
            fail(
                prog,
                f"topic {topic} does not exist on {bootstrap_servers}",
                f"create it (kafka-topics.sh --bootstrap-server {bootstrap_servers} --create --topic "
                f"{topic}) or check --topic",
            )
        return
    if error is not None:
        fail(
            prog,
            f"cannot use topic {topic} on {bootstrap_servers}: {error.str()}",
            "check the topic's ACLs for this client's principal, or --topic",
        )


def _settled(errors: ClientErrors) -> bool:
    """Whether what the client heard so far decides the check: a refusal, a
    name that does not resolve, or every broker down because it refused the
    connection or closed it at the first request (as a TLS listener does to a
    plaintext client). Anything else may yet change: on a loaded machine a TLS
    and SCRAM exchange can outlast ``socket.connection.setup.timeout.ms``, and
    librdkafka then reports a transport failure in the middle of SASL; its next
    attempt can bring the broker's verdict."""
    if errors.refused or "_SSL" in errors.errors or "_RESOLVE" in errors.errors:
        return True
    cause = errors.cause() or ""
    return errors.brokers_down and ("Connection refused" in cause or "APIVERSION_QUERY" in cause)


def _refused(
    bootstrap_servers: str, config: Mapping[str, str], errors: ClientErrors
) -> tuple[str, str] | None:
    """(what, what to do) when the listener answered and refused the client's
    settings; None when no broker answered at all."""
    cause = errors.cause() or ""
    if errors.refused:
        return (
            f"Kafka at {bootstrap_servers} refused the client: {cause}",
            "check sasl.mechanism and sasl.username (--kafka-config) and the password "
            "(sasl.password, or env FENCEWATCH_KAFKA_SASL_PASSWORD)",
        )
    if "certificate verify failed" in cause:
        return (
            f"Kafka at {bootstrap_servers} presented a certificate the client does not trust: {cause}",
            "set ssl.ca.location (--kafka-config) to the CA that signed the brokers' certificates",
        )
    if "_SSL" in errors.errors or "SSL" in cause:
        return (
            f"TLS with Kafka at {bootstrap_servers} failed: {cause}",
            "check that security.protocol (--kafka-config) matches the broker's listener "
            "(SSL or PLAINTEXT) and that ssl.ca.location names its CA",
        )
    protocol = config.get("security.protocol", "PLAINTEXT").upper()
    if protocol in ("PLAINTEXT", "SASL_PLAINTEXT") and "_RESOLVE" not in errors.errors:
        listener = tls_listener(bootstrap_servers)
        if listener is not None:
            return (
                f"Kafka at {bootstrap_servers} speaks TLS ({listener} completed a TLS handshake), but the "
                f"client connects in plaintext (security.protocol={protocol})",
                "set security.protocol=SASL_SSL or SSL, as the listener expects, and ssl.ca.location to "
                "the CA that signed the brokers' certificates (--kafka-config)",
            )
    return None


def _unreachable(prog: str, bootstrap_servers: str, errors: ClientErrors, timeout_seconds: float) -> NoReturn:
    cause = errors.cause() or f"no answer within {timeout_seconds:g}s"
    if "_RESOLVE" in errors.errors:
        fail(
            prog,
            f"cannot resolve the Kafka host in {bootstrap_servers}: {cause}",
            "check --bootstrap-servers",
        )
    fail(
        prog,
        f"cannot reach Kafka at {bootstrap_servers}: {cause}",
        "check --bootstrap-servers and that the brokers are up; with TLS or SASL, that "
        "security.protocol (--kafka-config) matches the broker's listener",
    )

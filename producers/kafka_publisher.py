"""Publish envelopes to the event topic with confluent-kafka (librdkafka).

Every record is keyed by its envelope's ``cluster``, so one cluster's events
stay in one partition and keep their order there; the value is the envelope as
compact, key-sorted JSON (:func:`detectors.envelope.dumps`). The producer is
idempotent (``enable.idempotence``: librdkafka's retries never duplicate or
reorder a record) and compresses with lz4. Extra librdkafka settings (TLS,
SASL, timeouts) pass through unchanged and win over the defaults.

Nothing is dropped silently: each delivery report is counted as a success or
a failure, a failure is reported with its reason, and :meth:`KafkaPublisher.flush`
raises :class:`DeliveryError` if anything is still undelivered or failed.
Dead letters go to a dead-letter topic when one is configured, else to stderr.

Records are numbered in the order they were handed over (``seq``, from 0).
:attr:`KafkaPublisher.confirmed_below` is the lowest number not yet delivered:
every record before it is safely stored, which is what lets a caller save a
resume position without losing or (beyond the unconfirmed tail) repeating records.

The producer is created on first use (or by :meth:`open`), so ``__init__`` does no I/O.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from detectors.envelope import DeadLetter, Envelope, dumps
from producers.client_errors import ClientErrors

# Env var that may hold the SASL password, so it need not appear on a command line.
SASL_PASSWORD_ENV = "FENCEWATCH_KAFKA_SASL_PASSWORD"

# Defaults a caller's settings may override. murmur2_random places keys like the
# Java client does, so envelopes from Java and Python producers of one cluster
# share a partition.
DEFAULT_PRODUCER_CONFIG: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "partitioner": "murmur2_random",
    "linger.ms": 20,
}

# Substrings of librdkafka property names whose values must never be printed.
_SECRET_HINTS = ("password", "secret", "private", "key.pem", "token", "credentials")
# How long produce() waits for room in librdkafka's full local queue, per try.
_QUEUE_FULL_WAIT_SECONDS = 0.1
_MAX_REMEMBERED_FAILURES = 100


class DeliveryError(RuntimeError):
    """Records were not delivered: they failed, or did not finish within the flush timeout."""


def is_secret(name: str) -> bool:
    """Whether librdkafka property ``name`` holds a secret that must not be printed."""
    lowered = name.lower()
    return any(hint in lowered for hint in _SECRET_HINTS)


def redacted(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every secret value replaced by ``***``, for messages and logs."""
    return {k: ("***" if is_secret(k) else v) for k, v in config.items()}


def parse_config_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["security.protocol=SASL_SSL", ...]`` to a dict; raise ValueError naming a bad pair.

    The value is everything after the first ``=``, so values may contain ``=``.
    """
    config: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            shown = f"{name}=***" if is_secret(name) else pair
            raise ValueError(f"--kafka-config expects KEY=VALUE, got {shown!r}")
        config[name] = value
    return config


def producer_config(
    bootstrap_servers: str,
    extra: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The librdkafka settings: defaults, then ``bootstrap.servers``, then ``extra``.

    ``sasl.password`` comes from ``$FENCEWATCH_KAFKA_SASL_PASSWORD`` when
    ``extra`` does not set it (the environment keeps it out of ``ps`` output).
    """
    config: dict[str, Any] = {**DEFAULT_PRODUCER_CONFIG, "bootstrap.servers": bootstrap_servers}
    config.update(extra or {})
    return with_env_password(config, environ)


def with_env_password(config: dict[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``config`` with ``sasl.password`` from ``$FENCEWATCH_KAFKA_SASL_PASSWORD``
    when it sets none (the environment keeps it out of ``ps`` output)."""
    env = os.environ if environ is None else environ
    if "sasl.password" not in config and env.get(SASL_PASSWORD_ENV):
        config["sasl.password"] = env[SASL_PASSWORD_ENV]
    return config


@dataclass
class PublishStats:
    """Counters of one publisher. ``produced == delivered + failed + in flight``."""

    produced: int = 0  # records handed to librdkafka (envelopes and dead letters)
    delivered: int = 0  # acknowledged by the broker
    failed: int = 0  # delivery reported an error
    envelopes: int = 0  # of produced: envelopes
    dead_letters: int = 0  # dead letters handled: produced to the topic or written to stderr
    failures: list[str] = field(default_factory=list)  # the first reasons, for messages

    @property
    def in_flight(self) -> int:
        return self.produced - self.delivered - self.failed


class KafkaPublisher:
    """Publishes envelopes (and dead letters) to Kafka; a context manager that flushes on exit.

    bootstrap_servers, topic: where envelopes go.
    dead_letter_topic: where dead letters go; None writes them to ``dead_letter_stream``.
    config: extra librdkafka settings (TLS/SASL...), passed through unchanged.
    on_failure: called with a one-line message for each failed delivery, and
        once when librdkafka finds no broker reachable (default: print it to stderr).
    producer_factory: builds the producer from its config (tests inject fakes).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        dead_letter_topic: str | None = None,
        config: Mapping[str, Any] | None = None,
        dead_letter_stream: TextIO | None = None,
        on_failure: Callable[[str], None] | None = None,
        producer_factory: Callable[[dict[str, Any]], Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not topic:
            raise ValueError("a topic name is required")
        self.topic = topic
        self.dead_letter_topic = dead_letter_topic or None
        self._config = producer_config(bootstrap_servers, config, environ)
        self._dead_letter_stream = dead_letter_stream
        self._on_failure = on_failure or _print_failure
        self._producer_factory = producer_factory
        self._producer: Any = None
        # What librdkafka says about the connection, kept for one line instead of
        # its repeated log lines (producers.client_errors).
        self.client_errors = ClientErrors()
        self._said_unreachable = False
        self.stats = PublishStats()
        # seq numbers handed over but not yet delivered, oldest first; delivered
        # ones are removed lazily from the left (see confirmed_below).
        self._pending: deque[int] = deque()
        self._done: set[int] = set()

    @property
    def config(self) -> dict[str, Any]:
        """The librdkafka settings with secrets replaced by ``***``."""
        return redacted(self._config)

    def open(self) -> None:
        """Create the producer now (it is otherwise created on first use).

        Raises ``confluent_kafka.KafkaException`` for invalid settings; does not
        wait for the brokers (librdkafka connects in the background).
        """
        if self._producer is None:
            if self._producer_factory is not None:
                self._producer = self._producer_factory(dict(self._config))
            else:
                from confluent_kafka import Producer

                self._producer = Producer({**self._config, **self.client_errors.callbacks()})

    # -- publishing -------------------------------------------------------

    def publish(self, envelope: Envelope | Mapping[str, Any], label: str = "") -> int:
        """Queue one envelope for the event topic; return its seq number.

        ``label`` names the record in a failure message (default: the
        envelope's ``position``). May block briefly while librdkafka's local
        queue is full; serves delivery reports (``poll(0)``) on every call.
        """
        if isinstance(envelope, Envelope):
            cluster, value = envelope.cluster, dumps(envelope.to_dict()).encode()
            label = label or envelope.position
        else:
            cluster = envelope["cluster"]
            value = orjson.dumps(envelope, option=orjson.OPT_SORT_KEYS)
        seq = self._produce(self.topic, cluster.encode(), value, label)
        self.stats.envelopes += 1
        return seq

    def dead_letter(self, letter: DeadLetter, source: Mapping[str, Any], key: str = "") -> int | None:
        """Publish a dead letter (``{"position", "reason", "raw", "source"}``) to the
        dead-letter topic, keyed by ``key`` (the cluster), or write it as one JSON
        line to stderr when no dead-letter topic is configured.

        Returns the record's seq number, or None when it went to stderr.
        """
        record = {**letter.to_dict(), "source": dict(source)}
        self.stats.dead_letters += 1
        if self.dead_letter_topic is None:
            stream = self._dead_letter_stream or sys.stderr
            stream.write(dumps(record) + "\n")
            stream.flush()
            return None
        value = dumps(record).encode()
        return self._produce(self.dead_letter_topic, key.encode() or None, value, letter.position)

    def _produce(self, topic: str, key: bytes | None, value: bytes, label: str) -> int:
        self.open()
        seq = self.stats.produced

        def on_delivery(err: Any, msg: Any) -> None:
            self._delivered(seq, err, topic, label)

        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                break
            except BufferError:
                # librdkafka's queue is full: serve delivery reports until there is room.
                self._producer.poll(_QUEUE_FULL_WAIT_SECONDS)
        self.stats.produced += 1
        self._pending.append(seq)
        self._producer.poll(0)
        self._say_if_unreachable()
        return seq

    def _say_if_unreachable(self) -> None:
        """Report once that no broker answers (librdkafka retries on its own)."""
        if self.client_errors.brokers_down and not self._said_unreachable:
            self._said_unreachable = True
            self._on_failure(
                f"cannot reach Kafka at {self._config['bootstrap.servers']}: {self.client_errors.cause()}; "
                "records wait in the client's queue while it retries"
            )

    def _delivered(self, seq: int, err: Any, topic: str, label: str) -> None:
        if err is None:
            self.stats.delivered += 1
            self._done.add(seq)
            return
        self.stats.failed += 1
        where = f" ({label})" if label else ""
        message = f"delivery to topic {topic!r} failed{where}: {err.str() if hasattr(err, 'str') else err}"
        if len(self.stats.failures) < _MAX_REMEMBERED_FAILURES:
            self.stats.failures.append(message)
        self._on_failure(message)

    # -- progress ---------------------------------------------------------

    @property
    def confirmed_below(self) -> int:
        """Every record with a seq number below this one was delivered.

        A failed record is never confirmed, so this stops at the first failure.
        """
        pending, done = self._pending, self._done
        while pending and pending[0] in done:
            done.discard(pending.popleft())
        return pending[0] if pending else self.stats.produced

    def poll(self, timeout_seconds: float = 0.0) -> int:
        """Serve delivery reports for up to ``timeout_seconds``; return how many were served.

        Without a producer yet, just waits (so it can serve as a sleep).
        """
        if self._producer is None:
            if timeout_seconds > 0:
                time.sleep(timeout_seconds)
            return 0
        served = int(self._producer.poll(timeout_seconds))
        self._say_if_unreachable()
        return served

    def flush(self, timeout_seconds: float = 30.0) -> None:
        """Wait until every queued record is delivered or failed.

        Raises :class:`DeliveryError` if records remain after ``timeout_seconds``
        or if any delivery failed (with the first reasons).
        """
        remaining = 0 if self._producer is None else int(self._producer.flush(timeout_seconds))
        problems = []
        if remaining:
            cause = self.client_errors.cause()
            why = f" (Kafka at {self._config['bootstrap.servers']}: {cause})" if cause else ""
            problems.append(f"{remaining} record(s) still undelivered after {timeout_seconds:g}s{why}")
        if self.stats.failed:
            first = "; ".join(self.stats.failures[:3])
            problems.append(f"{self.stats.failed} record(s) failed: {first}")
        if problems:
            raise DeliveryError("; ".join(problems))

    def close(self, timeout_seconds: float = 30.0) -> None:
        """Flush (raising :class:`DeliveryError` on failure) and drop the producer."""
        try:
            self.flush(timeout_seconds)
        finally:
            self._producer = None

    def __enter__(self) -> KafkaPublisher:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif self._producer is not None:
            # Already failing: deliver what we can, but do not mask the original error.
            self._producer.flush(5.0)
            self._producer = None


def _print_failure(message: str) -> None:
    print(f"fencewatch: {message}", file=sys.stderr, flush=True)


class TokenBucket:
    """Paces events to ``rate_per_second`` on a wall clock (0: no pacing).

    Up to ``burst`` events may pass at once after a pause (default: 50 ms worth,
    at least 1), so sleeps stay coarse and the long-run rate stays exact even
    when the OS oversleeps. ``clock``/``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        rate_per_second: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        if rate_per_second < 0:
            raise ValueError("rate must be >= 0 events per second (0: as fast as possible)")
        self.rate_per_second = rate_per_second
        self.burst = burst if burst is not None else max(1.0, rate_per_second / 20)
        self._clock = clock
        self._sleep = sleep
        self._tokens = 1.0
        self._last = clock()

    def take(self, count: float = 1.0) -> float:
        """Wait until ``count`` tokens are available and take them; return seconds slept."""
        if self.rate_per_second == 0:
            return 0.0
        if count > self.burst:
            raise ValueError(f"cannot take {count} tokens at once from a bucket of {self.burst}")
        slept = 0.0
        while True:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate_per_second)
            self._last = now
            if self._tokens >= count:
                self._tokens -= count
                return slept
            wait = (count - self._tokens) / self.rate_per_second
            self._sleep(wait)
            slept += wait

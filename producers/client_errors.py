"""What a librdkafka client says about its connection, kept instead of printed.

librdkafka prints every failed connection attempt to stderr (``%3|...|FAIL|``),
several a second for as long as a broker is unreachable. A client created
with :meth:`ClientErrors.callbacks` sends those lines to the ``fencewatch.kafka``
logger at DEBUG instead (shown with ``--verbose``) and keeps the errors, so the
caller can say once, in one line, why the client could not work:
:meth:`ClientErrors.cause`.

The callbacks run only when the client is polled (confluent-kafka serves
``error_cb`` and ``logger`` from ``poll()``/``flush()``).
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger("fencewatch.kafka")

# librdkafka's local error codes (rdkafka.h, RD_KAFKA_RESP_ERR__*) that name why
# no broker answers, most telling first; _ALL_BROKERS_DOWN only says that none does.
_TELLING = ("_AUTHENTICATION", "_SSL", "_RESOLVE", "_TRANSPORT", "_TIMED_OUT")
# A connection's failure as librdkafka reports it: "<broker>/<id>: <what>", in a
# log line after the thread's name: "[thrd:<broker>/<id>]: <broker>/<id>: <what>".
_BROKER_PREFIX = re.compile(r"^(?:\[thrd:[^\]]*\]: )?\S+/(?:bootstrap|\d+): ")
# What librdkafka adds to an error that repeated within a second; the cause is the same.
_SUPPRESSED = re.compile(r", \d+ identical error\(s\) suppressed")


class ClientErrors:
    """The errors and failure log lines of one librdkafka client."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}  # error name -> its latest text
        self.failure: str | None = None  # the latest FAIL log line (carries TLS handshake timeouts)

    def callbacks(self) -> dict[str, Any]:
        """The client settings that route its errors and log lines here."""
        return {"error_cb": self.on_error, "logger": self}

    def on_error(self, error: Any) -> None:
        self.errors[error.name()] = error.str()

    def log(self, level: int, msg: str, *args: Any) -> None:
        """confluent-kafka's logger interface: ``log(level, "%s [%s] %s", facility, client, text)``."""
        log.debug(msg, *args)
        if len(args) == 3 and args[0] == "FAIL":
            self.failure = str(args[2])

    @property
    def brokers_down(self) -> bool:
        """librdkafka has found every bootstrap broker unreachable at least once."""
        return "_ALL_BROKERS_DOWN" in self.errors

    @property
    def refused(self) -> bool:
        """A broker answered but refused the client's credentials."""
        return "_AUTHENTICATION" in self.errors

    def cause(self) -> str | None:
        """Why no broker answers, in librdkafka's words without the broker prefix; None if unknown."""
        for name in _TELLING:
            if name in self.errors:
                return _plain(self.errors[name])
        if self.failure is not None:
            return _plain(self.failure)
        return self.errors.get("_ALL_BROKERS_DOWN")


def _plain(text: str) -> str:
    """librdkafka's error text without the broker it names first (the message
    names the hosts) or the count of repeats it suppressed (which varies from
    one run to the next)."""
    return _SUPPRESSED.sub("", _BROKER_PREFIX.sub("", text))

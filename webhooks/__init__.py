"""Webhook alert delivery: endpoints from a TOML file, a durable SQLite
outbox, and a dispatcher that delivers each alert to each endpoint once.
Imports ``detectors`` only; the job and the probe are handed a dispatcher.

    from webhooks import Dispatcher, load_endpoints

    dispatcher = Dispatcher(load_endpoints("webhooks.toml"), "webhooks.sqlite", metrics)
    dispatcher.start()
    dispatcher.enqueue(alert_dicts)   # from each micro-batch
    dispatcher.stop()

Modules: ``config`` (endpoints and their validation), ``payloads`` (the three
formats), ``signing`` (HMAC headers), ``pacing`` (backoff, Retry-After, token
bucket, circuit breaker), ``transport`` (a POST under a whole-request
deadline), ``outbox`` (SQLite; parked rows), ``dispatcher`` (delivery and its
retry policy), ``receiver`` (a receiver for tests and docker-compose) on
``http_server`` (connection, body-size and time limits).
"""

from __future__ import annotations

from webhooks.config import Endpoint, WebhookConfigError, load_endpoints
from webhooks.dispatcher import Dispatcher

__all__ = ["Dispatcher", "Endpoint", "WebhookConfigError", "load_endpoints"]

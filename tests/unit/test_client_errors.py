"""What a librdkafka client's errors say, as fencewatch's one line shows them."""

from __future__ import annotations

from confluent_kafka import KafkaError

from producers.client_errors import ClientErrors


def test_the_cause_leaves_out_the_broker_prefix_and_librdkafkas_count_of_repeats():
    """librdkafka appends ", N identical error(s) suppressed" when a connection
    error repeats within a second: a run-to-run difference that is no cause
    (it once failed test_one_line_errors.py's exact message)."""
    refused = "Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT{})"
    for suffix in ("", ", 1 identical error(s) suppressed", ", 12 identical error(s) suppressed"):
        errors = ClientErrors()
        errors.on_error(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:9/bootstrap: " + refused.format(suffix)))
        assert errors.cause() == refused.format("")

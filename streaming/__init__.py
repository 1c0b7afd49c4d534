"""Kafka plumbing for the Spark job: the embedded broker and the Kafka stream source."""

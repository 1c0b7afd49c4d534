"""The Spark Structured Streaming job: the Kafka source, routing to buckets, the
stateful operator that runs ``detectors``' engine, the sinks, metrics, and the
embedded broker. Imports ``detectors`` and ``webhooks``; only the command imports it."""

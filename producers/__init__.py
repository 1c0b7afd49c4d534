"""Event producers: the KRaft cluster simulator, and shippers that publish
native Kafka logs as envelopes."""

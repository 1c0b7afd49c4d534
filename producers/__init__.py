"""What feeds the event topic: the shippers that publish Kafka's own logs as
envelopes, the metadata log's native reader, the publisher, and the KRaft
cluster simulator. Imports ``detectors`` only."""

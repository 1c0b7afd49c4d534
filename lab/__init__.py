"""The Kafka lab: a real Kafka cluster on loopback (``localkafka``) watched by
fencewatch's own commands as child processes, the demo's real node, and the
cluster's files judged offline afterwards against what Kafka itself answers.
Imports ``detectors``, ``producers`` and ``localkafka``; it runs the command,
never imports it."""

"""The Kafka lab: a ``localkafka`` cluster watched by fencewatch's commands run as child
processes, the demo's real node, and the run's files judged afterwards against Kafka's
own answers. Imports ``detectors``, ``producers`` and ``localkafka``, never the command."""

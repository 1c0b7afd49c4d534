"""The leader-epoch fencing probe (KIP-320): asks a live cluster's brokers with
Fetch, ListOffsets and OffsetForLeaderEpoch, judges the answers by
``detectors.probe_rules`` and confirms each deviation (wire, client, round, report,
sinks, service). Imports ``detectors`` and ``webhooks`` only: the command hands it
the job's metrics and alerts topic."""

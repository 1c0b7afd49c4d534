"""The leader-epoch fencing probe (KIP-320): Fetch, ListOffsets and OffsetForLeaderEpoch
asked of live brokers, judged by ``detectors.probe_rules``, deviations confirmed and
delivered. Imports ``detectors`` and ``webhooks``; the job's metrics and topic are handed in."""

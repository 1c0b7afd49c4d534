"""The ``fencewatch`` command: each module parses one command's arguments, checks
them and wires the packages that do the work (detectors, producers, webhooks,
streaming, localkafka, probe, incidents, lab). It may import them all; nothing
imports it but its entry point, ``fencewatch.cli:main``."""

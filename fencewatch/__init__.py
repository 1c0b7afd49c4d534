"""The ``fencewatch`` command: each module parses one command's arguments, checks them
and wires the packages that do the work (detectors, producers, webhooks, streaming,
localkafka, probe, incidents, lab). Only its entry point, ``fencewatch.cli:main``, imports it."""

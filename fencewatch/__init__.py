"""The ``fencewatch`` command: entry points that wire detectors, producers and
the streaming job together. Only this package imports ``streaming``."""

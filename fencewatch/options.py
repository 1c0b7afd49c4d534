"""Command-line options shared by the commands, each with an environment
variable override shown in ``--help``."""

from __future__ import annotations

import argparse
import os

from detectors.config import DetectorConfig

_DEFAULTS = DetectorConfig()


def env_default(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"fencewatch: {name}={raw!r} is not a whole number of milliseconds") from None


def add_detector_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("detection")
    for flag, var, default, text in (
        (
            "--grace-ms",
            "FENCEWATCH_GRACE_MS",
            _DEFAULTS.grace_ms,
            "how long brokers may act on the previous view after a change",
        ),
        (
            "--lateness-ms",
            "FENCEWATCH_LATENESS_MS",
            _DEFAULTS.lateness_ms,
            "how far out of ts_ms order events may arrive",
        ),
        (
            "--quorum-fetch-timeout-ms",
            "FENCEWATCH_QUORUM_FETCH_TIMEOUT_MS",
            _DEFAULTS.quorum_fetch_timeout_ms,
            "the cluster's quorum.fetch.timeout.ms",
        ),
    ):
        group.add_argument(
            flag,
            type=int,
            default=env_default(var, default),
            metavar="MS",
            help=f"{text} (env {var}; default %(default)s)",
        )


def detector_config(args: argparse.Namespace) -> DetectorConfig:
    try:
        return DetectorConfig(
            grace_ms=args.grace_ms,
            lateness_ms=args.lateness_ms,
            quorum_fetch_timeout_ms=args.quorum_fetch_timeout_ms,
        )
    except ValueError as exc:
        raise SystemExit(f"fencewatch: {exc}") from None

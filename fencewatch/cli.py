"""``fencewatch`` command line: one sub-command per module, each exposing
``add_parser(subparsers)`` and ``run(args) -> int`` (the exit code)."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module; imported lazily so `fencewatch replay` never pays for Spark.
COMMANDS = {
    "convert": "fencewatch.convert",
    "replay": "fencewatch.replay",
    "simulate": "fencewatch.simulate",
    "run": "fencewatch.run",
    "demo": "fencewatch.demo",
    "ship": "fencewatch.ship",
    "receive-webhooks": "fencewatch.receive_webhooks",
    "webhooks": "fencewatch.webhooks",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencewatch",
        description="Catch Kafka fencing violations: epoch fencing and ISR eligibility.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMANDS.values():
        importlib.import_module(module_name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `fencewatch replay f | head` closes stdout early; that is not an error.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())

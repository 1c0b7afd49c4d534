"""``fencewatch`` command line: one sub-command per module, each exposing
``add_parser(subparsers)`` and ``run(args) -> int`` (the exit code).

A failure the user can fix ends a command in one line on stderr
(``fencewatch <command>: <what> -- <what to do>``, exit code 1); ``--verbose``,
accepted by every command, adds the detail: tracebacks, Spark's own output, the
Kafka clients' log lines."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

# name -> module; only the named command's is imported (build_parser), so
# `fencewatch replay` pays for neither Spark nor the Kafka clients.
COMMANDS = {
    "convert": "fencewatch.convert",
    "replay": "fencewatch.replay",
    "report": "fencewatch.report",
    "simulate": "fencewatch.simulate",
    "run": "fencewatch.run",
    "demo": "fencewatch.demo",
    "ship": "fencewatch.ship",
    "probe": "fencewatch.probe",
    "receive-webhooks": "fencewatch.receive_webhooks",
    "webhooks": "fencewatch.webhooks",
    "kafka-lab": "fencewatch.kafka_lab",
}

OUR_PACKAGES = ("fencewatch", "streaming", "producers", "detectors")
VERBOSE_HELP = "show the detail behind a failure: tracebacks, Spark's output, Kafka client logs"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` (one of COMMANDS), only that
    command's module is imported and its parser added: what ``main`` runs."""
    parser = argparse.ArgumentParser(
        prog="fencewatch",
        description="Catch Kafka fencing violations: epoch fencing and ISR eligibility.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(module_name).add_parser(sub)
    _add_verbose(sub)
    return parser


def _add_verbose(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``--verbose`` after any command too (``fencewatch run ... --verbose``); SUPPRESS
    keeps an absent one from overriding a ``--verbose`` given before the command."""
    for command in set(sub.choices.values()):
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_verbose(action)


def _command(argv: list[str]) -> str | None:
    """The command ``argv`` names, if it names a known one before any other
    word (the options before it take no value); else None: the parser then
    knows every command, for the help or the error it gives."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser(_command(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    if args.verbose:
        # Our packages' debug lines (the Kafka clients' log among them), not py4j's chatter.
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for package in OUR_PACKAGES:
            logging.getLogger(package).setLevel(logging.DEBUG)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `fencewatch replay f | head` closes stdout early; that is not an error.
        sys.stderr.close()
        return 0
    except SystemExit as exc:
        # A one-line failure (fencewatch.options.fail); what led to it behind --verbose.
        cause = exc.__cause__ or exc.__context__
        if args.verbose and cause is not None:
            traceback.print_exception(cause)
        raise


if __name__ == "__main__":
    raise SystemExit(main())

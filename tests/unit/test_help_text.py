"""``--help`` of every command: each option explained, plain text (no reST
markup), nothing that names an option the command does not have, and each
``convert`` format with its own help."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from fencewatch.cli import build_parser, main

Parser = argparse.ArgumentParser


def commands(parser: Parser, path: tuple[str, ...] = ("fencewatch",)) -> Iterator[tuple[str, Parser]]:
    """Every parser of the command line with its command words, sub-commands included."""
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


ALL = dict(commands(build_parser()))


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as ended:
        main([*argv, "--help"])
    assert ended.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(ALL))
def test_every_option_has_help(command: str) -> None:
    unexplained = []
    for action in ALL[command]._actions:
        if isinstance(action, argparse._SubParsersAction):
            # Sub-commands are listed with their own help lines.
            unexplained += [choice.dest for choice in action._get_subactions() if not choice.help]
        elif not action.help and not isinstance(action, argparse._HelpAction):
            unexplained.append(str(action.option_strings or action.dest))
    assert unexplained == [], f"{command}: options without help"


@pytest.mark.parametrize("command", sorted(ALL))
def test_help_is_plain_text(command: str) -> None:
    parser = ALL[command]
    texts = [parser.description or "", parser.epilog or ""] + [str(a.help or "") for a in parser._actions]
    assert not [t for t in texts if "``" in t or ":func:" in t or ":class:" in t], command


@pytest.mark.parametrize("command", sorted(ALL))
def test_help_names_only_options_the_command_has(command: str) -> None:
    parser = ALL[command]
    own = {flag for action in parser._actions for flag in action.option_strings}
    texts = [parser.description or ""] + [str(a.help or "") for a in parser._actions]
    # Options named as another command's ("fencewatch replay --report") are that command's.
    own_texts = [re.sub(r"fencewatch [a-z-]+(?: [a-z-]+)? --[a-z-]+", "", text) for text in texts]
    named = {flag for text in own_texts for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text)}
    # Options of Kafka's tools, Spark, and the job (`webhooks --outbox`: "the job's
    # --webhook-outbox") that help texts point to on purpose.
    elsewhere = {
        "--cluster-metadata-decoder",
        "--formatter",
        "--packages",
        "--from-beginning",
        "--webhook-outbox",
    }
    assert named - own - elsewhere == set(), command


def test_demo_help_says_where_its_outbox_and_alerts_are(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(help_of(["demo"], capsys).split())
    assert "--checkpoint" not in text
    assert "default: in the demo's temporary directory, removed when it ends" in text
    assert "SPEC" not in text
    assert "--seed SEED simulator seed: same seed, same events (default 1)" in text


@pytest.mark.parametrize(
    ("fmt", "says"),
    [
        ("request-log", "convert kafka-request.log (logger kafka.request.logger at DEBUG)"),
        ("metadata-dump", "convert kafka-dump-log.sh --cluster-metadata-decoder output"),
        ("quorum-state", "quorum-state file to one envelope per file"),
        ("remote-log-metadata", "RemoteLogMetadataSerde$RemoteLogMetadataFormatter"),
        ("metadata-log", "segment (.log) and snapshot (.checkpoint) files, read natively"),
    ],
)
def test_each_convert_format_has_its_own_help(
    fmt: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_of(["convert", fmt], capsys)
    assert text.startswith(f"usage: fencewatch convert {fmt} ")
    assert says in " ".join(text.split())
    assert "--max-record-bytes" in text


def test_verbose_is_accepted_before_and_after_the_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["--verbose", "replay", "f"]).verbose is True
    assert parser.parse_args(["replay", "f", "--verbose"]).verbose is True
    assert parser.parse_args(["replay", "f"]).verbose is False
    assert parser.parse_args(["convert", "request-log", "--node", "1", "f", "--verbose"]).verbose is True

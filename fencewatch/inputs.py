"""The files the commands read: one opened (stdin too), its kind peeked at from its
first lines (detectors.file_kinds), and the one line that says which command reads
a file of another kind."""

from __future__ import annotations

import os
import shlex
import sys
from contextlib import ExitStack
from io import BufferedReader
from typing import IO

from detectors.file_kinds import SNIFF_BYTES, SNIFF_LINES, FileKind, sniff
from detectors.lines import peek_lines


def open_input(name: str, stack: ExitStack) -> IO[bytes]:
    """The input ``name`` ('-': stdin) opened in binary, closed with ``stack``."""
    # Binary: bytes that are not UTF-8 must become dead letters, not a crash.
    if name == "-":
        return sys.stdin.buffer
    return stack.enter_context(open(name, "rb"))


def peek_kind(stream: IO[bytes]) -> tuple[FileKind, BufferedReader]:
    """What kind of file ``stream`` looks like from its first lines, and a
    stream that reads it from its start (stdin included)."""
    head, again = peek_lines(stream, SNIFF_LINES, SNIFF_BYTES)  # type: ignore[arg-type]  # buffered: has read1
    return sniff(head), again


def convert_command(kind: FileKind, name: str, cluster: str = "C", node: str = "N") -> str | None:
    """The fencewatch command that reads a file of ``kind``, or None."""
    path = shlex.quote(name)
    commands = {
        FileKind.REQUEST_LOG: f"fencewatch convert request-log --cluster {cluster} --node {node} {path}",
        FileKind.METADATA_DUMP: f"fencewatch convert metadata-dump --cluster {cluster} {path}",
        FileKind.QUORUM_STATE: f"fencewatch convert quorum-state --cluster {cluster} --node {node} {path}",
        FileKind.REMOTE_LOG_METADATA: f"fencewatch convert remote-log-metadata --cluster {cluster} {path}",
        FileKind.ENVELOPES: f"fencewatch replay {path}",
    }
    return commands.get(kind)


def wrong_kind(
    name: str, kind: FileKind, wanted: FileKind, cluster: str = "C", node: str = "N"
) -> str | None:
    """One line saying that input ``name``, of ``kind``, is not the ``wanted``
    kind and what reads it; None when it may be the wanted kind (it is, or
    nothing in its first lines says otherwise)."""
    may_be = (wanted, FileKind.UNKNOWN, FileKind.EMPTY)
    if kind in may_be or (kind is FileKind.LOG4J and wanted is FileKind.REQUEST_LOG):
        return None
    shown = "stdin" if name == "-" else name
    head = f"{shown} looks like {kind.value}, not {wanted.value}"
    if kind is FileKind.BINARY:
        return (
            f"{head}: fencewatch reads text here; a metadata log segment or snapshot is read by "
            f"`fencewatch convert metadata-log --cluster {cluster} {shlex.quote(name)}`"
        )
    # A request log may open with other loggers' lines (the broker starting):
    # read as one, it gives its entries or says that it has none.
    command = convert_command(FileKind.REQUEST_LOG if kind is FileKind.LOG4J else kind, name, cluster, node)
    if wanted is FileKind.ENVELOPES:
        stem = "stdin" if name == "-" else os.path.splitext(os.path.basename(name))[0]
        converted = shlex.quote(f"{stem}.jsonl")
        return f"{head}: convert it first with `{command} > {converted}`, then replay {converted}"
    if kind is FileKind.ENVELOPES:
        return f"{head}: it is converted already: run `{command}`"
    return f"{head}: run `{command}`"

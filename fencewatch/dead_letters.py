"""Where ``convert`` and ``replay`` put their dead letters (JSON lines with
position, reason and raw): all in ``--dead-letter FILE`` when given; else the
first few on stderr and, once there are more, every one of them in a file in
the current directory, so an input of the wrong kind cannot flood the terminal.
The default name is the job's dead-letter topic's (``fencewatch run
--dead-letter-topic``, default ``fencewatch-dead-letters``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

SHOWN_ON_STDERR = 5
DEFAULT_STEM = "fencewatch-dead-letters"


def _create_new(directory: Path) -> tuple[Path, TextIO]:
    """A new file ``fencewatch-dead-letters[-N].jsonl`` in ``directory``, never
    one that exists (an earlier run's letters are kept)."""
    number = 1
    while True:
        path = directory / (f"{DEFAULT_STEM}.jsonl" if number == 1 else f"{DEFAULT_STEM}-{number}.jsonl")
        try:
            return path, path.open("x", encoding="utf-8")
        except FileExistsError:
            number += 1


class DeadLetterOutput:
    """Dead-letter lines written as they come.

    path: ``--dead-letter FILE``, opened (truncated) at once so a bad path fails
        before any output (OSError), or None for the default above.
    directory: where the default file goes (the current directory).
    """

    def __init__(self, prog: str, path: str | None, directory: Path = Path(), stderr: TextIO | None = None):
        self.prog = prog
        self.count = 0
        self._stderr = stderr if stderr is not None else sys.stderr
        self._directory = directory
        self._shown: list[str] = []
        self._path: Path | None = Path(path) if path else None
        self._chosen = path is not None
        self._file: TextIO | None = open(path, "w", encoding="utf-8") if path else None  # noqa: SIM115
        self._on_stderr = False  # the default file could not be made: all go to stderr

    def __enter__(self) -> DeadLetterOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, line: str) -> None:
        """One dead letter's JSON line (without its newline)."""
        self.count += 1
        if self._file is not None:
            self._file.write(line + "\n")
            return
        if self._on_stderr:
            self._stderr.write(line + "\n")
            return
        if self.count <= SHOWN_ON_STDERR:
            self._stderr.write(line + "\n")
            self._shown.append(line)  # for the file, should more come
            return
        try:
            self._path, self._file = _create_new(self._directory)
        except OSError as exc:
            self._on_stderr = True
            place = "the current directory" if self._directory == Path() else self._directory
            print(
                f"{self.prog}: cannot create {DEFAULT_STEM}.jsonl in {place}: {exc.strerror or exc}; "
                "the rest go to stderr -- name a file with --dead-letter FILE",
                file=self._stderr,
            )
            self._stderr.write(line + "\n")
            return
        for shown in self._shown:
            self._file.write(shown + "\n")
        self._shown.clear()
        self._file.write(line + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def where(self) -> str | None:
        """A line saying where the dead letters went, or None when every one
        of them is on stderr already."""
        if self._path is None or self._on_stderr or (self._chosen and self.count == 0):
            return None
        if self._chosen:
            return f"{self.prog}: {self.count} dead letters written to {self._path}"
        return (
            f"{self.prog}: {self.count} dead letters: the first {SHOWN_ON_STDERR} above, all {self.count} "
            f"in {self._path} (name the file with --dead-letter FILE)"
        )

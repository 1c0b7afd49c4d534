"""Follow a growing log file like ``tail -F``: pure file logic, no Kafka.

A :class:`FileFollower` reads one path and survives what log rotation does to it:

* rename rotation (log4j's RollingFileAppender, logrotate ``create``): the
  path gets a new inode. The old file is read to its end (and, while following,
  until it has been quiet for ``rotate_grace_seconds``, in case its writer is
  still flushing), then the new file is read from its start;
* ``copytruncate``: the same inode shrinks, or is overwritten from the start
  and regrows past where we were. Both are seen (size below our offset, or the
  file's first bytes changed) and the file is read again from its start.
  Whatever was written between our last read and the truncation is lost:
  ``copytruncate`` itself makes that window, for every tailer;
* restarts: a :class:`FilePosition` (saved by a :class:`StateFile`) names the
  file by device and inode plus a hash of its first bytes. If the path has been
  rotated while we were stopped, the old file is found again under its new name
  in the same directory and finished before the new file is started.

Like ``tail -F``, a file that is rotated in and out again within one poll
interval (two rotations between polls) is not seen.

Only complete lines (ending in ``\\n``) are handed out; a partial last line
waits for its newline. The one exception is a rotated or truncated file: its
unterminated last line is final and is handed out as is. A line longer than
``max_line_bytes`` is not kept: its start is, the rest is dropped as it is
read, and once it ends it is handed out as a :class:`~detectors.lines.LongLine`,
so a line that never ends costs no memory beyond the limit.

Each file is one :class:`Segment`: ``segments()`` yields them in reading
order, and each segment's ``lines()`` yields that file's lines. ``lines()``
returns when its file is finished (rotated or truncated); it raises
:class:`StopFollowing` when the follower stops (``once`` reached the end of the
data, or :meth:`FileFollower.stop` was called), which leaves the segment's last
unfinished record unread rather than cutting it short.

Time is injected: ``clock`` (seconds, monotonic) and ``sleep`` are parameters,
and ``on_idle`` is called on every poll that finds no new data.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

from detectors.lines import DEFAULT_MAX_RECORD_BYTES, EXCERPT_BYTES, LongLine, over_limit

# How many leading bytes identify a file's content (to see a copytruncate).
HEAD_BYTES = 256
READ_SIZE = 1 << 16
STATE_VERSION = 1

_TRUNCATED = "truncated"
_ROTATED = "rotated"
_GONE = "gone"


class StopFollowing(Exception):
    """The follower stopped: ``once`` reached the end of the data, or ``stop()`` was called."""


class StateError(ValueError):
    """A state file that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class FilePosition:
    """Where reading stopped: everything before ``offset`` was consumed.

    followed: the path being followed (absolute), as given by the user.
    path: the name the file had when it was read (differs after a rotation).
    dev, ino: the file's identity, to find it again under another name.
    offset: bytes consumed from the file's start; always at a line boundary.
    line: lines consumed (the number of the last consumed line, 1-based).
    head_sha256, head_bytes: SHA-256 of the file's first ``head_bytes`` bytes,
        to tell a truncated-and-rewritten file from the one we read.
    """

    followed: str
    path: str
    dev: int
    ino: int
    offset: int
    line: int
    head_sha256: str
    head_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> FilePosition:
        """Validate a decoded state; raise :class:`StateError` naming the problem."""
        if obj.get("version") != STATE_VERSION:
            raise StateError(f"unsupported state version {obj.get('version')!r}")
        for name in ("followed", "path", "head_sha256"):
            if type(obj.get(name)) is not str:
                raise StateError(f"state field {name!r} must be a string")
        for name in ("dev", "ino", "offset", "line", "head_bytes"):
            value = obj.get(name)
            if type(value) is not int or value < 0:
                raise StateError(f"state field {name!r} must be a non-negative integer")
        return cls(
            followed=obj["followed"],
            path=obj["path"],
            dev=obj["dev"],
            ino=obj["ino"],
            offset=obj["offset"],
            line=obj["line"],
            head_sha256=obj["head_sha256"],
            head_bytes=obj["head_bytes"],
        )


P_co = TypeVar("P_co", covariant=True)


class SavedState(Protocol[P_co]):
    """A shipper's state file (:class:`StateFile`,
    ``producers.metadata_log_shipper.MetadataLogState``): its path and the
    position saved in it, None before the first save."""

    path: str

    def load(self) -> P_co | None: ...


def read_state(path: str) -> dict[str, Any] | None:
    """The JSON object a state file holds, None if there is no state file yet;
    :class:`StateError` if it holds anything else."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"state file {path} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise StateError(f"state file {path} is not a JSON object")
    return obj


def write_state(path: str, obj: dict[str, Any]) -> None:
    """Write ``obj`` to ``path`` durably: temp file, fsync, rename over the old
    state, so a crash leaves the old state or the new one, never a torn one."""
    tmp = f"{path}.tmp"
    data = json.dumps(obj, sort_keys=True).encode() + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class StateFile:
    """A :class:`FilePosition` persisted as JSON, replaced atomically on every save."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> FilePosition | None:
        """The saved position, None if there is no state file yet; :class:`StateError` if unusable."""
        obj = read_state(self.path)
        if obj is None:
            return None
        try:
            return FilePosition.from_dict(obj)
        except StateError as exc:
            raise StateError(f"state file {self.path}: {exc}") from None

    def save(self, position: FilePosition) -> None:
        write_state(self.path, position.to_dict())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Segment:
    """One file read from ``start_offset``: its lines, and positions within it."""

    def __init__(
        self,
        follower: FileFollower,
        path: str,
        fd: int,
        start_offset: int,
        first_line: int,
        *,
        finished_name: bool,
    ) -> None:
        st = os.fstat(fd)
        self.path = path
        self.dev, self.ino = st.st_dev, st.st_ino
        self.start_offset = start_offset
        self.first_line = first_line  # lines before start_offset
        self._follower = follower
        self._fd: int | None = fd
        # The file is no longer at the followed path: read it to its end and move on.
        self._finished_name = finished_name
        self._buf = bytearray()
        self._pos = 0  # start of the unconsumed part of _buf
        self._scan = 0  # where to look for the next newline in _buf
        self._read_offset = start_offset  # file offset just after _buf's end
        self._head = os.pread(fd, HEAD_BYTES, 0)
        self._head_sha = _sha256(self._head)
        self._long_head: bytes | None = None  # the start of an over-long line being dropped
        self._dropped = 0  # bytes of that line dropped so far
        self._ends: deque[int] = deque()  # end offsets of handed-out lines, oldest first
        self._ends_base = 0  # lines handed out before _ends[0]
        self._quiet_since: float | None = None
        self._waited = False  # a poll interval passed since the last read
        self._next: Callable[[], Segment] | None = None

    # -- reading ----------------------------------------------------------

    def lines(self) -> Iterator[bytes | LongLine]:
        """This file's complete lines, with their ``\\n`` (over-long ones as
        :class:`~detectors.lines.LongLine`).

        Returns when the file is finished (rotated away or truncated), raises
        :class:`StopFollowing` when the follower stops; polls while waiting.
        """
        f = self._follower
        while True:
            if f.stop_requested:
                raise StopFollowing
            line = self._take_line()
            if line is not None:
                yield line
                continue
            if self._read_more():
                continue
            change = _ROTATED if self._finished_name else self._change()
            if change == _TRUNCATED:
                f.notice(f"{self.path} was truncated (copytruncate?); reading it again from its start")
                yield from self._final_partial()
                self._next = self._reopen_truncated
                return
            if change == _ROTATED:
                quiet = self._quiet_since
                if (
                    f.once
                    or self._finished_name
                    or (quiet is not None and f.clock() - quiet >= f.rotate_grace_seconds)
                ):
                    yield from self._final_partial()
                    self._next = f.open_followed
                    return
                if quiet is None:
                    self._quiet_since = f.clock()
            elif f.once:
                raise StopFollowing
            f.idle()
            self._waited = True

    def _take_line(self) -> bytes | LongLine | None:
        buf = self._buf
        idx = buf.find(b"\n", self._scan)
        if idx < 0:
            self._scan = len(buf)
            # Past the limit by more than a "\r": over-long whatever comes next.
            if len(buf) - self._pos > self._follower.max_line_bytes + 1:
                self._drop_unfinished()
            return None
        line = self._line(bytes(buf[self._pos : idx + 1]))
        self._pos = self._scan = idx + 1
        self._ends.append(self._read_offset - len(buf) + idx + 1)
        return line

    def _drop_unfinished(self) -> None:
        """Forget the unfinished line read so far, keeping its start."""
        buf = self._buf
        if self._long_head is None:
            self._long_head = bytes(buf[self._pos : self._pos + EXCERPT_BYTES])
        self._dropped += len(buf) - self._pos
        # Emptied whole, so that the buffer's end stays at _read_offset.
        del buf[:]
        self._pos = self._scan = 0

    def _line(self, rest: bytes) -> bytes | LongLine:
        """A finished line from its bytes still in the buffer: itself, or a
        LongLine if it is over the limit or its start was dropped."""
        limit = self._follower.max_line_bytes
        if self._long_head is None:
            return over_limit(rest, limit) or rest
        long = LongLine(self._long_head, limit, self._dropped + len(rest.rstrip(b"\r\n")))
        self._long_head, self._dropped = None, 0
        return long

    def _read_more(self) -> bool:
        assert self._fd is not None
        if self._waited:
            self._waited = False
            # After a wait the file may have been truncated and rewritten past our
            # offset: reading on would hand out the middle of someone else's line.
            if self._truncated():
                return False
        chunk = os.pread(self._fd, READ_SIZE, self._read_offset)
        if not chunk:
            return False
        if self._pos:
            del self._buf[: self._pos]
            self._scan -= self._pos
            self._pos = 0
        self._buf += chunk
        self._read_offset += len(chunk)
        self._quiet_since = None
        return True

    def _final_partial(self) -> Iterator[bytes | LongLine]:
        """The file's unterminated last line, if any: the file is finished, so it is final."""
        if self._pos < len(self._buf) or self._long_head is not None:
            line = self._line(bytes(self._buf[self._pos :]))
            self._pos = self._scan = len(self._buf)
            self._ends.append(self._read_offset)
            yield line

    def _change(self) -> str | None:
        """At the end of the data: has the file been truncated, rotated away, or removed?"""
        if self._truncated():
            return _TRUNCATED
        try:
            st = os.stat(self._follower.path)
        except FileNotFoundError:
            return _GONE  # renamed, new file not created yet: keep reading the old one
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            return _ROTATED
        return None

    def _truncated(self) -> bool:
        assert self._fd is not None
        return os.fstat(self._fd).st_size < self._read_offset or not self._same_head()

    def _same_head(self) -> bool:
        """Whether the file still starts with the bytes it started with (it may have grown)."""
        assert self._fd is not None
        if len(self._head) >= HEAD_BYTES:
            return os.pread(self._fd, HEAD_BYTES, 0) == self._head
        head = os.pread(self._fd, HEAD_BYTES, 0)
        if not head.startswith(self._head):
            return False
        if len(head) > len(self._head):
            self._head, self._head_sha = head, _sha256(head)
        return True

    def _reopen_truncated(self) -> Segment:
        fd, self._fd = self._fd, None
        assert fd is not None
        return Segment(self._follower, self.path, fd, 0, 0, finished_name=False)

    def next_segment(self) -> Segment | None:
        """The segment to read after this one, once ``lines()`` has returned; closes this file."""
        if self._next is None:
            return None
        following = self._next()
        self.close()
        return following

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- positions --------------------------------------------------------

    @property
    def lines_handed_out(self) -> int:
        return self._ends_base + len(self._ends)

    def position_after(self, consumed: int) -> FilePosition:
        """The position after the first ``consumed`` lines of this segment.

        ``consumed`` must not decrease between calls (older line ends are
        forgotten) and must not exceed the lines handed out.
        """
        if consumed == 0:
            offset = self.start_offset
        else:
            index = consumed - 1 - self._ends_base
            if not 0 <= index < len(self._ends):
                raise ValueError(
                    f"position after line {consumed} of {self.path} is not known "
                    f"(lines {self._ends_base + 1}..{self.lines_handed_out} are)"
                )
            offset = self._ends[index]
            for _ in range(index):
                self._ends.popleft()
            self._ends_base += index
        return FilePosition(
            followed=self._follower.path,
            path=self.path,
            dev=self.dev,
            ino=self.ino,
            offset=offset,
            line=self.first_line + consumed,
            head_sha256=self._head_sha,
            head_bytes=len(self._head),
        )

    def size(self) -> int:
        """The file's current size in bytes (0 once closed)."""
        return os.fstat(self._fd).st_size if self._fd is not None else 0

    @property
    def unread_bytes(self) -> int:
        """Bytes in the file not read yet."""
        return max(0, self.size() - self._read_offset)


class FileFollower:
    """Follows ``path`` like ``tail -F``; see the module docstring.

    start: where a previous run stopped (from a :class:`StateFile`), or None.
    from_beginning: without ``start``, read the file from its first byte
        (default: from its current end, after its last complete line).
    once: stop (raise :class:`StopFollowing`) at the end of the current data
        instead of waiting for more; a rotated file found on resume is still
        finished and the new file read to its end.
    poll_interval_seconds: how long to sleep when there is no new data.
    rotate_grace_seconds: how long a rotated-away file must stay quiet before
        we move to the new file (default: two poll intervals).
    on_idle: called on each poll that found no new data (serve callbacks,
        save progress...).
    on_notice: called with a one-line message about rotation, truncation,
        waiting for the file, or a lost resume position.
    max_line_bytes: the longest line handed out as bytes; a longer one is
        handed out as a LongLine once it ends, and never held whole.
    """

    def __init__(
        self,
        path: str,
        *,
        start: FilePosition | None = None,
        from_beginning: bool = False,
        once: bool = False,
        poll_interval_seconds: float = 0.5,
        rotate_grace_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
        on_idle: Callable[[], None] | None = None,
        on_notice: Callable[[str], None] | None = None,
        max_line_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        if poll_interval_seconds <= 0:
            raise ValueError("poll_interval_seconds must be positive")
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self.path = os.path.abspath(path)
        self.start = start
        self.from_beginning = from_beginning
        self.once = once
        self.poll_interval_seconds = poll_interval_seconds
        self.rotate_grace_seconds = (
            2 * poll_interval_seconds if rotate_grace_seconds is None else rotate_grace_seconds
        )
        self.clock = clock
        self._sleep = sleep
        self._on_idle = on_idle
        self._on_notice = on_notice
        self.max_line_bytes = max_line_bytes
        self.stop_requested = False

    def stop(self) -> None:
        """Ask the follower to stop at the next line or poll (safe from a signal handler)."""
        self.stop_requested = True

    def notice(self, message: str) -> None:
        if self._on_notice is not None:
            self._on_notice(message)

    def idle(self) -> None:
        """One empty poll: let the caller work, then sleep one interval."""
        if self._on_idle is not None:
            self._on_idle()
        if not self.stop_requested:
            self._sleep(self.poll_interval_seconds)

    def segments(self) -> Iterator[Segment]:
        """The files to read, in order; each is done when its ``lines()`` returns.

        Raises FileNotFoundError if the path does not exist and ``once`` is set
        (while following, waits for it to appear), :class:`StopFollowing` if
        stopped while waiting.
        """
        segment: Segment | None = self._first_segment()
        while segment is not None:
            yield segment
            segment = segment.next_segment()

    # -- opening ----------------------------------------------------------

    def _open_wait(self) -> int:
        """Open the followed path, waiting for it to exist unless ``once``."""
        told = False
        while True:
            if self.stop_requested:
                raise StopFollowing
            try:
                return os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                if self.once:
                    raise
                if not told:
                    self.notice(f"waiting for {self.path} to appear")
                    told = True
            self.idle()

    def open_followed(self) -> Segment:
        """The followed path from its start (the file that replaced a rotated one)."""
        try:
            fd = self._open_wait()
        except FileNotFoundError:
            raise StopFollowing from None  # once: the new file vanished again, nothing to read
        return Segment(self, self.path, fd, 0, 0, finished_name=False)

    def _first_segment(self) -> Segment:
        if self.start is not None:
            resumed = self._resume(self.start)
            if resumed is not None:
                return resumed
        fd = self._open_wait()
        if self.from_beginning or self.start is not None:
            return Segment(self, self.path, fd, 0, 0, finished_name=False)
        offset, lines = _end_of_last_line(fd)
        return Segment(self, self.path, fd, offset, lines, finished_name=False)

    def _resume(self, pos: FilePosition) -> Segment | None:
        """The segment continuing ``pos``, found under the followed path or, if it
        was rotated while we were stopped, under its new name; None (with a
        notice) if the file is gone or was truncated."""
        candidates = [self.path]
        for directory in dict.fromkeys([os.path.dirname(self.path), os.path.dirname(pos.path)]):
            try:
                with os.scandir(directory) as entries:
                    candidates += sorted(e.path for e in entries if e.path != self.path)
            except OSError:
                continue
        for candidate in candidates:
            try:
                st = os.stat(candidate)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) != (pos.dev, pos.ino):
                continue
            fd = os.open(candidate, os.O_RDONLY)
            size = os.fstat(fd).st_size
            head = os.pread(fd, pos.head_bytes, 0)
            if size < pos.offset or len(head) < pos.head_bytes or _sha256(head) != pos.head_sha256:
                os.close(fd)
                self.notice(
                    f"{candidate} was truncated or rewritten since byte {pos.offset} was "
                    "shipped; reading it from its start"
                )
                return None
            rotated = candidate != self.path
            if rotated:
                self.notice(f"{self.path} was rotated while stopped; finishing {candidate} first")
            return Segment(self, candidate, fd, pos.offset, pos.line, finished_name=rotated)
        self.notice(
            f"the file last read ({pos.path}, inode {pos.ino}) is gone; records written to it "
            f"after byte {pos.offset} could not be read. Starting {self.path} from its start"
        )
        return None


def _end_of_last_line(fd: int) -> tuple[int, int]:
    """The offset just after the file's last ``\\n`` and the number of lines before it."""
    offset = lines = 0
    position = 0
    while True:
        chunk = os.pread(fd, READ_SIZE, position)
        if not chunk:
            return offset, lines
        count = chunk.count(b"\n")
        if count:
            lines += count
            offset = position + chunk.rindex(b"\n") + 1
        position += len(chunk)

"""One job per checkpoint: an exclusive lock file in the checkpoint directory.

Two jobs on one checkpoint would both run every micro-batch, both publish its
alerts and both drain the webhook outbox. So the job holds ``fencewatch.lock``
in the checkpoint directory with ``flock`` for its whole life. The kernel ties
the lock to the open file and drops it when the holder dies, even by SIGKILL:
a crashed job leaves no stale lock behind. The file names the holder's pid,
for the refusal message only; the lock itself is the ``flock``.

Limits: ``flock`` works on a local filesystem. On NFS, Linux emulates it with
POSIX byte-range locks, which need a working lock manager on every client.
HDFS, S3 and other non-local checkpoints cannot be locked from here at all;
there the operator must make sure that only one job uses a checkpoint.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

LOCK_FILE = "fencewatch.lock"


class CheckpointInUse(RuntimeError):
    """Another live process holds the checkpoint's lock."""


def local_directory(checkpoint: str) -> Path | None:
    """The checkpoint's local directory, or None if it lives elsewhere (``hdfs://``, ``s3a://``)."""
    parsed = urlparse(checkpoint)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "":
        return Path(checkpoint)
    return None


class CheckpointLock:
    """Holds ``<checkpoint>/fencewatch.lock`` between ``acquire()`` and ``release()``
    (or as a context manager). ``acquire`` raises :class:`CheckpointInUse` naming
    the checkpoint and the holder's pid, and ``ValueError`` for a checkpoint that
    is not on a local filesystem (see :func:`local_directory`)."""

    def __init__(self, checkpoint: str):
        directory = local_directory(checkpoint)
        if directory is None:
            raise ValueError(f"checkpoint {checkpoint} is not on a local filesystem and cannot be locked")
        self.checkpoint = checkpoint
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Not inheritable (Python's default): Spark's JVM, started as a child,
        # must not keep the lock alive after this process dies.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise CheckpointInUse(
                f"checkpoint {self.checkpoint} is in use by another fencewatch job (pid {holder}) -- "
                "stop that job first, or give this one another --checkpoint"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (closing the file drops it). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> CheckpointLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

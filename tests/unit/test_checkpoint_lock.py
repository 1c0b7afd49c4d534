"""The checkpoint lock: one holder at a time, released by the kernel when the
holder dies, even by SIGKILL; real processes, no broker, no Spark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streaming.checkpoint_lock import LOCK_FILE, CheckpointInUse, CheckpointLock, local_directory

REPO_ROOT = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys, time\n"
    "from streaming.checkpoint_lock import CheckpointLock\n"
    "CheckpointLock(sys.argv[1]).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(600)\n"
)


def hold_in_child(checkpoint: Path) -> subprocess.Popen[str]:
    """A child process that takes the lock, says so, and keeps it."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(checkpoint)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "locked\n", "the child could not take the lock"
    return child


def test_a_second_holder_is_refused_naming_the_checkpoint_and_the_pid(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    with CheckpointLock(str(checkpoint)):
        assert (checkpoint / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(CheckpointInUse) as refused:
            CheckpointLock(str(checkpoint)).acquire()
    assert str(refused.value) == (
        f"checkpoint {checkpoint} is in use by another fencewatch job (pid {os.getpid()}) -- "
        "stop that job first, or give this one another --checkpoint"
    )
    # Released: the next job gets it.
    with CheckpointLock(str(checkpoint)):
        pass


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    child = hold_in_child(checkpoint)
    try:
        with pytest.raises(CheckpointInUse, match=f"pid {child.pid}"):
            CheckpointLock(str(checkpoint)).acquire()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait(timeout=30)
    lock = CheckpointLock(f"file://{checkpoint}")
    lock.acquire()
    try:
        assert (checkpoint / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()


def test_only_local_checkpoints_can_be_locked(tmp_path: Path) -> None:
    assert local_directory(str(tmp_path)) == tmp_path
    assert local_directory(f"file://{tmp_path}") == tmp_path
    assert local_directory("hdfs:///fencewatch/checkpoint") is None
    with pytest.raises(ValueError, match="s3a://b/ck is not on a local filesystem"):
        CheckpointLock("s3a://b/ck")

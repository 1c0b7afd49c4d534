"""Child processes for integration tests that must outlive a call or be killed:
``fencewatch run`` (driver + its Spark JVM + Python workers) and a standalone
Spark cluster (one master, one or more workers) started from the pyspark wheel.

Every child starts in a new session (``start_new_session=True``), so the child
is its session's leader and everything it starts (the Spark JVM, executors,
pyspark daemons, which move to process groups of their own) stays in that
session. ``ChildProcess.kill`` SIGKILLs the process group and then any process
left in the session: the whole tree dies at once, like a machine losing power.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

from streaming.broker import free_port
from streaming.spark_home import compiled_spark_home

REPO_ROOT = Path(__file__).resolve().parents[2]
# A condition is often a whole read of a topic by a new consumer (test_job.read_topic):
# polled ten times a second, those reads took CPU the job under test needed.
POLL_SECONDS = 0.5


def spark_home() -> Path:
    """The pyspark wheel's Spark home (its ``bin/spark-class`` and ``jars/``), as
    the job uses it: without the zips its Python workers would import."""
    return Path(compiled_spark_home())


def child_env(**extra: str) -> dict[str, str]:
    """This environment, with Spark's Python workers on this interpreter and this checkout
    importable, and the child's Spark driver on HotSpot's C1 compiler alone.

    spark-submit adds SPARK_SUBMIT_OPTS to the driver JVM's command line. A child's JVM
    lives a minute or two, cold, where C1 alone spends less CPU than C2's optimizing
    threads (docs/performance.md, "The test suite's time on two cores"); the tests'
    shared session lives for the whole tier and keeps Spark's default. SPARK_SUBMIT_OPTS
    set in the environment, even empty, is kept."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_SUBMIT_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1"),
        **extra,
    }


def session_members(sid: int) -> list[int]:
    """Pids of the live processes whose session id is ``sid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append(int(entry))
    return members


class ChildProcess:
    """One command in a session of its own, stdout and stderr to ``log_path``."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv, self.log_path, self.env = argv, log_path, env or child_env()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.proc is None, "already started"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the whole session at once (idempotent) and wait until it is gone."""
        if self.proc is None:
            return
        proc, sid = self.proc, self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sid, signal.SIGKILL)
        # Children that moved to a process group of their own (pyspark's daemon does).
        for pid in session_members(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
        wait_until(lambda: not session_members(sid), f"session {sid} to exit", 30)
        self.proc = None

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGINT the leader (``fencewatch run`` stops its query and Spark on it), wait, then kill
        whatever is left. Returns the leader's exit code, ``None`` if it had to be killed."""
        if self.proc is None:
            return None
        code: int | None = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        return code


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float,
    alive: Iterable[ChildProcess] = (),
) -> None:
    """Poll ``condition``; fail when it times out or one of ``alive`` exits (with that log's tail)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        for child in alive:
            if not child.alive():
                raise AssertionError(
                    f"{child.argv[:4]} exited while waiting for {what}; log {child.log_path}:\n"
                    f"{child.log_tail()}"
                )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(POLL_SECONDS)


def keep_running(child: ChildProcess, seconds: float) -> None:
    """Let ``child`` run ``seconds`` more, failing if it exits meanwhile."""
    until = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= until, f"{seconds}s more of running", seconds + 5, alive=[child])


def fencewatch_run(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> ChildProcess:
    """``python -m fencewatch run ARGV`` as a (not yet started) child process; its
    metrics on a free port unless ARGV names one (tests run side by side)."""
    metrics = [] if "--metrics-port" in argv else ["--metrics-port", "0"]
    return ChildProcess([sys.executable, "-m", "fencewatch", "run", *argv, *metrics], log_path, env)


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers (one by default) on
    127.0.0.1, from the pyspark wheel, each worker with ``cores`` cores and
    ``memory``.

    Ports (RPC and web UI) are free ports picked at start. The workers run
    executors in ``work_dir`` (never inside the wheel): the first in
    ``executors/``, worker N > 1 in ``executors-N/``. A context manager;
    ``stop()`` kills every session, executors included. ``worker`` is the
    first worker, ``workers`` all of them.
    """

    def __init__(
        self,
        work_dir: Path,
        cores: int = 2,
        memory: str = "2g",
        timeout_s: float = 120.0,
        workers: int = 1,
    ):
        if workers < 1:
            raise ValueError(f"a cluster needs at least one worker, got {workers}")
        self.work_dir, self.cores, self.memory, self.timeout_s = work_dir, cores, memory, timeout_s
        self.worker_count = workers
        self.master: ChildProcess | None = None
        self.workers: list[ChildProcess] = []
        self.port = 0

    @property
    def worker(self) -> ChildProcess | None:
        """The first worker (``None`` before the start)."""
        return self.workers[0] if self.workers else None

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _spark_class(self, name: str, *args: str) -> ChildProcess:
        home = spark_home()
        env = child_env(SPARK_HOME=str(home), SPARK_NO_DAEMONIZE="1")
        argv = [str(home / "bin" / "spark-class"), *args]
        return ChildProcess(argv, self.work_dir / f"{name}.log", env)

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.master = self._spark_class(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(free_port())),
        )
        self.master.start()
        master = self.master
        wait_until(
            lambda: "I have been elected leader" in master.log_text(),
            f"the master on port {self.port} to lead",
            self.timeout_s,
            alive=[master],
        )
        self.workers = []
        for number in range(1, self.worker_count + 1):
            suffix = "" if number == 1 else f"-{number}"
            executors = self.work_dir / f"executors{suffix}"
            executors.mkdir(exist_ok=True)
            worker = self._spark_class(
                f"worker{suffix}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port())),
                *("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(executors)),
                self.url,
            )
            self.workers.append(worker)
            worker.start()
        count = self.worker_count
        wait_until(
            lambda: master.log_text().count("Registering worker") >= count,
            f"{count} worker(s) to register with the master",
            self.timeout_s,
            alive=[master, *self.workers],
        )

    def executor_logs(self) -> str:
        """Every executor's stderr, for failure messages."""
        parts = []
        for path in sorted(self.work_dir.glob("executors*/*/*/stderr")):
            parts.append(f"--- {path}\n{path.read_text(errors='replace')}")
        return "\n".join(parts)

    def stop(self) -> None:
        # The workers first: their sessions hold the executors.
        for child in (*self.workers, self.master):
            if child is not None:
                child.kill()

"""What Spark shows on the console of ``fencewatch run`` and ``fencewatch demo``.

The JVM prints a dozen lines at start-up (log4j's profile, the host name,
native-hadoop) and its Python workers more once batches run; a failed query
ends in a Java stack trace around a Python traceback. A normal run keeps all
of that in a log file and prints one line per failure that names the cause,
what to do, and the log file. ``--verbose`` leaves Spark's output on the
console and prints the whole error.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Any, NoReturn

from fencewatch.interrupts import signals_set
from fencewatch.options import fail
from streaming.checkpoint_lock import local_directory

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG_NAME = "fencewatch-spark.log"
# The line of a streaming.kafka_source.KafkaSourceError (or subclass) or a
# streaming.sinks.DeliveryFailed in the traceback Spark wraps around a failure
# of the Python source (planning on the driver, reading on executors) or of
# the sinks (foreachBatch, on the driver).
_SOURCE_ERROR = re.compile(r"^streaming\.(?:kafka_source|sinks)\.\w+: (.+)$", re.MULTILINE)
# A Python traceback's last line ("EOFError", "ValueError: bad"), and its frames.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception)(?:: .*)?$")
_OUR_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)$')
_MAX_CAUSE_CHARS = 400


def spark_log_path(checkpoint: str | None, prog: str) -> str:
    """Where Spark's output goes: beside a local checkpoint's state, so it
    survives restarts with it; else a new file in the temporary directory."""
    directory = local_directory(checkpoint) if checkpoint else None
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
        return os.path.join(directory, LOG_NAME)
    prefix = prog.replace(" ", "-") + "-"
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(fd)
    return path


def start_spark(
    prog: str,
    master: str,
    log_file: str | None,
    *,
    app_name: str = "fencewatch",
    shuffle_partitions: int = 2,
    jvm_options: str = "",
    kafka_connector: bool = False,
) -> SparkSession:
    """A session (streaming.job.spark_session) with its output in ``log_file``
    (None: on the console), with Spark's Kafka source if ``kafka_connector``;
    a JVM that does not start ends the command in one line."""
    from pyspark.errors import PySparkRuntimeError

    from streaming.job import spark_session

    try:
        return spark_session(
            master,
            app_name=app_name,
            shuffle_partitions=shuffle_partitions,
            log_file=log_file,
            jvm_options=jvm_options,
            kafka_connector=kafka_connector,
        )
    except PySparkRuntimeError as exc:
        if kafka_connector:
            from streaming import spark_kafka

            # Ivy copies the jars into the cache only once all of them resolved.
            if not spark_kafka.is_cached():
                fail(
                    prog,
                    f"Spark's Kafka source ({spark_kafka.PACKAGE}) could not be downloaded from Maven "
                    f"Central ({spark_kafka.MAVEN_CENTRAL}) into {spark_kafka.cache_dir()}",
                    "check this machine's access to Maven Central, or read with the Python source: "
                    "--kafka-source python" + _details(log_file),
                )
        fail(
            prog,
            f"Spark did not start ({exc.getCondition() or exc})",
            "check that Java 17 or 21 is installed (java -version), that JAVA_HOME points to it, and "
            "that the JVM takes the Java options given (--jvm-options)" + _details(log_file),
        )


def await_query(query: Any) -> bool:
    """Wait until ``query`` (a StreamingQuery) ends, or until SIGINT or SIGTERM
    asks for a stop, then stop it; True if a signal stopped it. Raises the
    query's StreamingQueryException if it failed.

    The signals only set a flag, checked between short waits: raised inside a
    py4j call (pyspark's own SIGINT handler cancels jobs from there), Ctrl-C
    printed py4j's tracebacks of the interrupted call."""
    asked = threading.Event()
    with signals_set(asked):
        while not asked.is_set():
            if query.awaitTermination(0.5):
                return False
        query.stop()
        return True


def query_failed(prog: str, error: BaseException, log_file: str | None, verbose: bool, todo: str) -> NoReturn:
    """End the command with one line for the streaming query's ``error``
    (a StreamingQueryException); with ``verbose``, the whole error first.
    ``todo``: what to do when the cause is not one fencewatch knows."""
    text = str(error)
    if verbose:
        print(text, file=sys.stderr)
    found = _SOURCE_ERROR.findall(text)
    if found:
        # Its message already says what to do: "<what> -- <todo>".
        what, _, found_todo = found[-1].partition(" -- ")
        fail(prog, f"the streaming job stopped: {what}", (found_todo or todo) + _details(log_file))
    fail(
        prog, f"the streaming job stopped: {_cause(text) or type(error).__name__}", todo + _details(log_file)
    )


def _cause(text: str) -> str:
    """The innermost Python exception in Spark's error text, with the last frame
    of this project's code it passed; else the error's first line."""
    lines = text.strip().splitlines()
    cause, frame, latest = "", "", ""
    for line in lines:
        found = _OUR_FRAME.match(line)
        if found and "site-packages" not in found["file"]:
            latest = f" (at {found['file']}:{found['line']} in {found['function']})"
        if _EXCEPTION_LINE.match(line):
            cause, frame = line, latest
    if not cause:
        return lines[0][:_MAX_CAUSE_CHARS] if lines else ""
    return cause[:_MAX_CAUSE_CHARS] + frame


def _details(log_file: str | None) -> str:
    return f"; details in {log_file}" if log_file else ""

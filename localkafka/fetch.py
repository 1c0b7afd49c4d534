"""Apache Kafka's jars from Maven Central, resolved once and cached.

Kafka's server is the Maven artifact ``org.apache.kafka:kafka_2.13``; its
published dependencies carry no logging backend (log4j is compile-only in
Kafka's build), and without one SLF4J is a no-op and no request log is
written. So the set resolved here is the server, Kafka's tools (from 4.3 the
dump tool lives in ``kafka-tools``), a logging backend for the line (log4j2 with
its SLF4J 1.x binding for 4.x, reload4j for 3.x) and, where it is served, the
storage module's test jar (test fixtures from 4.4), which holds ``LocalTieredStorage``: a remote storage
manager on a local directory, so that tiered storage and Kafka's own
``__remote_log_metadata`` run on one machine.

The resolver is Apache Ivy, which the pyspark wheel ships (Spark's
``--packages`` uses it): no Maven installation is needed. Ivy checks Maven
Central's checksums. The jars land in ``<cache>/kafka-<version>/lib``, made
aside and renamed into place, so an interrupted download never leaves a
half-filled directory that looks complete.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The newest Kafka line that resolved from Maven Central with its dependencies
# (checked 2026-12-07); `fencewatch kafka-lab --kafka-version` picks another.
DEFAULT_VERSION = "4.4.0"
_LOG4J2_VERSION = "2.24.3"
_RELOAD4J_VERSION = "1.7.36"
_LOCAL_TIERED_STORAGE_CLASS = "org/apache/kafka/server/log/remote/storage/LocalTieredStorage.class"
CACHE_ENV = "FENCEWATCH_CACHE_DIR"
# A directory of Kafka's jars the user already has (an unpacked distribution's
# libs/): used as it is, nothing fetched.
LIB_ENV = "FENCEWATCH_KAFKA_LIB"


class KafkaSetupError(RuntimeError):
    """Kafka could not be fetched or started; the message is one line that
    names the cause and what to do."""


@dataclass(frozen=True)
class KafkaJars:
    """A resolved Kafka: its version and the directory of its jars."""

    version: str
    lib_dir: Path

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def classpath(self) -> str:
        return str(self.lib_dir / "*")

    @property
    def has_tiered_storage_test_jar(self) -> bool:
        """Whether the storage module's test jar holds LocalTieredStorage: 3.x
        serves a test jar too, but the class came with tiered storage (3.6);
        the 3.2.3 and 3.3.2 jars lack it."""
        jars = [
            *self.lib_dir.glob("kafka-storage-*-test.jar"),
            *self.lib_dir.glob("kafka-storage-*-test-fixtures.jar"),
        ]
        for jar in jars:
            with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(jar) as archive:
                if _LOCAL_TIERED_STORAGE_CLASS in archive.namelist():
                    return True
        return False

    @property
    def dump_tool_class(self) -> str:
        """Kafka's DumpLogSegments: in the server jar up to 4.2, in kafka-tools from 4.3."""
        major, minor = (int(part) for part in self.version.split(".")[:2])
        if (major, minor) >= (4, 3):
            return "org.apache.kafka.tools.DumpLogSegments"
        return "kafka.tools.DumpLogSegments"


def cache_dir() -> Path:
    """Where fetched jars are kept: ``$FENCEWATCH_CACHE_DIR`` or ``~/.cache/fencewatch``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fencewatch"


def java_binary() -> str:
    """The ``java`` to start Kafka with: ``$JAVA_HOME/bin/java`` or the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not candidate or not Path(candidate).exists():
        raise KafkaSetupError(
            "no Java found -- install a JDK 17 or newer (Debian: apt-get install openjdk-17-jre-headless) "
            "or set JAVA_HOME"
        )
    return candidate


def java_major_version(java: str) -> int:
    """The feature version of ``java`` (17 for "17.0.15"), read from ``-version``."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise KafkaSetupError(f"cannot tell the version of {java} -- check that it runs: {java} -version")
    first = int(match.group(1))
    # Java 8 and older print "1.8.0_..."
    return int(match.group(2) or 0) if first == 1 else first


def dependencies(version: str) -> list[tuple[str, str, str, str | None]]:
    """The Maven coordinates to resolve for Kafka ``version``: (group, artifact, version, classifier)."""
    major = int(version.split(".")[0])
    coords: list[tuple[str, str, str, str | None]] = [("org.apache.kafka", "kafka_2.13", version, None)]
    if major >= 4:
        coords += [
            ("org.apache.kafka", "kafka-tools", version, None),
            ("org.apache.logging.log4j", "log4j-core", _LOG4J2_VERSION, None),
            ("org.apache.logging.log4j", "log4j-slf4j-impl", _LOG4J2_VERSION, None),
        ]
    else:
        coords.append(("org.slf4j", "slf4j-reload4j", _RELOAD4J_VERSION, None))
    coords.append(("org.apache.kafka", "kafka-storage", version, _storage_test_classifier(version)))
    return coords


def _storage_test_classifier(version: str) -> str:
    """The classifier of the storage jar holding LocalTieredStorage: the test
    jar up to 4.3, the test-fixtures jar (Gradle's java-test-fixtures) from 4.4."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return "test-fixtures" if (major, minor) >= (4, 4) else "test"


def _ivy_module(version: str, with_storage_test_jar: bool) -> str:
    lines = []
    for group, artifact, rev, classifier in dependencies(version):
        if classifier is None:
            lines.append(f'    <dependency org="{group}" name="{artifact}" rev="{rev}"/>')
        elif with_storage_test_jar:
            # The test jar beside the module's main jar: an <artifact> element
            # restricts Ivy to the artifacts it names, and the server needs the
            # main one (RemoteLogManagerConfig, UnifiedLog); without it listed the
            # resolved set lacked kafka-storage-<v>.jar and StorageTool failed
            # with NoClassDefFoundError. transitive="false": not the test jar's
            # own test-scope dependencies (the main jar's come through kafka_2.13).
            lines.append(
                f'    <dependency org="{group}" name="{artifact}" rev="{rev}" transitive="false">\n'
                f'      <artifact name="{artifact}" type="jar"/>\n'
                f'      <artifact name="{artifact}" type="jar" m:classifier="{classifier}"/>\n'
                "    </dependency>"
            )
    body = "\n".join(lines)
    return (
        '<ivy-module version="2.0" xmlns:m="http://ant.apache.org/ivy/maven">\n'
        f'  <info organisation="fencewatch" module="localkafka-{version}"/>\n'
        '  <configurations><conf name="default"/></configurations>\n'
        '  <dependencies defaultconf="default->default">\n'
        f"{body}\n"
        "  </dependencies>\n"
        "</ivy-module>\n"
    )


def _ivy_jar() -> Path:
    import pyspark

    jars = sorted((Path(pyspark.__file__).resolve().parent / "jars").glob("ivy-*.jar"))
    if not jars:
        raise KafkaSetupError(
            "pyspark's Apache Ivy jar is missing, so Kafka cannot be fetched -- reinstall pyspark, "
            f"or set {LIB_ENV} to a directory of Kafka's jars"
        )
    return jars[-1]


def fetch_kafka(
    version: str = DEFAULT_VERSION,
    *,
    progress: Callable[[str], None] | None = None,
) -> KafkaJars:
    """Kafka ``version``'s jars, fetched from Maven Central on first use.

    ``progress`` receives a line per artifact downloaded (the first fetch of a
    version moves about 55 MB). Raises :class:`KafkaSetupError` with one line
    when Java is missing or the registry cannot be reached.
    """
    given = os.environ.get(LIB_ENV)
    if given:
        lib = Path(given)
        if not any(lib.glob("kafka_2.13-*.jar")):
            raise KafkaSetupError(f"{LIB_ENV}={given} holds no kafka_2.13-*.jar -- point it at Kafka's libs/")
        found = next(lib.glob("kafka_2.13-*.jar")).name
        return KafkaJars(found.removeprefix("kafka_2.13-").removesuffix(".jar"), lib)
    home = cache_dir() / f"kafka-{version}"
    lib = home / "lib"
    if any(lib.glob(f"kafka_2.13-{version}.jar")):
        return KafkaJars(version, lib)
    java = java_binary()
    home.mkdir(parents=True, exist_ok=True)
    draft = Path(tempfile.mkdtemp(prefix="lib-", dir=home))
    try:
        _resolve(java, version, draft, with_storage_test_jar=True, progress=progress)
    except KafkaSetupError as first:
        if "kafka-storage" not in str(first):
            shutil.rmtree(draft, ignore_errors=True)
            raise
        # Not every release's test jar is served: Kafka runs without tiered storage.
        shutil.rmtree(draft, ignore_errors=True)
        draft = Path(tempfile.mkdtemp(prefix="lib-", dir=home))
        _resolve(java, version, draft, with_storage_test_jar=False, progress=progress)
    if lib.exists():
        shutil.rmtree(lib)
    draft.rename(lib)
    return KafkaJars(version, lib)


def _resolve(
    java: str,
    version: str,
    target: Path,
    *,
    with_storage_test_jar: bool,
    progress: Callable[[str], None] | None,
) -> None:
    module = target / "ivy.xml"
    module.write_text(_ivy_module(version, with_storage_test_jar))
    command = [
        java,
        "-jar",
        str(_ivy_jar()),
        "-ivy",
        str(module),
        "-cache",
        str(cache_dir() / "ivy"),
        "-confs",
        "default",
        "-retrieve",
        str(target / "[artifact]-[revision](-[classifier]).[ext]"),
    ]
    # Twice: a download cut halfway (seen here) fails a resolution the next try completes,
    # from the artifacts the first one cached.
    for attempt in (1, 2):
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        output: list[str] = []
        for line in proc.stdout:
            output.append(line.rstrip())
            if progress and "downloading" in line:
                progress(line.strip())
        if proc.wait() == 0:
            break
        if attempt == 2:
            raise KafkaSetupError(_ivy_failure(version, output))
    module.unlink()


def _ivy_failure(version: str, output: list[str]) -> str:
    """One line saying why Ivy could not resolve Kafka ``version``."""
    text = "\n".join(output)
    unresolved = re.findall(r"::\s+(\S+#\S+;[^:\s]+):\s*not found", text)
    if re.search(r"UnknownHost|Connection refused|connect timed out|Network is unreachable", text):
        return (
            f"cannot reach Maven Central to fetch Kafka {version} -- check the network or proxy, "
            f"or set {LIB_ENV} to a directory of Kafka's jars"
        )
    if unresolved:
        return (
            f"Maven Central did not serve {', '.join(unresolved)} twice in a row -- run again later, "
            "or pick another --kafka-version (4.4.0 and 3.2.3 resolved here)"
        )
    tail = " | ".join(line.strip() for line in output[-3:] if line.strip())
    return f"fetching Kafka {version} failed: {tail} -- run again with --verbose, or set {LIB_ENV}"

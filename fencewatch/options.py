"""Command-line options shared by the commands, each with an environment
variable override shown in ``--help``, and the checks of path-valued options.

Every command checks its paths before it starts any work, so a typo ends in one
line (``fencewatch <command>: <what> -- <what to do>``) and exit code 1, never
in a traceback or after a whole run. The checks cannot rule out a file that
changes afterwards; opening it still reports a failure in one line.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlparse

from detectors.config import ALL_NODES, DetectorConfig
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, MAX_RECORD_BYTES_ENV
from detectors.truth import TruthFileError, load_truth
from streaming.bucket_layout import check_buckets  # no Spark import

_DEFAULTS = DetectorConfig()


def env_default(name: str, default: int, unit: str = "milliseconds", minimum: int | None = None) -> int:
    """``$name`` as a whole number of ``unit`` if set, else ``default``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        fail("fencewatch", f"{name}={raw!r} is not a whole number of {unit}", f"fix or unset {name}")
    if minimum is not None and value < minimum:
        fail("fencewatch", f"{name}={raw!r} is below {minimum} {unit}", f"fix or unset {name}")
    return value


ALERTS_TOPIC = "fencewatch-alerts"


def add_bootstrap_servers_option(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-servers``, required unless env FENCEWATCH_BOOTSTRAP_SERVERS is set."""
    env = os.environ.get("FENCEWATCH_BOOTSTRAP_SERVERS")
    parser.add_argument(
        "--bootstrap-servers", default=env, required=env is None, help="env FENCEWATCH_BOOTSTRAP_SERVERS"
    )


def add_detector_options(parser: argparse.ArgumentParser) -> None:
    """Detection settings; every command measures clocks unless told not to
    (env FENCEWATCH_MEASURE_CLOCKS=0, --no-measure-clocks)."""
    group = parser.add_argument_group("detection")
    for flag, var, default, text in (
        (
            "--grace-ms",
            "FENCEWATCH_GRACE_MS",
            _DEFAULTS.grace_ms,
            "how long brokers may act on the previous view after a change",
        ),
        (
            "--lateness-ms",
            "FENCEWATCH_LATENESS_MS",
            _DEFAULTS.lateness_ms,
            "how far out of ts_ms order events may arrive",
        ),
        (
            "--quorum-fetch-timeout-ms",
            "FENCEWATCH_QUORUM_FETCH_TIMEOUT_MS",
            _DEFAULTS.quorum_fetch_timeout_ms,
            "the cluster's quorum.fetch.timeout.ms",
        ),
        (
            "--clock-limit-ms",
            "FENCEWATCH_CLOCK_LIMIT_MS",
            _DEFAULTS.clock_limit_ms,
            "a node whose measured clock offset interval is wider than this is 'clock uncertain': "
            "its time-dependent verdicts are counted, not raised",
        ),
        (
            "--clock-slack-ms",
            "FENCEWATCH_CLOCK_SLACK_MS",
            _DEFAULTS.clock_slack_ms,
            "how far below its measured upper bound a broker's clock offset is taken to lie",
        ),
        (
            "--clock-window-ms",
            "FENCEWATCH_CLOCK_WINDOW_MS",
            _DEFAULTS.clock_window_ms,
            "how far back a node's clock evidence counts",
        ),
        (
            "--idle-ms",
            "FENCEWATCH_IDLE_MS",
            _DEFAULTS.idle_ms,
            "a source silent this long (in the other sources' time) stops holding back judgments",
        ),
    ):
        group.add_argument(
            flag,
            type=int,
            default=env_default(var, default),
            metavar="MS",
            help=f"{text} (env {var}; default %(default)s)",
        )

    group.add_argument(
        "--measure-clocks",
        action=argparse.BooleanOptionalAction,
        default=env_default("FENCEWATCH_MEASURE_CLOCKS", 1, unit="(1: measure)") == 1,
        help="measure every node's clock against the metadata log's from what its requests knew, judge "
        "each request at every moment its clock allows, and say which clock is off; a bucket of the "
        "streaming job measures from its own partitions' requests (env FENCEWATCH_MEASURE_CLOCKS; "
        "default %(default)s; docs/architecture.md, 'Time and clocks')",
    )
    add_clock_bound_option(group)


def clock_bounds(text: str) -> tuple[tuple[int, int], ...]:
    """``--clock-bound-ms``'s value (and FENCEWATCH_CLOCK_BOUND_MS's): ``MS`` for
    every node, ``NODE=MS`` for one, several comma-separated."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        node, _, ms = part.rpartition("=")
        try:
            pair = (int(node) if node else ALL_NODES, int(ms))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not MS or NODE=MS (whole numbers)") from None
        if pair[1] < 0 or (node and pair[0] < 0):
            raise argparse.ArgumentTypeError(f"{part!r}: the node and the bound must not be negative")
        out.append(pair)
    return tuple(out)


def add_clock_bound_option(group: argparse._ArgumentGroup) -> None:
    """``--clock-bound-ms``, repeatable (DetectorConfig.clock_bounds)."""
    env = os.environ.get("FENCEWATCH_CLOCK_BOUND_MS")
    try:
        default = clock_bounds(env) if env else ()
    except argparse.ArgumentTypeError as exc:
        fail(
            "fencewatch",
            f"FENCEWATCH_CLOCK_BOUND_MS={env!r}: {exc}",
            "fix or unset FENCEWATCH_CLOCK_BOUND_MS",
        )
    group.add_argument(
        "--clock-bound-ms",
        type=clock_bounds,
        action="append",
        default=[default] if default else [],
        metavar="[NODE=]MS",
        help="what you know of the clocks: node NODE's clock (every node's without NODE=) is within MS "
        "of the metadata log's, the active controller's (with every host within E of true time by "
        "NTP/chrony, give 2E). It narrows the measured interval, so verdicts that hold for only some "
        "offsets of a wide interval can become certain; evidence that contradicts it wins and is "
        "reported. Repeatable, or comma-separated (env FENCEWATCH_CLOCK_BOUND_MS)",
    )
    group.add_argument(
        "--clock-bounds-from-prometheus",
        default=os.environ.get("FENCEWATCH_CLOCK_BOUNDS_FROM_PROMETHEUS"),
        metavar="URL",
        help="read each node's clock bound, once at the start, from the Prometheus at URL that scrapes "
        "node_exporter on its host: |node_timex_offset_seconds| + node_timex_maxerror_seconds, plus the "
        "largest of every host mapped (the metadata log's clock is the active controller's: map the "
        "controllers' hosts too); where --clock-bound-ms bounds a node too, the tighter wins "
        "(env FENCEWATCH_CLOCK_BOUNDS_FROM_PROMETHEUS)",
    )
    group.add_argument(
        "--clock-bound-instance",
        type=_node_instance,
        action="append",
        default=[],
        metavar="NODE=INSTANCE",
        help="with --clock-bounds-from-prometheus: node NODE's host is the one Prometheus labels "
        "instance=INSTANCE (e.g. 3=broker3:9100). Repeatable",
    )


def _node_instance(text: str) -> tuple[int, str]:
    """``--clock-bound-instance``'s value: ``NODE=INSTANCE``."""
    node, _, instance = text.partition("=")
    try:
        number = int(node)
    except ValueError:
        number = -1
    if number < 0 or not instance:
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE=INSTANCE (a node id, an instance label)")
    return number, instance


def _prometheus_bounds(
    args: argparse.Namespace, given: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    """``given`` merged with the bounds read from Prometheus, if asked
    (producers.prometheus_clock_bounds): a warning on stderr for each node
    that got none, one line and exit 1 if Prometheus cannot be asked."""
    from producers.prometheus_clock_bounds import PrometheusUnreachable, check_url, merged, read_bounds

    url = getattr(args, "clock_bounds_from_prometheus", None)
    instances = dict(getattr(args, "clock_bound_instance", None) or ())
    if not url:
        if instances:
            fail(
                "fencewatch", "--clock-bound-instance without --clock-bounds-from-prometheus", "give the URL"
            )
        return given
    try:
        url = check_url(url)
    except ValueError as exc:
        fail("fencewatch", f"--clock-bounds-from-prometheus: {exc}", "give Prometheus's URL")
    if not instances:
        fail(
            "fencewatch",
            "--clock-bounds-from-prometheus without --clock-bound-instance",
            "map each node to its host",
        )
    try:
        read = read_bounds(url, instances)
    except PrometheusUnreachable as exc:
        fail("fencewatch", f"--clock-bounds-from-prometheus: {exc}", "check the URL and that Prometheus runs")
    for warning in read.warnings:
        print(f"fencewatch: warning: {warning}", file=sys.stderr)
    return merged(given, read.bounds, ALL_NODES)


def detector_config(args: argparse.Namespace) -> DetectorConfig:
    bounds = tuple(pair for given in getattr(args, "clock_bound_ms", None) or () for pair in given)
    bounds = _prometheus_bounds(args, bounds)
    try:
        return DetectorConfig(
            grace_ms=args.grace_ms,
            lateness_ms=args.lateness_ms,
            quorum_fetch_timeout_ms=args.quorum_fetch_timeout_ms,
            clock_limit_ms=args.clock_limit_ms,
            clock_slack_ms=args.clock_slack_ms,
            clock_window_ms=args.clock_window_ms,
            idle_ms=args.idle_ms,
            measure_clocks=args.measure_clocks,
            clock_bounds=bounds,
        )
    except ValueError as exc:
        raise SystemExit(f"fencewatch: {exc}") from None


def _record_bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {value}")
    return value


def bucket_count(text: str) -> int:
    """The argparse type of ``--buckets`` (streaming.bucket_layout)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    try:
        return check_buckets(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--buckets ")) from None


def add_record_limit_option(parser: argparse.ArgumentParser) -> None:
    """``--max-record-bytes``: the largest line or request entry read; larger ones
    become ``too_large`` dead letters, and reading holds about this much at most."""
    parser.add_argument(
        "--max-record-bytes",
        type=_record_bytes,
        default=env_default(MAX_RECORD_BYTES_ENV, DEFAULT_MAX_RECORD_BYTES, "bytes", minimum=1),
        metavar="BYTES",
        help="the largest line, request-log entry or metadata-log record batch read; a larger one "
        "becomes a too_large dead letter and is skipped without being held in memory "
        f"(env {MAX_RECORD_BYTES_ENV}; default %(default)s)",
    )


# -- path-valued options ----------------------------------------------------------


def fail(prog: str, what: str, todo: str) -> NoReturn:
    """End the command with the one-line message of the project's CLI."""
    raise SystemExit(f"{prog}: {what} -- {todo}")


def _named(path: str, option: str | None) -> str:
    return f"{option} {path}" if option else path


@dataclass(frozen=True)
class _Unreachable:
    problem: str
    todo: str


def _stat(path: str) -> os.stat_result | _Unreachable:
    """The path's status, or what is wrong with reaching it and what to do."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return _Unreachable("no such file or directory", "check the path")
    except NotADirectoryError:
        return _Unreachable("a part of the path is a file, not a directory", "check the path")
    except PermissionError:
        return _Unreachable(
            "permission denied on a directory in the path", "choose a path this user can reach"
        )
    except OSError as exc:
        return _Unreachable(exc.strerror or str(exc), "check the path")


def input_file(prog: str, path: str | None, option: str | None = None) -> None:
    """``path`` must be a readable file (``-`` is stdin); None means not given."""
    if path is None or path == "-":
        return
    st = _stat(path)
    if isinstance(st, _Unreachable):
        fail(prog, f"cannot open {_named(path, option)}: {st.problem}", st.todo)
    if stat.S_ISDIR(st.st_mode):
        fail(prog, f"cannot open {_named(path, option)}: it is a directory", "name a file in it")
    if not os.access(path, os.R_OK):
        fail(prog, f"cannot open {_named(path, option)}: permission denied", "make it readable for this user")


def input_files(prog: str, paths: list[str]) -> None:
    """Every input (positional ``FILE...``) must be readable, before any is read."""
    for path in paths:
        input_file(prog, path)


def output_file(prog: str, path: str | None, option: str, *, with_siblings: bool = False) -> None:
    """``path`` must be a file this user can write or create (``-`` is stdout);
    None means not given. Nothing is created.

    with_siblings: its writer also creates files beside it (a new file renamed
    over it, SQLite's journal), so its directory must be writable even when
    the file exists."""
    if path is None or path == "-":
        return
    where = f"cannot write {option} {path}"
    if os.path.lexists(path):
        st = _stat(path)
        if isinstance(st, _Unreachable):
            fail(prog, f"{where}: {st.problem}", st.todo)
        if stat.S_ISDIR(st.st_mode):
            fail(prog, f"{where}: it is a directory", "name a file to write, e.g. a file inside it")
        if not os.access(path, os.W_OK):
            fail(prog, f"{where}: permission denied", "make it writable or choose another path")
        if not with_siblings:
            return
    _creatable(prog, where, os.path.dirname(os.path.abspath(path)))


def _creatable(prog: str, where: str, directory: str) -> None:
    st = _stat(directory)
    if isinstance(st, _Unreachable):
        fail(prog, f"{where}: directory {directory}: {st.problem}", "create it first or choose another path")
    if not stat.S_ISDIR(st.st_mode):
        fail(prog, f"{where}: {directory} is not a directory", "choose another path")
    if not os.access(directory, os.W_OK | os.X_OK):
        fail(prog, f"{where}: cannot create files in {directory} (permission denied)", "choose another path")


def output_dir(prog: str, path: str | None, option: str) -> None:
    """``path`` must be a directory this user can write, or one it can create
    (missing parents included). URLs of other file systems (``hdfs://``,
    ``s3a://``) are left to their client."""
    if path is None:
        return
    url = urlparse(path)
    if url.scheme not in ("", "file"):
        return
    local = url.path if url.scheme else path
    where = f"cannot use {option} {path}"
    existing = os.path.abspath(local)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    st = _stat(existing)
    if isinstance(st, _Unreachable):
        fail(prog, f"{where}: {st.problem}", st.todo)
    if not stat.S_ISDIR(st.st_mode):
        what = "it is a file" if existing == os.path.abspath(local) else f"{existing} is a file"
        fail(prog, f"{where}: {what}, not a directory", "name a directory (it is created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        fail(prog, f"{where}: {existing} is not writable (permission denied)", "choose another directory")


def truth_records(prog: str, path: str) -> list[dict[str, Any]]:
    """A simulator's ground truth (``--truth``), read and checked before any work."""
    input_file(prog, path, "--truth")
    try:
        return load_truth(path)
    except TruthFileError as exc:
        fail(
            prog,
            f"--truth {exc}",
            "pass the ground truth fencewatch simulate wrote (its --truth, or <output>.truth.jsonl)",
        )
    except OSError as exc:
        fail(prog, f"cannot open --truth {path}: {exc.strerror or exc}", "check the path")

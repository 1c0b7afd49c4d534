"""docker-compose.yml, the Dockerfile and the compose-side config files.

No Docker engine runs here, so the compose file is validated against the
official Compose Specification JSON schema, the one the ``check-jsonschema``
package (a dev dependency from PyPI) vendors from compose-spec/compose-spec,
and every command a fencewatch service runs is parsed by the real
``fencewatch`` argument parser. Prometheus, Alertmanager and Grafana's own
files are checked by test_prometheus_config.py and test_dashboards.py.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
PROMETHEUS_CONFIG = REPO_ROOT / "dashboards" / "prometheus" / "prometheus.yml"
WEBHOOKS_CONFIG = REPO_ROOT / "dashboards" / "fencewatch" / "webhooks.toml"
SECRET_KEY = re.compile(r"PASSWORD|SECRET|TOKEN|API_?KEY|PRIVATE|CREDENTIAL", re.IGNORECASE)
# What a named volume, bind mount or secret is for in this deployment.
REQUIRED_VOLUMES = {
    "checkpoint",
    "outbox",
    "prometheus-data",
    "grafana-data",
    "kafka-request-log",
    "ship-state",
}
DEPENDENCY_CONDITIONS = {"service_healthy", "service_completed_successfully", "service_started"}


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def compose_schema() -> dict[str, Any]:
    """The Compose Specification schema shipped in the check-jsonschema wheel."""
    try:
        import check_jsonschema
    except ImportError:
        pytest.fail(
            "check-jsonschema is not installed: it ships the Compose Specification schema; "
            "install the dev extra (pip install -e '.[dev]')",
            pytrace=False,
        )
    schema_file = resources.files(check_jsonschema) / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(schema_file.read_text(encoding="utf-8"))


def schema_errors(document: Any) -> list[str]:
    import jsonschema

    schema = compose_schema()
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def interpolated_default(value: str) -> str:
    """``${VAR:-default}`` -> default: what compose uses when VAR is unset."""
    return re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", value)


def mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of every short-syntax volume of a service ("" source: anonymous)."""
    out = []
    for volume in service.get("volumes", []):
        assert isinstance(volume, str), f"use the short volume syntax: {volume}"
        parts = volume.split(":")
        out.append(("", parts[0]) if len(parts) == 1 else (parts[0], parts[1]))
    return out


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# ---- the Compose Specification -------------------------------------------------------------


def test_compose_file_matches_the_compose_specification():
    schema = compose_schema()
    assert schema["title"] == "Compose Specification"
    assert schema_errors(compose()) == []


def test_the_schema_rejects_what_compose_rejects():
    document = compose()
    document["services"]["kafka"]["imagee"] = "typo"
    document["services"]["fencewatch"]["depends_on"]["kafka-init"]["condition"] = "service_ready"
    document["volumes"]["bad name!"] = {}
    errors = schema_errors(document)
    assert len(errors) >= 3, errors


def test_no_obsolete_version_key():
    assert "version" not in compose()


def test_every_service_has_a_healthcheck_or_says_why_not():
    for name, service in services().items():
        reason = service.get("x-healthcheck-reason")
        check = service.get("healthcheck")
        if reason:
            assert check is None, f"{name}: a healthcheck and a reason not to have one"
            continue
        assert check and not check.get("disable") and check["test"], f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert {"interval", "timeout", "retries", "start_period"} <= set(check), name


def test_dependencies_wait_for_health_or_completion():
    all_services = services()
    for name, service in all_services.items():
        for dependency, spec in service.get("depends_on", {}).items():
            assert dependency in all_services, f"{name} depends on unknown {dependency}"
            condition = spec["condition"]
            assert condition in DEPENDENCY_CONDITIONS, (name, dependency)
            target = all_services[dependency]
            if "healthcheck" in target:
                expected = {"service_healthy"}
            elif target.get("restart") == "no":
                expected = {"service_completed_successfully"}  # a one-shot service
            else:
                expected = {"service_started"}
            assert condition in expected, f"{name} -> {dependency}: {condition}, expected {expected}"


def test_volumes_are_named_or_existing_repo_paths():
    document = compose()
    declared = set(document["volumes"])
    assert declared >= REQUIRED_VOLUMES
    used = set()
    for name, service in document["services"].items():
        for source, target in mounts(service):
            assert source, f"{name}: anonymous volume at {target}; name it"
            if source.startswith("."):
                assert (REPO_ROOT / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
                used.add(source)
    assert used == declared, f"declared but unused: {declared - used}"


def test_the_checkpoint_is_shared_by_the_driver_and_the_worker():
    all_services = services()
    job_command = all_services["fencewatch"]["command"]
    checkpoint = option(job_command, "--checkpoint")
    for name in ("fencewatch", "spark-worker"):
        assert ("checkpoint", checkpoint) in mounts(all_services[name]), name
    outbox = Path(option(job_command, "--webhook-outbox"))
    assert ("outbox", str(outbox.parent)) in mounts(all_services["fencewatch"])


def test_secrets_and_env_files_exist():
    document = compose()
    for name, secret in document["secrets"].items():
        assert (REPO_ROOT / interpolated_default(secret["file"])).is_file(), name
        # Overridable: the development file is only the default.
        assert secret["file"].startswith("${"), f"secret {name}: let an env var point at a real secret"
    for name, service in document["services"].items():
        for secret in service.get("secrets", []):
            assert secret in document["secrets"], (name, secret)
        for env_file in service.get("env_file", []):
            assert (REPO_ROOT / env_file).is_file(), (name, env_file)


def env_file_entries(path: Path) -> dict[str, str]:
    entries = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            entries[key.strip()] = value.strip()
    return entries


def test_no_secret_value_inline():
    problems = []
    for name, service in services().items():
        environment = dict(service.get("environment", {}))
        for env_file in service.get("env_file", []):
            environment.update(env_file_entries(REPO_ROOT / env_file))
        for key, value in environment.items():
            if SECRET_KEY.search(key) and not (
                key.endswith("_FILE") and str(value).startswith("/run/secrets/")
            ):
                problems.append(f"{name}: {key} holds a secret value; use a compose secret and {key}__FILE")
        command = service.get("command", [])
        words = command if isinstance(command, list) else shlex.split(command)
        for flag, word in zip(["", *words], words, strict=False):
            # A secret's file path is fine; the secret itself is not.
            if flag.endswith("-file") and word.startswith("/run/secrets/"):
                continue
            if SECRET_KEY.search(word) and not (word.endswith("-file") or word.startswith("/run/secrets/")):
                problems.append(f"{name}: secret on the command line: {word}")
            elif word.startswith("/run/secrets/"):
                problems.append(f"{name}: {word} follows {flag!r}, not a --*-file option")
    assert problems == []


def test_the_webhooks_config_keeps_secrets_out():
    text = WEBHOOKS_CONFIG.read_text(encoding="utf-8")
    assert not re.search(r"^\s*secret\s*=", text, re.MULTILINE)
    assert re.findall(r'secret_file\s*=\s*"([^"]+)"', text) and all(
        path == "/run/secrets/webhook_hmac" for path in re.findall(r'secret_file\s*=\s*"([^"]+)"', text)
    )


# ---- ports and addresses -------------------------------------------------------------------


def test_prometheus_targets_are_the_ports_the_services_listen_on():
    all_services = services()
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    targets = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    targets += config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    for address in targets:
        host, port = address.rsplit(":", 1)
        service = all_services["prometheus" if host == "localhost" else host]
        assert port in service["expose"], f"{host} does not expose {port}"
    job_command = all_services["fencewatch"]["command"]
    assert "fencewatch:9464" in targets
    assert option(job_command, "--metrics-port") == "9464"


def test_the_job_reaches_kafka_spark_and_its_webhooks_by_service_name():
    all_services = services()
    job = all_services["fencewatch"]
    command = job["command"]
    kafka_env = all_services["kafka"]["environment"]
    assert f"PLAINTEXT://{option(command, '--bootstrap-servers')}" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]
    master = all_services["spark-master"]["command"]
    assert option(command, "--master") == f"spark://{option(master, '--host')}:{option(master, '--port')}"
    # Executors connect back to the driver by this name.
    env = env_file_entries(REPO_ROOT / job["env_file"][0])
    assert env["FENCEWATCH_DRIVER_HOST"] == job["hostname"] == "fencewatch"
    webhooks = option(command, "--webhooks")
    assert ("./dashboards/fencewatch/webhooks.toml", webhooks) in [
        (s, t) for s, t in ((v.split(":")[0], v.split(":")[1]) for v in job["volumes"])
    ]
    # The simulator writes the topic the job reads, and kafka-init creates it.
    topic = option(command, "--topic")
    assert option(all_services["simulator"]["command"], "--topic") == topic
    assert topic in all_services["kafka-init"]["command"][0]


def test_the_example_webhooks_config_loads_and_targets_the_receiver(tmp_path):
    from webhooks.config import load_endpoints

    # Where compose mounts the secret, the test puts the development secret file.
    secret = interpolated_default(compose()["secrets"]["webhook_hmac"]["file"])
    text = WEBHOOKS_CONFIG.read_text(encoding="utf-8").replace(
        "/run/secrets/webhook_hmac", str(REPO_ROOT / secret)
    )
    config = tmp_path / "webhooks.toml"
    config.write_text(text, encoding="utf-8")
    environ = env_file_entries(REPO_ROOT / "dashboards" / "fencewatch" / "fencewatch.env")
    endpoints = load_endpoints(config, environ)
    assert {e.format for e in endpoints} == {"json", "alertmanager", "slack"}
    receiver = services()["webhook-receiver"]["command"]
    for endpoint in endpoints:
        assert endpoint.url.startswith(f"http://webhook-receiver:{option(receiver, '--port')}/"), (
            endpoint.name
        )
        assert endpoint.secret is not None, endpoint.name
    # The receiver keeps /alertmanager for Alertmanager's own unsigned posts.
    assert all(not e.url.endswith("/alertmanager") for e in endpoints)


# ---- the commands and the image ------------------------------------------------------------


def test_every_fencewatch_command_parses_with_the_real_cli():
    from fencewatch.cli import build_parser

    parser = build_parser()
    commands = [s["command"] for s in services().values() if s.get("command", [""])[0] == "fencewatch"]
    # run, simulate, ship metadata-log and request-log, and the signed and the Alertmanager
    # webhook receivers
    assert len(commands) == 6
    for command in commands:
        args = parser.parse_args(command[1:])
        assert args.command == command[1]


def test_the_metadata_log_sidecar_follows_kafkas_own_log_read_only_and_keeps_its_state_apart():
    from fencewatch.cli import build_parser

    service = services()["ship-metadata-log"]
    args = build_parser().parse_args(service["command"][1:])
    mounts = dict(v.split(":", 1) for v in service["volumes"])
    kafka_dir = services()["kafka"]["environment"]["KAFKA_LOG_DIRS"]
    # Without metadata.log.dir, Kafka keeps the metadata log in its first log dir.
    assert args.directory == f"{kafka_dir}/__cluster_metadata-0"
    assert mounts["kafka-data"] == f"{kafka_dir}:ro"
    state_dir = args.state_file.rsplit("/", 1)[0]
    assert state_dir in mounts.values() and not state_dir.startswith(kafka_dir)


def kafka_log4j2() -> tuple[str, dict[str, Any]]:
    """Where the kafka service's log4j2 configuration is, in the container, and its content."""
    kafka = services()["kafka"]
    opts = kafka["environment"]["KAFKA_LOG4J_OPTS"].split()
    (config,) = [o.split("=", 1)[1] for o in opts if o.startswith("-Dlog4j2.configurationFile=")]
    path = config.removeprefix("file:")
    (source,) = [s for s, t in mounts(kafka) if t == path]
    assert f"{source}:{path}:ro" in kafka["volumes"]
    return path, yaml.safe_load((REPO_ROOT / source).read_text(encoding="utf-8"))["Configuration"]


def request_log_file(config: dict[str, Any]) -> tuple[str, str]:
    """The file kafka.request.logger's appender writes (properties resolved), and its layout pattern."""
    properties = {p["name"]: p["value"] for p in config["Properties"]["Property"]}
    (logger,) = [lg for lg in config["Loggers"]["Logger"] if lg["name"] == "kafka.request.logger"]
    # DEBUG is the level at which Kafka writes "Completed request:{json}" (RequestChannel).
    assert logger["level"] == "DEBUG"
    assert logger["additivity"] is False, "request lines must not also flood stdout"
    (ref,) = [r["ref"] for r in logger["AppenderRef"]]
    appenders = config["Appenders"]["RollingFile"]
    (appender,) = [a for a in ([appenders] if isinstance(appenders, dict) else appenders) if a["name"] == ref]

    def resolve(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: properties[m.group(1)], value)

    return resolve(appender["fileName"]), resolve(appender["PatternLayout"]["pattern"])


def test_kafka_writes_its_request_log_at_debug_to_a_volume():
    kafka = services()["kafka"]
    _path, config = kafka_log4j2()
    file, _pattern = request_log_file(config)
    directory, _, name = file.rpartition("/")
    assert name == "kafka-request.log"
    volume = {t: s for s, t in mounts(kafka)}[directory]
    assert volume in compose()["volumes"], f"{directory} is not on a named volume"
    # The root logger keeps Kafka's other logs on stdout, out of the shipped file.
    assert [r["ref"] for r in config["Loggers"]["Root"]["AppenderRef"]] == ["STDOUT"]


def test_the_request_log_pattern_is_what_the_shipper_parses():
    from detectors.envelope import Envelope
    from detectors.parse_request_log import iter_request_log

    _file, pattern = request_log_file(kafka_log4j2()[1])
    body = {
        "isForwarded": False,
        "requestHeader": {"requestApiKey": 0, "requestApiVersion": 13, "correlationId": 7, "clientId": "p"},
        "request": {"acks": -1, "topicData": [{"name": "t", "partitionData": [{"index": 0}]}]},
        "response": {"responses": [{"name": "t", "partitionResponses": [{"index": 0, "errorCode": 0}]}]},
    }
    # log4j2's %d without a format is "yyyy-MM-dd HH:mm:ss,SSS".
    fields = {
        "d": "2026-11-20 10:15:02,345",
        "p": "DEBUG",
        "m": "Completed request:" + json.dumps(body),
        "c": "kafka.request.logger",
        "n": "\n",
    }
    line = re.sub(r"%(\w)", lambda m: fields[m.group(1)], pattern)
    items = list(iter_request_log(iter([line.encode()]), source="kafka-request.log", cluster="c", node=1))
    assert len(items) == 1 and isinstance(items[0], Envelope), items
    stamp = datetime(2026, 11, 20, 10, 15, 2, 345000, tzinfo=UTC)
    assert items[0].ts_ms == int(stamp.timestamp() * 1000)
    assert items[0].body["requestHeader"]["correlationId"] == 7


def test_the_request_log_sidecar_follows_kafkas_file_read_only_and_keeps_its_state_apart():
    from fencewatch.cli import build_parser

    all_services = services()
    service = all_services["ship-request-log"]
    args = build_parser().parse_args(service["command"][1:])
    assert (args.command, args.format) == ("ship", "request-log")
    file, _pattern = request_log_file(kafka_log4j2()[1])
    kafka_dir, _, name = file.rpartition("/")
    volume = {t: s for s, t in mounts(all_services["kafka"])}[kafka_dir]
    sidecar_dir, _, sidecar_name = args.file.rpartition("/")
    assert sidecar_name == name
    assert f"{volume}:{sidecar_dir}:ro" in service["volumes"]
    # Kafka stamps the file with its own node id; the metadata log's sidecar names the same cluster.
    assert args.node == int(all_services["kafka"]["environment"]["KAFKA_NODE_ID"])
    metadata_log = build_parser().parse_args(all_services["ship-metadata-log"]["command"][1:])
    assert args.cluster == metadata_log.cluster
    job = all_services["fencewatch"]["command"]
    assert args.topic == option(job, "--topic") == metadata_log.topic
    assert args.dead_letter_topic == metadata_log.dead_letter_topic
    assert args.dead_letter_topic in all_services["kafka-init"]["command"][0]
    assert args.bootstrap_servers == option(job, "--bootstrap-servers")
    # A fresh stack ships what Kafka wrote before the sidecar started.
    assert args.from_beginning
    state_dir = args.state_file.rsplit("/", 1)[0]
    writable = {t for s, t in mounts(service) if not any(v == f"{s}:{t}:ro" for v in service["volumes"])}
    assert state_dir in writable
    assert args.state_file != metadata_log.state_file
    assert service["depends_on"] == {"kafka-init": {"condition": "service_completed_successfully"}}


def test_the_image_creates_the_directories_its_services_write_volumes_to():
    """A fresh named volume takes the owner of the directory it is mounted on; one the
    image does not create is root's, and the image's unprivileged user cannot write it."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    for name, service in services().items():
        if service.get("image") != "fencewatch:local":
            continue
        for volume in service.get("volumes", []):
            source, target, *mode = volume.split(":")
            if source.startswith(".") or mode == ["ro"]:
                continue
            assert re.search(rf"mkdir -p [^&]*{re.escape(target)}(\s|$)", text), (name, target)


def test_spark_processes_come_from_the_fencewatch_image():
    for name in ("spark-master", "spark-worker"):
        service = services()[name]
        assert service["image"] == services()["fencewatch"]["image"]
        assert service["command"][0] == "spark-class"
    assert (
        services()["spark-worker"]["command"][2]
        == services()["fencewatch"]["command"][services()["fencewatch"]["command"].index("--master") + 1]
    )


def test_fencewatch_services_build_the_image_from_the_dockerfile():
    for name, service in services().items():
        if service.get("image") == "fencewatch:local":
            assert service["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name


def test_the_dockerfile_installs_java_and_the_project():
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim-bookworm$", text, re.MULTILINE)
    assert "openjdk-17-jre-headless" in text
    assert re.search(r"pip install \.(\s|$)", text)
    assert re.search(r"^USER \w+", text, re.MULTILINE), "run as an unprivileged user"


def test_the_dockerfile_copies_what_pip_install_needs():
    import tomllib

    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    copied = set()
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if line.startswith("COPY "):
            *sources, _dest = line.split()[1:]
            copied.update(sources)
    ignored = {line.strip() for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines() if line.strip()}
    for source in copied:
        assert (REPO_ROOT / source).exists(), source
        assert source not in ignored, f"{source} is copied but .dockerignore excludes it"
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, f"the image misses packages {packages - copied}"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied

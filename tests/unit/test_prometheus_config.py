"""Prometheus and Alertmanager configuration (dashboards/prometheus/, dashboards/alertmanager/),
checked with the real promtool and amtool (Debian packages prometheus, prometheus-alertmanager).

A missing tool fails these tests with the packages to install; it never skips them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dashboard_queries import REPO_ROOT, require_tool

PROMETHEUS_DIR = REPO_ROOT / "dashboards" / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES_FILE = PROMETHEUS_DIR / "rules" / "fencewatch.rules.yml"
RULES_TESTS = PROMETHEUS_DIR / "tests" / "fencewatch.rules.test.yml"
ALERTMANAGER_CONFIG = REPO_ROOT / "dashboards" / "alertmanager" / "alertmanager.yml"
OPERATIONS = REPO_ROOT / "docs" / "operations.md"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
SEVERITIES = {"critical", "warning", "info"}


def run_tool(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def yaml_file(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml_file(RULES_FILE)["groups"] for rule in group["rules"] if "alert" in rule]


def markdown_anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped, spaces to -."""
    anchors: set[str] = set()
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match and not in_code:
            base = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            anchor, n = base, 0
            while anchor in anchors:
                n += 1
                anchor = f"{base}-{n}"
            anchors.add(anchor)
    return anchors


# ---- the real tools ------------------------------------------------------------------------


def test_promtool_check_config_with_its_rule_files():
    done = run_tool("promtool", "check", "config", str(PROMETHEUS_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    # The rule_files glob must find the rules file, not nothing.
    assert "SUCCESS: 1 rule files found" in done.stdout + done.stderr
    assert str(RULES_FILE.relative_to(PROMETHEUS_DIR)) in done.stdout + done.stderr


def test_promtool_check_rules():
    done = run_tool("promtool", "check", "rules", str(RULES_FILE))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_unit_tests_pass():
    done = run_tool("promtool", "test", "rules", str(RULES_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_rule_unit_tests_can_fail(tmp_path):
    # The same tests against alert rules that never fire must fail.
    doc = yaml_file(RULES_FILE)
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["expr"] = f"({rule['expr']}) and absent(vector(1))"
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES_FILE.name).write_text(yaml.safe_dump(doc), encoding="utf-8")
    (tmp_path / "tests" / RULES_TESTS.name).write_text(RULES_TESTS.read_text(encoding="utf-8"))
    done = run_tool("promtool", "test", "rules", str(tmp_path / "tests" / RULES_TESTS.name))
    assert done.returncode != 0, done.stdout
    failed = set(re.findall(r"alertname: (\w+),", done.stdout + done.stderr))
    assert failed == {rule["alert"] for rule in alert_rules()}


def test_amtool_check_config():
    done = run_tool("amtool", "check-config", str(ALERTMANAGER_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (
            ["severity=critical", "alertname=FencewatchCriticalViolation", "cluster=prod"],
            "fencewatch-critical",
        ),
        (["severity=critical", "alertname=FencewatchJobDown"], "fencewatch-critical"),
        (["severity=warning", "alertname=FencewatchFallingBehind"], "fencewatch-warning"),
        (["alertname=SomethingElse"], "fencewatch-warning"),
    ],
)
def test_alertmanager_routes_by_severity(labels, receiver):
    done = run_tool(
        "amtool",
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER_CONFIG}",
        f"--verify.receivers={receiver}",
        *labels,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_missing_tool_fails_with_the_packages_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="prometheus prometheus-alertmanager"):
        require_tool("promtool")


# ---- the rules -----------------------------------------------------------------------------


def test_every_alert_has_severity_summary_description_and_a_runbook():
    anchors = markdown_anchors(OPERATIONS.read_text(encoding="utf-8"))
    import detectors.rules  # noqa: F401 - registers the rules
    from detectors.rules.base import RULES

    rules = alert_rules()
    assert len(rules) >= 10
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        url = annotations["runbook_url"]
        prefix = "docs/operations.md#"
        assert url.startswith(prefix), (name, url)
        anchor = url[len(prefix) :]
        if anchor == "{{ $labels.rule | toLower }}":
            missing = [r for r in RULES if r.lower() not in anchors]
            assert missing == [], f"{name}: docs/operations.md has no runbook for {missing}"
        else:
            assert anchor in anchors, f"{name}: no heading for #{anchor} in docs/operations.md"


def test_every_alert_is_unit_tested_firing_and_not_firing():
    tested: dict[str, set[bool]] = {}
    for case in yaml_file(RULES_TESTS)["tests"]:
        for check in case.get("alert_rule_test", []):
            tested.setdefault(check["alertname"], set()).add(bool(check.get("exp_alerts")))
    for rule in alert_rules():
        assert tested.get(rule["alert"]) == {True, False}, (
            f"{rule['alert']}: needs a promtool test where it fires and one where it does not"
        )


def test_rules_select_the_job_prometheus_scrapes():
    jobs = {c["job_name"] for c in yaml_file(PROMETHEUS_CONFIG)["scrape_configs"]}
    selected = set(re.findall(r'job="([^"]+)"', RULES_FILE.read_text(encoding="utf-8")))
    assert selected and selected <= jobs


def test_prometheus_loads_the_rules_and_alerts_alertmanager():
    config = yaml_file(PROMETHEUS_CONFIG)
    matched = {p for pattern in config["rule_files"] for p in PROMETHEUS_DIR.glob(pattern)}
    assert RULES_FILE in matched
    (alertmanagers,) = config["alerting"]["alertmanagers"]
    assert alertmanagers["static_configs"][0]["targets"] == ["alertmanager:9093"]


# ---- Alertmanager --------------------------------------------------------------------------


def test_alertmanager_posts_to_the_compose_webhook_receiver():
    config = yaml_file(ALERTMANAGER_CONFIG)
    urls = {hook["url"] for r in config["receivers"] for hook in r.get("webhook_configs", [])}
    assert urls == {"http://alertmanager-receiver:9000/alertmanager"}
    receiver = yaml_file(COMPOSE_FILE)["services"]["alertmanager-receiver"]
    command = receiver["command"]
    assert command[:2] == ["fencewatch", "receive-webhooks"]
    assert command[command.index("--port") + 1] == "9000"
    # Alertmanager cannot sign: a receiver with a secret would refuse every notification.
    assert "--secret-file" not in command and "secrets" not in receiver


def test_inhibit_rules_name_existing_alerts():
    names = [rule["alert"] for rule in alert_rules()]
    for inhibit in yaml_file(ALERTMANAGER_CONFIG)["inhibit_rules"]:
        for matcher in inhibit["source_matchers"] + inhibit["target_matchers"]:
            match = re.fullmatch(r'alertname(=~|=)"([^"]+)"', matcher)
            assert match, matcher
            op, value = match.groups()
            pattern = value if op == "=~" else re.escape(value)
            alternatives = pattern.split("|")
            for alternative in alternatives:
                assert any(re.fullmatch(alternative, n) for n in names), f"{alternative} matches no alert"


def test_operations_doc_links_resolve():
    text = OPERATIONS.read_text(encoding="utf-8")
    anchors = markdown_anchors(text)
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links and [link for link in links if link not in anchors] == []


def test_markdown_anchors_follow_github():
    text = "# Runbook\n## FencewatchJobDown\n### QUORUM_ZOMBIE_LEADER\n## Job down?\n## Job down\n"
    assert markdown_anchors(text) == {
        "runbook",
        "fencewatchjobdown",
        "quorum_zombie_leader",
        "job-down",
        "job-down-1",
    }

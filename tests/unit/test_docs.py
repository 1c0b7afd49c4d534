"""docs/rules.md's example alerts are real detector output, and stay current."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rule_examples_in_docs_match_the_detector():
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_rule_examples.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_has_a_section_in_docs():
    import detectors.rules  # noqa: F401 - registers the rules
    from detectors.rules.base import RULES

    text = (ROOT / "docs" / "rules.md").read_text()
    assert [r for r in RULES if f"\n## {r}" not in text] == []


def test_every_probe_rule_has_a_section_in_docs():
    from detectors.probe_rules import PROBE_RULES

    text = (ROOT / "docs" / "rules.md").read_text()
    assert [r for r in PROBE_RULES if f"\n## {r}" not in text] == []

"""The packages' dependency direction (docs/architecture.md, "Packages"), read
from every module's imports, including those inside functions; and the
project's lists of its packages, which must agree."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("detectors", "producers", "webhooks", "streaming", "localkafka", "probe", "incidents", "fencewatch")
# package -> the project packages it may import besides itself
ALLOWED = {
    "detectors": set(),
    "producers": {"detectors"},
    "webhooks": {"detectors"},
    "streaming": {"detectors", "webhooks"},
    # The real Kafka that fencewatch watches is no part of its judgment.
    "localkafka": set(),
    # The command hands the probe the job's metrics and alerts topic.
    "probe": {"detectors", "webhooks"},
    "incidents": {"detectors"},
    "fencewatch": {"detectors", "producers", "webhooks", "streaming", "localkafka", "probe", "incidents"},
}


def project_imports(path: Path) -> set[str]:
    """The project packages a module imports (the first part of each module name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in PACKAGES)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_it_may(package: str) -> None:
    problems = []
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        extra = project_imports(path) - ALLOWED[package] - {package}
        if extra:
            problems.append(f"{path.relative_to(REPO_ROOT)} imports {sorted(extra)}")
    assert problems == []


def test_webhook_delivery_is_its_own_package_not_spark() -> None:
    assert not (REPO_ROOT / "streaming" / "webhooks").exists()
    assert (REPO_ROOT / "webhooks" / "__init__.py").is_file()


def test_the_ship_command_only_parses_and_wires() -> None:
    """The shippers live in producers/; fencewatch/ship.py defines no class of its own."""
    tree = ast.parse((REPO_ROOT / "fencewatch" / "ship.py").read_text(encoding="utf-8"))
    assert [node.name for node in tree.body if isinstance(node, ast.ClassDef)] == []
    shippers = {path.stem for path in (REPO_ROOT / "producers").glob("*_shipper.py")}
    assert {"request_log_shipper", "quorum_state_shipper", "metadata_log_shipper", "dump_shipper"} <= shippers


def test_every_list_of_the_packages_names_the_same_ones() -> None:
    """The packages are named in four places (setuptools' ``include``, mypy's
    ``packages``, the Makefile's ``PACKAGES`` that ``make test`` byte-compiles,
    and this file's): a package added to the tree and left out of one of them
    would go unbuilt, unchecked or unchecked for its imports."""
    on_disk = {path.parent.name for path in REPO_ROOT.glob("*/__init__.py")} - {"tests"}
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found = pyproject["tool"]["setuptools"]["packages"]["find"]
    include = {pattern.rstrip("*") for pattern in found["include"]}
    mypy = set(pyproject["tool"]["mypy"]["packages"])
    make = re.search(r"^PACKAGES := (.+)$", (REPO_ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert make is not None, "the Makefile's PACKAGES line"
    lists = {
        "setuptools include": include,
        "mypy packages": mypy,
        "Makefile PACKAGES": set(make[1].split()),
        "test_package_layout.PACKAGES": set(PACKAGES),
    }
    assert {name: names for name, names in lists.items() if names != on_disk} == {}, on_disk

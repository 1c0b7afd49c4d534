"""The packages' dependency direction (docs/architecture.md, "Packages"), read
from every module's imports, including those inside functions and under
TYPE_CHECKING; no import circle between any two modules; each package saying
what it holds and may import; and the project's lists of its packages, which
must agree."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "detectors",
    "producers",
    "webhooks",
    "streaming",
    "localkafka",
    "probe",
    "incidents",
    "lab",
    "fencewatch",
)
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
    # The lab runs fencewatch's commands as child processes; it imports none of them.
    "lab": {"detectors", "producers", "localkafka"},
    # The command package parses arguments, checks them and wires all the others.
    "fencewatch": {
        "detectors",
        "producers",
        "webhooks",
        "streaming",
        "localkafka",
        "probe",
        "incidents",
        "lab",
    },
}
# Where the command package may be imported from besides itself: the entry point.
COMMAND = "fencewatch"
ENTRY_POINT = "fencewatch.cli:main"


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


def modules() -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by its own)."""
    found = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in it: ``from a.b import c``
    is module ``a.b.c`` where that is a module, else ``a.b``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    found.add(f"{module}.{alias.name}")
                elif module in known:
                    found.add(module)
    found.discard(name)
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's
    algorithm): each is a set of modules that import each other round a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_no_module_imports_itself_round_a_circle() -> None:
    """Lazy imports count too: a circle through one still ties the two modules'
    meanings together (convert and convert_metadata_log once did)."""
    known = modules()
    graph = {name: imported_modules(name, path, known) for name, path in known.items()}
    assert import_circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_the_command_package_is_imported_by_nothing_but_its_entry_point() -> None:
    importers = sorted(package for package, allowed in ALLOWED.items() if COMMAND in allowed)
    assert importers == []
    assert set(ALLOWED[COMMAND]) == set(PACKAGES) - {COMMAND}
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["scripts"] == {COMMAND: ENTRY_POINT}


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_says_what_it_holds_and_may_import(package: str) -> None:
    """Its ``__init__`` docstring, which a newcomer reads first, names the
    packages it may import."""
    tree = ast.parse((REPO_ROOT / package / "__init__.py").read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    assert doc, f"{package}/__init__.py has no docstring"
    assert "import" in doc.lower()
    assert [name for name in sorted(ALLOWED[package]) if name not in doc] == []


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
    """The shippers live in producers/; fencewatch/ship.py and each format's
    wiring (fencewatch/ship_*.py, fencewatch/shipping.py) define no class of their own."""
    for path in sorted((REPO_ROOT / "fencewatch").glob("ship*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert [node.name for node in tree.body if isinstance(node, ast.ClassDef)] == [], path.name
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

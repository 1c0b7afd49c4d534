# Two commands a newcomer needs: `make demo` and `make test`. Both create the
# virtual environment on first use, so nothing has to be installed by hand.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PACKAGES := detectors producers streaming webhooks localkafka probe incidents lab fencewatch

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

.PHONY: demo test test-extended lint system-deps
demo: $(VENV)/.installed
	@bash .ci/system-deps java
	$(BIN)/fencewatch demo

# The e2e and integration tests run first and alone: a real broker, Spark's JVM and
# its workers and their timed waits need both cores. The unit tests are
# single-threaded Python, so they then run on every core at once (pytest-xdist).
# Our packages are compiled first: where PYTHONDONTWRITEBYTECODE is set (as on
# this machine kind), every process the tests start (Spark's Python workers, the
# CLI children) would otherwise compile them again. Each tier ends with its
# slowest tests, for CI's time budget.
test: $(VENV)/.installed system-deps
	$(BIN)/python -m compileall -q $(PACKAGES)
	$(BIN)/python -m pytest -q --durations=15 -m "not extended" tests/e2e tests/integration
	$(BIN)/python -m pytest -q --durations=15 -n auto -m "not extended" tests/unit

# The heavy tests `make test` leaves out (tests/README.md): run before a release.
test-extended: $(VENV)/.installed system-deps
	$(BIN)/python -m compileall -q $(PACKAGES)
	$(BIN)/python -m pytest -q --durations=15 -m extended tests

# Java for Spark; Prometheus and Alertmanager for the observability tests; Chromium
# and chromedriver for the incident report's browser test.
system-deps:
	@bash .ci/system-deps

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

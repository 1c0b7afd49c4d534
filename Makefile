# Two commands a newcomer needs: `make demo` and `make test`. Both create the
# virtual environment on first use, so nothing has to be installed by hand.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

.PHONY: demo test lint system-deps
demo: $(VENV)/.installed
	@bash .ci/system-deps java
	$(BIN)/fencewatch demo

# The e2e and integration tests run first and alone: a real broker, Spark's JVM and
# its workers and their timed waits need both cores. The unit tests are
# single-threaded Python, so they then run on every core at once (pytest-xdist).
test: $(VENV)/.installed system-deps
	$(BIN)/python -m pytest -q tests/e2e tests/integration
	$(BIN)/python -m pytest -q -n auto tests/unit

# Java for Spark; Prometheus and Alertmanager for the observability tests; Chromium
# and chromedriver for the incident report's browser test.
system-deps:
	@bash .ci/system-deps

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

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

.PHONY: demo test lint
demo: $(VENV)/.installed
	$(BIN)/fencewatch demo

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

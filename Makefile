VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint types unit bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m statekeeper.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

types: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -q

test: lint types unit

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .statekeeper .pytest_cache .mypy_cache .ruff_cache

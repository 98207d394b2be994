VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup browser demo test lint types unit thorough bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# The control UI's tests drive Debian's chromium headless (Playwright never downloads a browser
# here) and run axe-core (npm, package.json) in its pages. Installing chromium needs root;
# without them those tests skip locally and fail under CI.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "could not install Debian's chromium: the browser tests will skip"
	@test -f node_modules/axe-core/axe.min.js || npm ci --no-audit --no-fund --silent || \
	  echo "could not install axe-core from npm (package.json): the accessibility audit will skip"

demo: $(STAMP)
	$(PY) -m statekeeper.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

types: $(STAMP)
	$(VENV)/bin/mypy

# One pytest worker per core (pytest-xdist): every test keeps its data apart (its own
# tmp_path, PostgreSQL schema, Redis key prefix), so they run in any order and at once.
unit: $(STAMP) browser
	$(VENV)/bin/pytest -q -n auto

# The suite with ten times the hypothesis examples (not part of `make test`), then the
# OpenAPI fuzz at 10,000 requests or more (its own run, to print the count; docs/testing.md).
FUZZ := tests/server/test_openapi_fuzz.py
thorough: $(STAMP) browser
	STATEKEEPER_SPREAD_SESSIONS=10000 $(VENV)/bin/pytest -q -n auto --hypothesis-profile thorough --ignore=$(FUZZ)
	$(VENV)/bin/pytest -q -s -p no:xdist --hypothesis-profile thorough $(FUZZ)
	STATEKEEPER_FAILOVERS=20 $(VENV)/bin/pytest -q -s -p no:xdist tests/stores/test_redis_cluster_failover.py

test: lint types unit

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .statekeeper .pytest_cache .mypy_cache .ruff_cache node_modules

# keg's two set-up-and-go commands: `make up` runs the gateway, `make test` runs the tests.
# Both start from a bare machine with Python 3.11+, a JDK 17+ and Maven on PATH.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.keg-installed

.PHONY: setup up test lint unit integration bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)
	$(VENV)/bin/keg setup

up: setup
	$(VENV)/bin/keg up

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# pytest exits 5 when it collected no tests: that must fail, never pass silently.
test: setup lint
	$(PY) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

integration: setup
	$(PY) -m pytest -q tests/integration

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# keg's two set-up-and-go commands: `make up` runs the gateway, `make test` runs the tests.
# Both start from a bare machine with Python 3.11+, a JDK 17+ and Maven on PATH.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.keg-installed

.PHONY: setup up test lint unit integration bench clean system-deps native native-test

# keg's Kafka filter for Envoy (a Rust dynamic module); cargo comes with Rust (rustup).
CARGO ?= $(shell command -v cargo || echo $(HOME)/.cargo/bin/cargo)
CRATE := envoy/kafka_filter/Cargo.toml

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# --test-services: the schema registry (Apicurio, Maven Central) and local-kms (go
# install) the tests run against, fetched once into ~/.cache/keg, never at each run.
setup: $(STAMP) native
	$(VENV)/bin/keg setup --test-services

native:
	$(CARGO) build --release --quiet --manifest-path $(CRATE)

# The crate's tests (unit, split-at-every-offset, property tests) and its lints.
native-test:
	$(CARGO) test --quiet --manifest-path $(CRATE)
	@if $(CARGO) clippy --version >/dev/null 2>&1; then \
	  $(CARGO) clippy --quiet --all-targets --manifest-path $(CRATE) -- -D warnings; \
	else echo "cargo clippy is not installed (rustup component add clippy): lints skipped"; fi

up: setup
	$(VENV)/bin/keg up

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Debian packages some tests use, installed here when missing (as root): a real
# PostgreSQL server for the store's tests, headless Chromium to render the pipeline's
# HTML reports. Without root the tests say what to install.
APT_PACKAGES := $(if $(wildcard /usr/lib/postgresql/*/bin/pg_ctl),,postgresql) \
	$(if $(shell command -v chromium),,chromium)
system-deps:
	@if [ -n "$(strip $(APT_PACKAGES))" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	      --no-install-recommends $(APT_PACKAGES); \
	  else echo "missing Debian packages: apt-get install $(APT_PACKAGES) (as root)"; fi; \
	fi

# pytest exits 5 when it collected no tests: that must fail, never pass silently.
test: setup system-deps lint native-test
	$(PY) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

integration: setup
	$(PY) -m pytest -q tests/integration

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache envoy/kafka_filter/target

# keg's two set-up-and-go commands: `make up` runs the gateway, `make test` runs the tests.
# Both start from a bare machine with Python 3.11+, a JDK 17+ and Maven on PATH.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.keg-installed

.PHONY: setup up test lint unit integration bench clean system-deps native native-test helm \
	test-services test-prerequisites

# keg's Kafka filter for Envoy (a Rust dynamic module); cargo comes with Rust (rustup).
CARGO ?= $(shell command -v cargo || echo $(HOME)/.cargo/bin/cargo)
# cargo runs its own jobs: it is not handed make's jobserver (whose descriptors make
# closes for a recipe that is not a sub-make, so cargo would warn it cannot open them).
CARGO_RUN := MAKEFLAGS= MFLAGS= $(CARGO)
CRATE := envoy/kafka_filter/Cargo.toml

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) native helm
	$(VENV)/bin/keg setup

# The services the tests run against: a schema registry (Apicurio, from Maven Central,
# ~20 s) and local-kms (the AWS KMS API, built with `go install`, ~15 s), fetched once
# into keg's cache, never at each run. Not part of `make up`: the gateway needs neither.
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
test-services: $(STAMP)
	PATH="$$PATH:$(dir $(GO))" $(VENV)/bin/keg setup --test-services

# Helm for the chart's checks (tests/unit/keg/test_helm.py), built from source once with the
# Go toolchain into keg's cache (~3 min cold, then cached): never at every run.
HELM_VERSION := v3.22.0
KEG_BIN ?= $(or $(KEG_CACHE_DIR),$(if $(XDG_CACHE_HOME),$(XDG_CACHE_HOME)/keg,$(HOME)/.cache/keg))/bin
HELM := $(KEG_BIN)/helm

helm:
	@if [ -x $(HELM) ]; then :; \
	elif [ -x "$(GO)" ]; then mkdir -p $(KEG_BIN) && echo "building helm $(HELM_VERSION) into $(KEG_BIN)" \
	  && { GOBIN=$(KEG_BIN) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) \
	       || echo "WARNING: helm $(HELM_VERSION) did not build: the Helm chart's tests skip"; }; \
	else echo "go is not installed: helm not built, the Helm chart's tests skip"; fi

native:
	$(CARGO_RUN) build --release --quiet --manifest-path $(CRATE)

# The crate's tests (unit, split-at-every-offset, property tests) and its lints.
native-test:
	$(CARGO_RUN) test --quiet --manifest-path $(CRATE)
	@if $(CARGO) clippy --version >/dev/null 2>&1; then \
	  $(CARGO_RUN) clippy --quiet --all-targets --manifest-path $(CRATE) -- -D warnings; \
	else echo "cargo clippy is not installed (rustup component add clippy): lints skipped"; fi

up: setup
	$(VENV)/bin/keg up

# mypy checks kafka_wire and filter_rules strictly (pyproject's overrides); the second
# run is mypy's own --strict on them, so the two can never drift apart.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --strict kafka_wire filter_rules
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

# What the tests need, made side by side once the virtualenv exists: the downloads
# (Maven Central, apt, the test services) overlap the compiles (cargo, go) and the lints
# instead of queueing behind them. Each target's output is printed whole when it ends.
test-prerequisites: $(STAMP)
	$(MAKE) --no-print-directory -j4 --output-sync=target setup test-services system-deps \
	  lint native-test

# Every test runs on the ext_proc data path (GatewaySettings' default), then the
# integration tests whose gateway follows KEG_TEST_DATA_PATH run on the native one
# (tools/test_passes.py; a pass that collects no test fails).
test: test-prerequisites
	$(PY) tools/test_passes.py

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

integration: setup test-services
	$(PY) -m pytest -q tests/integration

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache envoy/kafka_filter/target

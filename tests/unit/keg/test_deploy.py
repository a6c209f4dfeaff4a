"""The deployment files, checked with what is installed here (no Docker Compose plugin):
docker-compose.yml against the Compose Specification's JSON schema (vendored in
deploy/schema), the keg commands it runs against keg's CLI, Prometheus' scrape config
and the Grafana dashboard against the metrics keg really exports."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2 as pb
from fastapi.testclient import TestClient
from typer.main import get_command

import kafka_wire
from control_plane.api import ApiSettings, create_app, ruleset_validator
from control_plane.native_filter import ENVOY_VERSION, MODULE_NAME
from control_plane.store import open_store
from ext_proc.connection import BROKER_ID
from ext_proc.server import DataPath, NetworkProcessor, ProcessorSettings
from kafka_wire import ApiKey
from keg.cli import app
from keg.embedded.envoy import envoy_binary
from keg.embedded.native import SEARCH_PATH_ENV
from keg.paths import REPO_ROOT
from tests.dashboard import (
    NATIVE_PREFIX,
    dashboard,
    dashboard_queries,
    exposed,
    referenced,
    unknown_references,
)

COMPOSE = REPO_ROOT / "docker-compose.yml"
DEPLOY = REPO_ROOT / "deploy"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads((DEPLOY / "schema" / "compose-spec.json").read_text())
    validator = jsonschema.Draft201909Validator(schema)  # what its $schema names
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(compose)]
    assert errors == []


def test_the_schema_check_catches_mistakes(compose: dict[str, Any]) -> None:
    schema = json.loads((DEPLOY / "schema" / "compose-spec.json").read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["envoy"]["ports"] = {"19092": "19092"}
    broken["services"]["kafka"]["restart_policy"] = "always"
    validator = jsonschema.Draft201909Validator(schema)  # what its $schema names
    assert len(list(validator.iter_errors(broken))) >= 2


def test_compose_has_the_whole_deployment(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"kafka", "control-plane", "ext-proc", "envoy", "prometheus",
                             "grafana"}
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    # Envoy from the Dockerfile's `envoy` target: the contrib image (the kafka_broker
    # filter is live there) with keg's module on its search path; the control plane
    # gives it the native data path.
    assert services["envoy"]["build"] == {"context": ".", "target": "envoy"}
    assert options(services["control-plane"]["command"][1:])["--data-path"] == "native"
    # ext_proc scales: no fixed container name, no host ports.
    assert "container_name" not in services["ext-proc"] and "ports" not in services["ext-proc"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (REPO_ROOT / source).exists(), f"{name} mounts missing {source}"


def test_every_service_restarts_and_has_a_health_check(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert service.get("restart") in ("always", "unless-stopped"), name
        check = service.get("healthcheck", {})
        assert check.get("test") and check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert not check.get("disable"), name


def test_health_checks_probe_what_their_service_serves(compose: dict[str, Any]) -> None:
    services = compose["services"]
    ext_proc = options(services["ext-proc"]["command"][1:])
    check = " ".join(services["ext-proc"]["healthcheck"]["test"])
    assert f"127.0.0.1:{ext_proc['--metrics-port']}/metrics" in check
    assert f"('127.0.0.1', {ext_proc['--port']})" in check
    plane = options(services["control-plane"]["command"][1:])
    check = " ".join(services["control-plane"]["healthcheck"]["test"])
    assert f"127.0.0.1:{plane['--api-port']}/readyz" in check
    admin_port = re.search(r"s/\$\$\{ADMIN_PORT\}/(\d+)/", services["envoy"]["command"][0])
    assert admin_port is not None
    check = " ".join(services["envoy"]["healthcheck"]["test"])
    assert f"/dev/tcp/127.0.0.1/{admin_port.group(1)}" in check and "/ready" in check
    # Envoy serves clients only once the data path and its configuration are there.
    assert services["envoy"]["depends_on"] == {
        "control-plane": {"condition": "service_healthy"},
        "ext-proc": {"condition": "service_healthy"}}


def options(argv: list[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for arg in argv:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            found[name] = value or None
    return found


@pytest.mark.parametrize("service", ["control-plane", "ext-proc"])
def test_keg_commands_in_compose_exist(compose: dict[str, Any], service: str) -> None:
    argv = compose["services"][service]["command"]
    command = get_command(app).commands[argv[0]]  # type: ignore[attr-defined]
    known = {opt for param in command.params for opt in param.opts}
    unknown = set(options(argv[1:])) - known
    assert not unknown, f"keg {argv[0]} has no option(s) {sorted(unknown)}"


def test_services_point_at_each_other(compose: dict[str, Any]) -> None:
    services = compose["services"]
    plane = options(services["control-plane"]["command"][1:])
    ext_proc = options(services["ext-proc"]["command"][1:])
    assert plane["--ext-proc"] == f"ext-proc:{ext_proc['--port']}"
    assert plane["--ext-proc-metrics"] == f"http://ext-proc:{ext_proc['--metrics-port']}/metrics"
    assert ext_proc["--control-plane"] == f"control-plane:{plane['--xds-port']}"
    assert "--rules" not in ext_proc  # one rule source: the control plane
    envoy = services["envoy"]["command"][0]
    assert f"s/$${{XDS_PORT}}/{plane['--xds-port']}/" in envoy
    assert f"{plane['--listen-port-base']}:{plane['--listen-port-base']}" in \
        services["envoy"]["ports"]


def dockerfile_stages() -> dict[str, list[str]]:
    """The Dockerfile's build stages by name (the unnamed last one: ""), their lines."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            words = line.split()
            current = stages.setdefault(words[3] if len(words) > 3 else "", [])
        current.append(line)
    return stages


def test_the_envoy_image_carries_keg_s_module_for_its_envoy_release() -> None:
    """The module is built from the crate the tests build, into the Envoy image whose
    release is the one the module is written for (the control plane offers the module
    only to Envoys of that release), on the path Envoy loads dynamic modules from."""
    stages = dockerfile_stages()
    library = f"lib{MODULE_NAME}.so"
    build = "\n".join(stages["module-build"])
    assert "cargo build --release --locked" in build
    envoy = stages["envoy"]
    assert envoy[0].startswith("FROM envoyproxy/envoy-contrib:v{}.{}".format(*ENVOY_VERSION))
    copy = next(line for line in envoy if line.startswith("COPY --from=module-build"))
    assert copy.split()[2].endswith(f"/release/{library}")
    search_path = copy.split()[3].rstrip("/")
    assert f"ENV {SEARCH_PATH_ENV}={search_path}" in envoy
    # The Helm chart's init container copies it from the module image's native.path.
    helm = load_yaml(DEPLOY / "helm" / "keg" / "values.yaml")
    module = stages["module"]
    assert any(line.startswith("COPY --from=module-build") and
               line.split()[3].rstrip("/") == helm["native"]["path"] for line in module)


def test_dockerfile_copies_every_package() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in include:
        package = pattern.rstrip("*")
        if (REPO_ROOT / package).is_dir():
            assert f"COPY {package} {package}" in dockerfile, package
    assert "COPY envoy envoy" in dockerfile


def test_prometheus_scrapes_every_keg_part(compose: dict[str, Any]) -> None:
    config = load_yaml(DEPLOY / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"keg-ext-proc", "keg-control-plane", "envoy"} <= set(jobs)
    for job in jobs.values():
        assert job.get("static_configs") or job.get("dns_sd_configs"), job["job_name"]
    ext_proc = options(compose["services"]["ext-proc"]["command"][1:])
    (sd,) = jobs["keg-ext-proc"]["dns_sd_configs"]
    assert sd["names"] == ["ext-proc"] and str(sd["port"]) == ext_proc["--metrics-port"]
    plane = options(compose["services"]["control-plane"]["command"][1:])
    assert jobs["keg-control-plane"]["static_configs"][0]["targets"] == [
        f"control-plane:{plane['--api-port']}"]
    assert jobs["envoy"]["metrics_path"] == "/stats/prometheus"
    # keg's Kafka filter serves where the Envoy container's node metadata says.
    (sd,) = jobs["keg-kafka-filter"]["dns_sd_configs"]
    envoy = compose["services"]["envoy"]["command"][0]
    assert sd["names"] == ["envoy"] and f'keg.metrics: {{address: "0.0.0.0:{sd["port"]}"}}' in envoy


DENY_RULES = """\
rules:
  - id: no-writes-to-frozen
    match: {apis: [Produce], topics: {prefix: [frozen.]}}
    action: {deny: {error: TOPIC_AUTHORIZATION_FAILED}}
  - id: watch-orders
    mode: dry-run
    match: {apis: [Produce], topics: {exact: [orders]}}
    action: {deny: {}}
"""


def produce_request(topic: str, correlation_id: int) -> bytes:
    header = kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, correlation_id, "dashboard-test", {})
    return kafka_wire.encode_request(header, {
        "TransactionalId": None, "Acks": -1, "TimeoutMs": 1000,
        "TopicData": [{"Name": topic, "PartitionData": [{"Index": 0, "Records": b"r" * 64}]}]})


class _StreamContext:
    """What the adapter reads of a gRPC call: Envoy's metadata for the connection."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((BROKER_ID, "1"),)


def ext_proc_after_traffic(rules_dir: Path) -> dict[str, set[str]]:
    """What a real ext_proc data path exposes after traffic through its gRPC adapter
    (NetworkProcessor, as Envoy drives it: one stream per Kafka connection): a Produce a
    rule refuses, one that passes (read by a dry-run rule), and a connection that
    breaks the protocol."""
    (rules_dir / "rules.yaml").write_text(DENY_RULES)
    data_path = DataPath(ProcessorSettings(rules_dir=rules_dir))
    assert data_path.rules is not None and data_path.rules.reload()
    processor = NetworkProcessor(ProcessorSettings(), data_path)

    async def connection(*chunks: bytes) -> list[pb.ProcessingResponse]:
        async def requests() -> AsyncIterator[pb.ProcessingRequest]:
            for chunk in chunks:
                yield pb.ProcessingRequest(read_data=pb.Data(data=chunk))
        return [r async for r in processor.Process(requests(), _StreamContext())]

    async def traffic() -> None:
        data_path.metrics.bind_loop(asyncio.get_running_loop())
        replies = await connection(produce_request("frozen.ledger", 1),
                                   produce_request("orders", 2))
        assert any(r.HasField("write_data") for r in replies), "the refusal was answered"
        broken = await connection(b"\x00\x00\x00\x01garbage!")  # size 1: no request
        assert broken[-1].connection_status == pb.ProcessingResponse.CLOSE_RST, "closed"

    asyncio.run(traffic())
    series = exposed(data_path.metrics.exposition().decode())
    data_path.close()
    return series


def control_plane_after_traffic(tmp_path: Path) -> dict[str, set[str]]:
    """What a real control-plane API exposes after a read and a refused write."""
    store = open_store(None, tmp_path, validator=ruleset_validator())
    try:
        client = TestClient(create_app(store, ApiSettings()))
        assert client.get("/v1/rules").status_code == 401
        assert client.get("/healthz").status_code == 200
        return exposed(client.get("/metrics").text)
    finally:
        store.close()


def test_grafana_dashboard_queries_metrics_keg_exports(tmp_path: Path) -> None:
    board = dashboard()
    datasource = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    uid = datasource["datasources"][0]["uid"]
    assert board["uid"] and board["title"] and board["panels"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]
    (tmp_path / "rules").mkdir()
    series = {**ext_proc_after_traffic(tmp_path / "rules"), **control_plane_after_traffic(tmp_path)}
    # The native path's series (envoy_dynamicmodulescustom_keg_kafka_*) and Envoy's own
    # are a real Envoy's: tests/integration/native/test_native_path.py checks those.
    assert unknown_references(series, ["keg_"]) == []
    used = {name for _, expr in dashboard_queries() for name in referenced(expr)[0]}
    # The gateway's core series are all on the dashboard: rates, error ratios, latency
    # percentiles, rule decisions, per topic, client, principal and error code.
    assert {"keg_requests_total", "keg_topic_requests_total", "keg_topic_record_bytes_total",
            "keg_refusals_total", "keg_decisions_total", "keg_connections_active",
            "keg_frame_latency_seconds_bucket", "keg_rule_set_version_info",
            "keg_api_request_duration_seconds_bucket"} <= used
    provider = load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "keg.yml")
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_the_dashboard_check_catches_what_is_not_exported() -> None:
    series = {"keg_requests_total": {"api", "client_id", "version"}}
    assert referenced('sum by (topic) (rate(keg_requests_total{api="Produce"}[5m]))') == (
        {"keg_requests_total": {"api"}}, {"topic"})
    assert unknown_references({}, ["keg_"])  # nothing exported: all unknown
    assert not unknown_references({}, ["keg_"], ["keg_"])  # skipped prefixes are not checked
    assert any(NATIVE_PREFIX in n for _, e in dashboard_queries() for n in referenced(e)[0])
    assert referenced("histogram_quantile(0.9, sum by (le) (rate(keg_x_bucket[1m])))") == (
        {"keg_x_bucket": set()}, set())
    assert "keg_requests_total" in {n for _, e in dashboard_queries() for n in referenced(e)[0]}
    problems = unknown_references(series, ["keg_requests"])
    assert problems and all("principal" in p for p in problems)  # a label it lacks


def test_the_envoy_container_command_renders_a_valid_bootstrap(
        compose: dict[str, Any], tmp_path: Path) -> None:
    """Run the Envoy service's shell command (compose's $$ unescaped) on the repo's
    bootstrap, then ask a real Envoy whether the result is a valid config."""
    script = compose["services"]["envoy"]["command"][0].replace("$$", "$")
    rendered = tmp_path / "bootstrap.yaml"
    script = (script.replace("/etc/keg/bootstrap.yaml", str(REPO_ROOT / "envoy" / "bootstrap.yaml"))
              .replace("/tmp/bootstrap.yaml", str(rendered))
              .replace("exec envoy", f"exec {envoy_binary()} --mode validate"))
    result = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_yaml(rendered)
    hostname = Path("/etc/hostname").read_text().strip()
    assert config["node"]["id"] == hostname and config["node"]["cluster"] == "keg"
    # The module's runtime flag and metrics address are in what Envoy validated (the
    # --config-yaml overlay).
    assert "connection_close_through_filter_manager" in script
    assert "keg.metrics" in script

"""The deployment files, checked with what is installed here (no Docker Compose plugin):
docker-compose.yml against the Compose Specification's JSON schema (vendored in
deploy/schema), the keg commands it runs against keg's CLI, Prometheus' scrape config
and the Grafana dashboard against the metrics keg really exports."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry
from typer.main import get_command

from control_plane.api.metrics import ApiMetrics
from ext_proc.metrics import Metrics
from keg.cli import app
from keg.embedded.envoy import envoy_binary
from keg.paths import REPO_ROOT

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
    # The contrib image: the kafka_broker filter is live there.
    assert services["envoy"]["image"].startswith("envoyproxy/envoy-contrib:")
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
    assert ext_proc["--control-plane"] == f"control-plane:{plane['--xds-port']}"
    assert "--rules" not in ext_proc  # one rule source: the control plane
    envoy = services["envoy"]["command"][0]
    assert f"s/$${{XDS_PORT}}/{plane['--xds-port']}/" in envoy
    assert f"{plane['--listen-port-base']}:{plane['--listen-port-base']}" in \
        services["envoy"]["ports"]


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


def exported_series() -> set[str]:
    """Every series name keg exports (counters with _total, histograms with _bucket...)."""
    registry = CollectorRegistry()
    ApiMetrics(registry)
    families = [*Metrics().registry.collect(), *registry.collect()]
    names: set[str] = set()
    for family in families:
        suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count"],
                    "gauge": [""], "info": ["_info"]}.get(family.type, [""])
        names.update(family.name + s for s in suffixes)
    return names


def test_grafana_dashboard_queries_metrics_keg_exports() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "keg-gateway.json").read_text())
    datasource = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    uid = datasource["datasources"][0]["uid"]
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    series = exported_series()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"\bkeg_[a-z_]+", target["expr"]):
                assert name in series, f"{panel['title']}: {name} is not exported"
                used.add(name)
    # The gateway's core series are all on the dashboard.
    assert {"keg_requests_total", "keg_decisions_total", "keg_connections_active",
            "keg_frame_latency_seconds_bucket", "keg_rule_set_version_info"} <= used
    provider = load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "keg.yml")
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_the_envoy_container_command_renders_a_valid_bootstrap(
        compose: dict[str, Any], tmp_path: Path) -> None:
    """Run the Envoy service's shell command (compose's $$ unescaped) on the repo's
    bootstrap, then ask a real Envoy whether the result is a valid config."""
    script = compose["services"]["envoy"]["command"][0].replace("$$", "$")
    rendered = tmp_path / "bootstrap.yaml"
    script = (script.replace("/etc/keg/bootstrap.yaml", str(REPO_ROOT / "envoy" / "bootstrap.yaml"))
              .replace("/tmp/bootstrap.yaml", str(rendered))
              .replace("exec envoy -c", "test -s"))
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=30)
    config = load_yaml(rendered)
    hostname = Path("/etc/hostname").read_text().strip()
    assert config["node"]["id"] == hostname and config["node"]["cluster"] == "keg"
    result = subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(rendered)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

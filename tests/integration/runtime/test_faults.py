"""Every part of the gateway comes back by itself after kill -9, and idempotent
producers lose and duplicate nothing meanwhile.

- ext_proc killed during 100,000 idempotent librdkafka records: restarted (ERROR line,
  restart counted, the dead process reaped), the gateway serves again, every record is
  in the broker exactly once.
- A part that cannot start again is retried with backoff, and health says so: /readyz
  answers 503 naming it, keg_component_up is 0, until it starts.
- Kafka's VerifiableProducer (enable.idempotence, acks=all) and VerifiableConsumer
  through the gateway, with kill -9 midway of, one at a time: ext_proc and Envoy (the
  Gateway's supervisor), the embedded broker (a real `keg up`, which restarts it on
  the same data directory) and the control plane (each part its own process, as
  docker-compose runs them, the control plane restarted as compose's restart policy
  does): 0 lost, 0 duplicated, the consumer sees every acknowledged record.
- docker-compose.yml's health checks pass against the real processes.
- kill -9 of `keg up` itself: its children end with it, and a new `keg up` on the same
  state and data directory serves.

Records: faults.RECORDS (KEG_FAULT_RECORDS); measured times are printed (pytest -s).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaError, Message, Producer

from control_plane.service import free_port
from keg.children import stop_process
from keg.embedded.envoy import EmbeddedEnvoy
from keg.embedded.kafka import EmbeddedKafka, kafka_home
from keg.gateway import (
    ENVOY_COMPONENT,
    EXT_PROC_COMPONENT,
    KAFKA_COMPONENT,
    ApiOptions,
    Gateway,
    wait_for_port,
)
from keg.paths import REPO_ROOT
from keg.supervisor import Child, Supervisor
from tests.integration.conftest import (
    api_get,
    create_topic,
    gateway_settings,
    produce_one,
    rule_dir,
)
from tests.integration.runtime.faults import run_through_fault, stored_values, wait_serving
from tests.integration.runtime.test_keg_up import KegUp, run_keg_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

OBSERVE = """\
rules:
  - id: faults-observe
    match: {apis: [Produce]}
    action: {observe: {audit: false}}
"""
LIBRDKAFKA_RECORDS = 100_000


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Gateway]:
    """A gateway of this module's own (its parts get killed), with the REST API and a
    rule that decodes every Produce request."""
    base = tmp_path_factory.mktemp("faults")
    rules = rule_dir(base / "rules", {"observe.yaml": OBSERVE})
    settings = gateway_settings(
        kafka, base / "work", rules_dir=rules, metrics_port=0,
        api=ApiOptions(data_dir=base / "api", port=free_port()))
    with Gateway(settings) as gw:
        yield gw


def restarts(gateway: Gateway, component: str) -> float:
    value = gateway.registry.get_sample_value("keg_component_restarts_total",
                                              {"component": component})
    return value or 0.0


def kill(pid: int | None) -> None:
    assert pid is not None
    os.kill(pid, signal.SIGKILL)


def reaped(pid: int) -> bool:
    """No process (not even a zombie) is left with `pid`."""
    return not Path(f"/proc/{pid}").exists()


def test_ext_proc_killed_during_100k_idempotent_records_comes_back(
        gateway: Gateway, kafka: EmbeddedKafka, caplog: pytest.LogCaptureFixture) -> None:
    topic = create_topic(kafka.bootstrap, 3)
    delivered: list[int] = []
    failures: list[str] = []
    restarts_before = restarts(gateway, EXT_PROC_COMPONENT)

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(f"{msg.value()!r}: {err}")
        else:
            delivered.append(int(msg.value() or b"-1"))

    producer = Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5})

    def produce_all() -> None:
        rate = LIBRDKAFKA_RECORDS / 8.0  # paced: the kill lands midway
        started = time.monotonic()
        for seq in range(LIBRDKAFKA_RECORDS):
            if seq % 500 == 0:
                time.sleep(max(0.0, started + seq / rate - time.monotonic()))
            while True:
                try:
                    producer.produce(topic, value=b"%06d" % seq, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        producer.flush(180)

    thread = threading.Thread(target=produce_all, name="librdkafka-producer")
    with caplog.at_level(logging.ERROR, logger="keg.supervisor"):
        thread.start()
        while len(delivered) < LIBRDKAFKA_RECORDS // 2:
            assert thread.is_alive() and not failures, failures[:5]
            time.sleep(0.01)
        pid = gateway.ext_proc_pid
        assert pid is not None
        killed, delivered_at_kill = time.monotonic(), len(delivered)
        kill(pid)
        back = wait_serving(gateway.bootstrap, also=lambda: gateway.components().get(
            EXT_PROC_COMPONENT) == "up" and gateway.ext_proc_pid != pid)
        thread.join(240)
        assert not thread.is_alive(), "the producer did not finish"
    print(f"\next_proc killed -9 at {delivered_at_kill} of {LIBRDKAFKA_RECORDS} delivered: "
          f"the gateway serves again after {back - killed:.2f} s")

    assert not failures, failures[:10]
    assert sorted(delivered) == list(range(LIBRDKAFKA_RECORDS))
    stored = stored_values(kafka.bootstrap, topic)
    assert sorted(int(v) for v in stored.elements()) == list(range(LIBRDKAFKA_RECORDS)), \
        "the broker holds a record twice, or lacks one"
    # Supervised: the dead process reaped (no zombie), an ERROR line, the restart counted.
    assert reaped(pid)
    assert any(r.levelno == logging.ERROR and f"ext_proc (pid {pid}) exited with signal 9 "
               "(SIGKILL)" in r.getMessage() for r in caplog.records), caplog.text
    assert restarts(gateway, EXT_PROC_COMPONENT) == restarts_before + 1
    assert gateway.components() == {EXT_PROC_COMPONENT: "up", ENVOY_COMPONENT: "up"}


@pytest.mark.parametrize("component", [EXT_PROC_COMPONENT, ENVOY_COMPONENT])
def test_verifiable_clients_through_a_kill_of(component: str, gateway: Gateway,
                                              kafka: EmbeddedKafka, tmp_path: Path) -> None:
    def pid() -> int | None:
        if component == EXT_PROC_COMPONENT:
            return gateway.ext_proc_pid
        return gateway.envoy.pid if gateway.envoy is not None else None

    victim = pid()
    before = restarts(gateway, component)
    outcome = run_through_fault(
        component, gateway.bootstrap, kafka.bootstrap, tmp_path,
        kill=lambda: kill(victim),
        back=lambda: wait_serving(gateway.bootstrap, also=lambda: pid() != victim
                                  and gateway.components()[component] == "up"))
    outcome.assert_exactly_once()
    assert restarts(gateway, component) == before + 1
    assert victim is not None and reaped(victim)


def test_a_part_that_cannot_start_is_retried_and_health_says_so(gateway: Gateway) -> None:
    """ext_proc killed while it cannot start (a bad option): the supervisor retries with
    backoff, /readyz and /metrics show it down, the fleet shows its node gone; once it
    can start again it is back, and so is health."""
    assert api_get(gateway, "/readyz")[0] == 200
    before = restarts(gateway, EXT_PROC_COMPONENT)
    level = gateway.settings.ext_proc_log_level
    gateway.settings.ext_proc_log_level = "NOT-A-LEVEL"  # `keg ext-proc` exits at once
    try:
        kill(gateway.ext_proc_pid)
        deadline = time.monotonic() + 60
        while restarts(gateway, EXT_PROC_COMPONENT) < before + 2:  # two failed starts
            assert time.monotonic() < deadline, gateway.components()
            time.sleep(0.05)
        assert gateway.components()[EXT_PROC_COMPONENT] == "restarting"
        status, body = api_get(gateway, "/readyz")
        assert status == 503, body
        assert "ext_proc restarting" in body and "SIGKILL" in body, body
        metrics = api_get(gateway, "/metrics")[1]
        assert 'keg_component_up{component="ext_proc"} 0.0' in metrics
        assert 'keg_component_up{component="envoy"} 1.0' in metrics
        (node,) = [n for n in gateway.fleet_status() if n["role"] == "ext_proc"]
        assert not node["connected"]
    finally:
        gateway.settings.ext_proc_log_level = level
    wait_serving(gateway.bootstrap, also=lambda: gateway.components()[EXT_PROC_COMPONENT]
                 == "up")
    assert api_get(gateway, "/readyz")[0] == 200
    metrics = api_get(gateway, "/metrics")[1]
    assert 'keg_component_up{component="ext_proc"} 1.0' in metrics
    assert re.search(r'keg_component_restarts_total\{component="ext_proc"\} (\d+)', metrics)


def run_health_check(test: list[str], ports: dict[int, int]) -> int:
    """A compose health check (CMD form) run here, its ports moved to the real ones."""
    assert test[0] == "CMD"
    argv = [sys.executable if arg == "python" else arg for arg in test[1:]]
    for compose_port, real in ports.items():
        argv = [re.sub(rf"\b{compose_port}\b", str(real), arg) for arg in argv]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode


def test_the_compose_health_checks_pass_on_real_parts(gateway: Gateway) -> None:
    """docker-compose.yml's health checks of ext-proc, Envoy and the control plane, run
    against the real processes (ports moved), pass; against nothing, fail."""
    services = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    assert gateway.envoy is not None and gateway.metrics_port is not None
    assert gateway.app is not None and gateway.app.api_server is not None
    admin_port = int(gateway.envoy.admin_address.rsplit(":", 1)[1])
    real = {"ext-proc": {9464: gateway.metrics_port, 50051: gateway.ext_proc_port},
            "envoy": {9901: admin_port},
            "control-plane": {8080: gateway.app.api_server.port}}
    nothing = free_port()
    for service, ports in real.items():
        test = services[service]["healthcheck"]["test"]
        assert run_health_check(test, ports) == 0, service
        assert run_health_check(test, dict.fromkeys(ports, nothing)) != 0, service


# -- the broker, under a real `keg up` -----------------------------------------------------


def child_processes(parent: int) -> dict[int, str]:
    """pid -> command line of `parent`'s children."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")
                found[int(stat.parent.name)] = cmdline.decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
    return found


def broker_pid(up: KegUp) -> int | None:
    pids = [pid for pid, cmd in child_processes(up.process.pid).items() if " kafka.Kafka " in cmd]
    return pids[0] if len(pids) == 1 else None


@contextmanager
def keg_up_with_its_broker(tmp_path: Path, fresh: bool = True) -> Iterator[KegUp]:
    """`keg up` with its embedded broker (data in tmp_path), its state in a cache of its
    own (which borrows the Kafka jars of the real one); `fresh=False`: again, on what a
    first one left."""
    cache = tmp_path / "cache"
    rules = tmp_path / "rules"
    if fresh:
        cache.mkdir()
        (cache / kafka_home().name).symlink_to(kafka_home())
        rules.mkdir()
        (rules / "observe.yaml").write_text(OBSERVE)
    with run_keg_up(tmp_path, cache, rules, "--data-dir", str(tmp_path / "kafka")) as up:
        yield up


def test_verifiable_clients_through_a_kill_of_the_broker(tmp_path: Path) -> None:
    with keg_up_with_its_broker(tmp_path) as up:
        broker = up.wait_for(r"embedded Kafka broker on (\S+) ").group(1)
        gateway = up.bootstrap
        api = up.wait_for(r"REST API: (http://127\.0\.0\.1:\d+)/docs").group(1)
        victim = broker_pid(up)
        assert victim is not None, child_processes(up.process.pid)

        def back() -> float:
            wait_serving(broker, also=lambda: broker_pid(up) not in (None, victim))
            return wait_serving(gateway)

        outcome = run_through_fault(KAFKA_COMPONENT, gateway, broker, tmp_path / "work",
                                    kill=lambda: kill(victim), back=back)
        outcome.assert_exactly_once()
        assert f"kafka (pid {victim}) exited with signal 9 (SIGKILL)" in up.output, up.output
        assert "kafka is back" in up.output
        with urllib.request.urlopen(f"{api}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert 'keg_component_restarts_total{component="kafka"} 1.0' in metrics
        assert 'keg_component_up{component="kafka"} 1.0' in metrics
        assert up.stop() == 0, up.output
    assert child_processes(up.process.pid) == {}


# -- the control plane, each part its own process ----------------------------------------


class SplitGateway:
    """The gateway as docker-compose runs it: the control plane (`keg control-plane`,
    REST API and store), one ext_proc service (`keg ext-proc`, rules over xDS) and Envoy,
    each a process of its own. A `Supervisor` restarts the control plane as compose's
    `restart: unless-stopped` would; nothing else is restarted."""

    def __init__(self, kafka: EmbeddedKafka, base: Path) -> None:
        self.kafka = kafka
        self.base = base
        self.rules = rule_dir(base / "rules", {"observe.yaml": OBSERVE})
        self.xds_port, self.api_port, self.ext_proc_port = free_port(), free_port(), free_port()
        self.listen_port = free_port()  # one broker: its listener
        self.supervisor = Supervisor()
        self.control_plane: subprocess.Popen[bytes] | None = None
        self.ext_proc: subprocess.Popen[bytes] | None = None
        self.envoy = EmbeddedEnvoy("127.0.0.1", self.xds_port, node_id="split-envoy",
                                   work_dir=base / "envoy")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    def start(self) -> None:
        self.start_control_plane()
        self.supervisor.watch("control_plane", Child(
            poll=lambda: None if self.control_plane is None else self.control_plane.poll(),
            restart=self.start_control_plane,
            pid=lambda: None if self.control_plane is None else self.control_plane.pid))
        self.ext_proc = subprocess.Popen([
            sys.executable, "-m", "keg", "ext-proc", "--port", str(self.ext_proc_port),
            "--control-plane", f"127.0.0.1:{self.xds_port}", "--node-id", "split-ext-proc",
            "--rules-cache", str(self.base / "rules-cache.json"), "--log-level", "WARNING"])
        wait_for_port("127.0.0.1", self.ext_proc_port, 60)
        self.envoy.start()
        self.envoy.wait_for_listeners(1, timeout=60)
        wait_for_port("127.0.0.1", self.listen_port, 60)
        deadline = time.monotonic() + 60
        while not self.converged():
            assert time.monotonic() < deadline, self.fleet()
            time.sleep(0.1)

    def start_control_plane(self) -> None:
        self.control_plane = subprocess.Popen([
            sys.executable, "-m", "keg", "control-plane",
            "--bootstrap-servers", self.kafka.bootstrap,
            "--ext-proc", f"127.0.0.1:{self.ext_proc_port}",
            "--xds-host", "127.0.0.1", "--xds-port", str(self.xds_port),
            "--listen-host", "127.0.0.1", "--advertised-host", "127.0.0.1",
            "--listen-port-base", str(self.listen_port), "--rules", str(self.rules),
            "--api-host", "127.0.0.1", "--api-port", str(self.api_port),
            "--data-dir", str(self.base / "store"), "--public-reads", "--log-level", "WARNING"])
        deadline = time.monotonic() + 60
        while not self.ready():
            if self.control_plane.poll() is not None:
                raise RuntimeError(f"keg control-plane exited with "
                                   f"{self.control_plane.returncode}")
            if time.monotonic() > deadline:
                self.control_plane.kill()
                raise TimeoutError("keg control-plane not ready in 60 s")
            time.sleep(0.05)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/readyz",
                                        timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def fleet(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/v1/fleet",
                                    timeout=5) as response:
            nodes: list[dict[str, Any]] = json.loads(response.read())["nodes"]
            return nodes

    def converged(self) -> bool:
        """Envoy and the ext_proc service connected to the control plane, each running
        what it was sent."""
        try:
            nodes = {n["node_id"]: n for n in self.fleet()}
        except OSError:
            return False
        wanted = ("split-envoy", "split-ext-proc")
        return all(name in nodes and nodes[name]["connected"] and nodes[name]["types"]
                   and all(t["in_sync"] for t in nodes[name]["types"].values())
                   for name in wanted)

    def stop(self) -> None:
        self.supervisor.stop()
        self.envoy.stop()
        for process in (self.ext_proc, self.control_plane):
            stop_process(process, grace_s=15)


def test_verifiable_clients_through_a_kill_of_the_control_plane(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    split = SplitGateway(kafka, tmp_path)
    try:
        split.start()
        assert split.control_plane is not None
        victim = split.control_plane.pid
        envoy_pid = split.envoy.pid
        ext_proc_pid = split.ext_proc.pid if split.ext_proc is not None else None
        converged_after: list[float] = []

        def back() -> float:
            served = wait_serving(split.bootstrap, also=lambda: split.control_plane is not None
                                  and split.control_plane.pid != victim and split.ready())
            converged = wait_serving(split.bootstrap, also=split.converged)
            converged_after.append(converged - served)
            return served

        outcome = run_through_fault("control_plane", split.bootstrap, kafka.bootstrap,
                                    tmp_path / "work", kill=lambda: kill(victim), back=back)
        outcome.notes.append(f"fleet (Envoy, ext_proc) reconnected and in sync "
                             f"{converged_after[0]:.2f} s later")
        print(outcome.notes[-1])
        outcome.assert_exactly_once()
        # Envoy and the ext_proc service rode it out: the same processes, reconnected.
        assert split.envoy.pid == envoy_pid and split.envoy.poll() is None
        assert split.ext_proc is not None and split.ext_proc.pid == ext_proc_pid
        assert split.ext_proc.poll() is None
    finally:
        split.stop()


@pytest.mark.skipif(shutil.which("setpriv") is None,
                    reason="children end with keg where util-linux's setpriv is (Linux)")
def test_keg_up_children_do_not_outlive_it(tmp_path: Path) -> None:
    """kill -9 of `keg up` (its control plane runs in it): its children end with it, so
    that a service manager's restart finds the ports and the data directory free, and
    the new `keg up` serves."""
    with keg_up_with_its_broker(tmp_path) as up:
        up.wait_for(r"keg is up")
        children = child_processes(up.process.pid)
        # the broker, Envoy and the ext_proc service's workers (one per core by default)
        assert len(children) == 2 + (os.cpu_count() or 1), children
        up.process.kill()
        up.process.wait(30)
        deadline = time.monotonic() + 60
        while alive := {pid: state for pid in children
                        if (state := stat_state(pid)) not in ("gone", "Z")}:
            assert time.monotonic() < deadline, f"still running after keg up died: {alive}"
            time.sleep(0.1)
    with keg_up_with_its_broker(tmp_path, fresh=False) as again:
        topic = create_topic(again.bootstrap)
        assert produce_one(again.bootstrap, topic) is None, again.output
        assert again.stop() == 0, again.output


def stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


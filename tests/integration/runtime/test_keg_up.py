"""`keg up` as users run it: the real command in a child process, fronting the session's
broker (--bootstrap-servers), its state in a cache directory of the test's own, checked
with a real client through the Envoy it starts."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from control_plane.service import free_port
from keg.embedded.kafka import EmbeddedKafka
from tests.integration.conftest import create_topic, free_port_run, produce_one

pytestmark = pytest.mark.integration

# The same rule id in both directories: what made the second run refuse ("not owned").
DENY = ("rules:\n  - id: deny-produce\n    match: {{apis: [Produce], topics: {{prefix: [{}]}}}}\n"
        "    action: {{deny: {{}}}}\n")


@dataclass
class KegUp:
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    @property
    def output(self) -> str:
        with self.changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        """The first output line matching `pattern`, once printed; fails if the
        process ends first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines:
                    if (found := re.search(pattern, line)) is not None:
                        return found
                if self.process.poll() is not None:
                    raise AssertionError(f"keg up exited with {self.process.returncode} "
                                         f"before printing {pattern!r}:\n{self.output}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"keg up printed no {pattern!r}:\n{self.output}")
                self.changed.wait(0.5)

    @property
    def bootstrap(self) -> str:
        return self.wait_for(r"bootstrap\.servers=(\S+)").group(1)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self.process.wait(60)


@contextmanager
def keg_up(kafka: EmbeddedKafka, cwd: Path, cache: Path, rules: Path,
           *extra: str, bootstrap: str | None = None,
           environment: dict[str, str] | None = None) -> Iterator[KegUp]:
    """`keg up` fronting `bootstrap` (default: the broker's PLAINTEXT listener), with
    `environment` added to its environment."""
    with run_keg_up(cwd, cache, rules, "--bootstrap-servers", bootstrap or kafka.bootstrap,
                    *extra, environment=environment) as up:
        yield up


@contextmanager
def run_keg_up(cwd: Path, cache: Path, rules: Path, *extra: str,
               environment: dict[str, str] | None = None) -> Iterator[KegUp]:
    """`keg up` on free ports, its state in `cache`; without --bootstrap-servers in
    `extra` with its embedded broker; `environment` added to its environment."""
    command = [sys.executable, "-m", "keg", "up", "--rules", str(rules),
               "--listen-port-base", "0", "--metrics-port", "0", "--module-metrics-port", "0",
               "--api-port", str(free_port()), "--log-level", "WARNING", *extra]
    env = {**os.environ, "KEG_CACHE_DIR": str(cache), **(environment or {})}
    env.pop("COLUMNS", None)
    process = subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    up = KegUp(process)
    reader = threading.Thread(target=up.read, daemon=True)
    reader.start()
    try:
        yield up
    finally:
        up.stop()
        reader.join(10)


def rule_dir(parent: Path, name: str, prefix: str) -> Path:
    directory = parent / name
    directory.mkdir()
    (directory / "deny.yaml").write_text(DENY.format(prefix))
    return directory


def test_each_keg_up_serves_exactly_the_rule_directory_it_is_given(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """One cache, two rule directories: run after run and side by side, each `keg up`
    enforces its own directory's rules; the same directory twice at once is refused."""
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    first, second = rule_dir(tmp_path, "first", "a."), rule_dir(tmp_path, "second", "b.")
    in_a = create_topic(kafka.bootstrap, name=f"a.{time.monotonic_ns()}")
    in_b = create_topic(kafka.bootstrap, name=f"b.{time.monotonic_ns()}")

    with keg_up(kafka, work, cache, first, "--audit-log", "none") as up:
        assert produce_one(up.bootstrap, in_a) == "TOPIC_AUTHORIZATION_FAILED"
        assert produce_one(up.bootstrap, in_b) is None
        up.wait_for(rf"rules: {re.escape(str(first))} \(1 rules, version \w+\), store version 1")
        # --audit-log none: no audit log, and no file named "none" either.
        up.wait_for(r"audit log: off ")
        # --metrics-port 0: a free port, printed, serving the ext_proc's metrics.
        metrics = up.wait_for(r"metrics: (http://127\.0\.0\.1:\d+/metrics)").group(1)
        with urllib.request.urlopen(metrics, timeout=10) as response:
            assert b"keg_" in response.read()
        # ... and keg's Kafka filter (the native path, keg up's default) the traffic's.
        module = up.wait_for(r"Kafka filter: (http://127\.0\.0\.1:\d+/metrics)").group(1)
        with urllib.request.urlopen(module, timeout=10) as response:
            assert f'topic="{in_b}"'.encode() in response.read()
        assert up.stop() == 0, up.output
    assert not (work / "none").exists() and list(work.iterdir()) == []

    with keg_up(kafka, work, cache, second) as up:
        assert produce_one(up.bootstrap, in_b) == "TOPIC_AUTHORIZATION_FAILED", up.output
        assert produce_one(up.bootstrap, in_a) is None, up.output
        up.wait_for(rf"rules: {re.escape(str(second))} \(1 rules, version \w+\), "
                    r"store version 1")
        assert "ERROR" not in up.output and "not owned" not in up.output, up.output

        # Side by side with the first directory: nothing shared, each its own rules.
        with keg_up(kafka, work, cache, first) as other:
            assert produce_one(other.bootstrap, in_a) == "TOPIC_AUTHORIZATION_FAILED"
            assert produce_one(other.bootstrap, in_b) is None
            assert produce_one(up.bootstrap, in_b) == "TOPIC_AUTHORIZATION_FAILED"
            assert produce_one(up.bootstrap, in_a) is None

        # The same directory twice at once: the second refuses, naming the first.
        with keg_up(kafka, work, cache, second) as twice:
            assert twice.process.wait(60) == 2, twice.output
            assert f"(pid {up.process.pid})" in twice.output, twice.output
            assert "in use by another keg process" in twice.output
            assert "Traceback" not in twice.output
        assert produce_one(up.bootstrap, in_b) == "TOPIC_AUTHORIZATION_FAILED"


def test_keg_up_refuses_to_start_with_rules_its_ext_proc_service_refuses(
        kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Serving other rules than the directory's would mislead: a rule set the ext_proc
    service NACKs (a key it does not have) stops the start, with the reason."""
    monkeypatch.delenv("KEG_TEST_ABSENT_KEY", raising=False)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "encrypt.yaml").write_text(
        "rules:\n  - id: encrypt-all\n    action:\n      encrypt:\n"
        "        key: {id: k1, secret: {env: KEG_TEST_ABSENT_KEY}}\n")
    with keg_up(kafka, tmp_path, tmp_path / "cache", rules) as up:
        assert up.process.wait(120) == 2, up.output
        assert "error: the ext_proc service refused the rule set (version 1)" in up.output
        assert "KEG_TEST_ABSENT_KEY" in up.output
        assert "keg is up" not in up.output and "Traceback" not in up.output


def test_json_logs_are_json_in_every_process_of_keg_up(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """`--log-format json`: the ext_proc workers logged text (their command line had no
    --log-format), so a log shipper got a mix."""
    import json

    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    rules = rule_dir(tmp_path, "rules", "json.")
    topic = create_topic(kafka.bootstrap, name=f"json.{time.monotonic_ns()}")
    with keg_up(kafka, work, cache, rules, "--log-format", "json", "--log-level", "INFO",
                "--audit-log", "none") as up:
        assert produce_one(up.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"
        assert up.stop() == 0, up.output
    text_logs = [line for line in up.lines
                 if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ", line)]
    assert text_logs == [], up.output
    loggers = {json.loads(line)["logger"] for line in up.lines if line.startswith("{")}
    assert any(name.startswith("ext_proc") for name in loggers), loggers
    assert any(name.startswith("control_plane") for name in loggers), loggers


def test_a_refused_login_to_the_brokers_stops_keg_up_at_once_saying_why(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A wrong password for keg's own login: `keg up` waited a minute ("waiting for
    brokers" at INFO) and then exited with `error: ` and nothing after it."""
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    password = tmp_path / "password"
    password.write_text("not-the-password\n")
    password.chmod(0o600)
    started = time.monotonic()
    with keg_up(kafka, work, cache, rule_dir(tmp_path, "rules", "x."), "--sasl-mechanism",
                "PLAIN", "--sasl-username", "alice", "--sasl-password-file", str(password),
                bootstrap=kafka.sasl_bootstrap) as up:
        assert up.process.wait(120) == 2, up.output
    assert "SASL" in up.output and "error: \n" not in up.output + "\n", up.output
    assert "not-the-password" not in up.output
    print(f"refused after {time.monotonic() - started:.1f} s")


def refused(kafka: EmbeddedKafka, cwd: Path, cache: Path, rules: Path, *extra: str) -> str:
    """The output of a `keg up` that refuses to start (exit 2) with `extra` options."""
    with keg_up(kafka, cwd, cache, rules, *extra) as up:
        assert up.process.wait(60) == 2, up.output
        return up.output


def test_each_ext_proc_worker_serves_metrics_on_the_port_after_the_last(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """`--metrics-port P` gave the first worker P and every other worker a random port
    (its help said "after --metrics-port's"): unscrapeable without reading the banner.
    Worker i now serves on P + i; a port of keg's own inside that run is refused."""
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    rules = rule_dir(tmp_path, "rules", "a.")
    base = free_port_run(2)
    output = refused(kafka, work, cache, rules, "--ext-proc-workers", "2",
                     "--metrics-port", str(base), "--api-port", str(base + 1))
    assert (f"port {base + 1} is both --api-port and --metrics-port (+1: ext_proc "
            f"worker 1)") in output, output
    with keg_up(kafka, work, cache, rules, "--ext-proc-workers", "2",
                "--metrics-port", str(base)) as up:
        up.wait_for(r"keg is up")
        printed = up.wait_for(r"metrics: (http://\S+/metrics) (http://\S+/metrics)")
        assert printed.groups() == (f"http://127.0.0.1:{base}/metrics",
                                    f"http://127.0.0.1:{base + 1}/metrics")
        for url in printed.groups():
            with urllib.request.urlopen(url, timeout=10) as response:
                assert b"keg_" in response.read()
        assert up.stop() == 0, up.output


DROP = """rules:
  - id: drop-noise
    match: {apis: [Produce], direction: request, topics: {prefix: [idem.]}}
    action: {drop: {when: {key: {exact: [noise]}}}}
"""


def test_an_idempotent_producer_goes_on_after_keg_up_restarts(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """Records a rule drops from an idempotent producer's batches shift its later
    batches' sequence numbers down; keg up emptied that ledger at every start, so after
    a restart the producer's next batch left a gap the broker refused as
    OUT_OF_ORDER_SEQUENCE_NUMBER, fatal to librdkafka. The ledger is now kept."""
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    cache, work, rules = tmp_path / "cache", tmp_path / "work", tmp_path / "rules"
    work.mkdir()
    rules.mkdir()
    (rules / "drop.yaml").write_text(DROP)
    topic = create_topic(kafka.bootstrap, name=f"idem.{time.monotonic_ns()}")
    port = free_port_run(1)
    fatal: list[str] = []

    def on_error(err: KafkaError) -> None:
        if err.fatal():
            fatal.append(str(err))

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000,
                         "error_cb": on_error})
    failed: list[str] = []

    sent = iter(range(1_000_000))

    def send(key: str, count: int) -> None:
        for _ in range(count):
            producer.produce(topic, f"{key}-{next(sent)}".encode(), key=key.encode(),
                             on_delivery=lambda err, _m: failed.append(str(err))
                             if err is not None else None)

    for _restart in range(2):
        with keg_up(kafka, work, cache, rules, "--listen-port-base", str(port)) as up:
            up.wait_for(r"keg is up")
            send("kept", 20)
            send("noise", 5)
            send("kept", 20)
            assert producer.flush(60) == 0
            assert failed == [] and fatal == [], (failed, fatal)
            assert up.stop() == 0, up.output
    with keg_up(kafka, work, cache, rules, "--listen-port-base", str(port)) as up:
        up.wait_for(r"keg is up")
        send("after", 20)
        assert producer.flush(90) == 0
        assert fatal == [] and failed == [], (fatal, failed, up.output[-3000:])

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"g{port}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < 100 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            values.append(message.value() or b"")
    consumer.close()
    assert len(values) == 100 and len(set(values)) == 100  # 80 kept and 20 after, once
    assert not any(v.startswith(b"noise") for v in values)


def test_keg_ups_own_ports_can_be_pinned(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """The xDS server, the ext_proc workers and Envoy's admin took free ports, outside
    any range an operator assigns (firewalls, containers): --internal-port-base pins
    them, and a port of that run that another option takes is refused up front."""
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    rules = rule_dir(tmp_path, "rules", "a.")
    base = free_port_run(4)  # xDS, two workers, Envoy's admin
    output = refused(kafka, work, cache, rules, "--ext-proc-workers", "2",
                     "--internal-port-base", str(base), "--api-port", str(base + 3))
    assert (f"port {base + 3} is both --api-port and --internal-port-base (+3: "
            f"envoy-admin)") in output, output
    with keg_up(kafka, work, cache, rules, "--ext-proc-workers", "2",
                "--internal-port-base", str(base)) as up:
        up.wait_for(r"keg is up")
        with urllib.request.urlopen(f"http://127.0.0.1:{base + 3}/ready", timeout=10) as ready:
            assert ready.read().strip() == b"LIVE"  # Envoy's admin
        for port in (base, base + 1, base + 2):  # xDS, the workers' gRPC
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        assert produce_one(up.bootstrap, create_topic(kafka.bootstrap,
                                                      name=f"a.{time.monotonic_ns()}")) \
            == "TOPIC_AUTHORIZATION_FAILED"
        assert up.stop() == 0, up.output

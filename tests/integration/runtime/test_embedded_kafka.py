"""keg.embedded.kafka against a real Apache Kafka 4.x broker and real clients.

Needs java (17+) and, on the first run only, mvn to fetch the jars into keg's cache.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from keg.embedded.kafka import (
    JAVA_TOOLS,
    EmbeddedKafka,
    ToolMissing,
    ensure_kafka,
    java_executable,
    missing_tool_classes,
    run_java_tool,
)

pytestmark = pytest.mark.integration

TOPIC = "keg-embedded-it"
N = 100


@pytest.fixture(scope="module")
def libs() -> Path:
    # Java and Maven are requirements of keg, not optional: no skip when they are missing.
    return ensure_kafka()


def _produce(bootstrap: str, topic: str, records: list[tuple[str, str]], **conf: str) -> None:
    delivered: list[str] = []
    failed: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            failed.append(err)
        else:
            delivered.append("ok")

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert not failed, failed
    assert len(delivered) == len(records)


def _console_consume(bootstrap: str, topic: str, count: int) -> set[tuple[str, str]]:
    done = run_java_tool(
        "console-consumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--from-beginning",
        "--max-messages",
        str(count),
        "--timeout-ms",
        "30000",
        "--property",
        "print.key=true",
        "--property",
        "key.separator=|",
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert f"Processed a total of {count} messages" in done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == count, done.stdout[-500:]
    return {(k, v) for k, _, v in (line.partition("|") for line in lines)}


def test_tool_main_classes_exist_in_the_jars(libs: Path) -> None:
    assert dict(missing_tool_classes(libs)) == {}
    assert JAVA_TOOLS["topics"] == "org.apache.kafka.tools.TopicCommand"


def test_missing_tools_are_reported_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java = java_executable()
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(ToolMissing, match=r"^java not found: install a JDK 17\+") as exc:
        java_executable()
    assert "\n" not in str(exc.value)

    # java present but no mvn, and an empty cache: say what to install.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(java)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("KEG_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ToolMissing, match=r"^mvn not found: install Apache Maven") as exc:
        ensure_kafka()
    assert "\n" not in str(exc.value)


def test_topic_produce_consume_and_restart(libs: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "kafka"
    records = [(f"key-{i}", f"value-{i}") for i in range(N)]
    kafka = EmbeddedKafka(data_dir=data_dir)
    try:
        started = time.monotonic()
        kafka.start()
        first_start = time.monotonic() - started
        assert kafka.running
        assert kafka.bootstrap == f"127.0.0.1:{kafka.port}"
        assert kafka.data_dir == data_dir.resolve()

        created = run_java_tool(
            "topics",
            "--bootstrap-server",
            kafka.bootstrap,
            "--create",
            "--topic",
            TOPIC,
            "--partitions",
            "3",
            "--replication-factor",
            "1",
            check=True,
        )
        assert f"Created topic {TOPIC}" in created.stdout

        _produce(kafka.bootstrap, TOPIC, records)
        assert _console_consume(kafka.bootstrap, TOPIC, N) == set(records)

        # Restart on the same data dir: same port, data kept, storage not re-formatted.
        port, pid = kafka.port, kafka.pid
        meta = (data_dir / "kraft-logs" / "meta.properties").read_text()
        kafka.stop()
        kafka.stop()  # idempotent
        assert not kafka.running
        started = time.monotonic()
        kafka.start()
        restart = time.monotonic() - started
        assert kafka.port == port
        assert kafka.pid != pid
        assert (data_dir / "kraft-logs" / "meta.properties").read_text() == meta

        listed = run_java_tool("topics", "--bootstrap-server", kafka.bootstrap, "--list")
        assert TOPIC in listed.stdout.split()
        assert _console_consume(kafka.bootstrap, TOPIC, N) == set(records)

        assert kafka.log_path.stat().st_size > 0
        assert "Kafka Server started" in kafka.log_path.read_text()
        print(f"broker start {first_start:.1f}s, restart {restart:.1f}s")
    finally:
        kafka.stop()
    assert not kafka.running
    assert data_dir.exists()  # a caller's data dir is never removed


def _wait_for_auth_error(conf: dict[str, Any]) -> KafkaError:
    errors: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": errors.append})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        producer.poll(0.2)
        auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
        if auth:
            return auth[0]
    raise AssertionError(f"no authentication error, got {errors}")


def test_sasl_plain_and_scram(libs: Path) -> None:
    secret = "alice-secret"
    with EmbeddedKafka(sasl_users={"alice": secret}) as kafka:
        data_dir = kafka.data_dir
        assert kafka.sasl_bootstrap != kafka.bootstrap

        def sasl(mechanism: str, password: str = secret) -> dict[str, Any]:
            return {
                "bootstrap.servers": kafka.sasl_bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": mechanism,
                "sasl.username": "alice",
                "sasl.password": password,
            }

        records = [(f"k{i}", f"v{i}") for i in range(10)]
        _produce(kafka.sasl_bootstrap, "sasl-topic", records, **sasl("PLAIN"))

        consumer = Consumer(
            {
                **sasl("SCRAM-SHA-256"),
                "group.id": "keg-it-scram",
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.subscribe(["sasl-topic"])
            got: set[tuple[str, str]] = set()
            deadline = time.monotonic() + 30
            while len(got) < len(records) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                key, value = msg.key(), msg.value()
                assert key is not None and value is not None
                got.add((key.decode(), value.decode()))
        finally:
            consumer.close()
        assert got == set(records)

        topics = AdminClient(sasl("SCRAM-SHA-512")).list_topics(timeout=15).topics
        assert "sasl-topic" in topics

        for mechanism in ("PLAIN", "SCRAM-SHA-256"):
            err = _wait_for_auth_error(sasl(mechanism, "wrong-password"))
            assert "Authentication failed" in err.str()

        # The plain listener still needs no credentials; passwords never reach the logs.
        assert (
            "sasl-topic"
            in AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=15).topics
        )
        for log_file in (kafka.log_path, kafka.console_log_path):
            assert secret not in log_file.read_text()
        assert os.stat(kafka.config_path).st_mode & 0o077 == 0
    assert not data_dir.exists()  # the temporary data dir goes with stop()


def test_keg_kafka_ends_when_its_broker_dies(libs: Path, tmp_path: Path) -> None:
    """`keg kafka` went on after a kill -9 of its broker, the JVM a zombie: whatever
    supervised it (a service manager, a test harness) never knew (a new user's report).
    It now ends with exit code 1 saying how the broker ended."""
    import signal
    import subprocess
    import sys

    from control_plane.service import free_port

    port = free_port()
    keg = subprocess.Popen([sys.executable, "-m", "keg", "kafka", "--port", str(port),
                            "--data-dir", str(tmp_path / "data")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert keg.stdout is not None
        started = []
        for line in keg.stdout:  # until it says the broker serves
            started.append(line)
            if "Kafka broker on" in line:
                break
        assert keg.poll() is None, "".join(started)
        AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=60)
        (broker,) = Path(f"/proc/{keg.pid}/task/{keg.pid}/children").read_text().split()
        os.kill(int(broker), signal.SIGKILL)
        output, _ = keg.communicate(timeout=30)
        assert keg.returncode == 1, output
        assert "the Kafka broker exited with signal 9 (SIGKILL)" in output
    finally:
        if keg.poll() is None:
            keg.kill()
            keg.wait()

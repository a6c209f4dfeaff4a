"""TLS through the gateway, with the real broker's SSL listener behind it.

Envoy terminates the clients' TLS on the gateway's listeners (certificates served by
the control plane over SDS) and opens TLS to the broker (the broker's CA, its
advertised host verified). librdkafka, kafka-python and Kafka's Java tools produce and
consume through it; with mutual TLS the client certificate names the principal
(Kafka's ssl.principal.mapping.rules), and a rule allows alice and denies bob.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from kafka import KafkaConsumer, KafkaProducer

from control_plane.service import EXT_PROC_PATH, NATIVE
from control_plane.tls import ListenerTls, UpstreamTls, certificate_fingerprint
from control_plane.topology import DiscoveryError, fetch_topology
from ext_proc.connection import split_host_port
from keg.embedded.certs import DevCa, Issued
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway, GatewaySettings
from tests.integration.conftest import create_topic
from tests.integration.security.tls_clients import (
    java_client_properties,
    kafka_python_conf,
    librdkafka_conf,
    plaintext_answer,
    produce_records,
    served_certificate,
)

pytestmark = pytest.mark.integration

RULES = """
rules:
  - id: secrets-only-alice
    match:
      apis: [Produce, Fetch]
      topics: {prefix: [secret.]}
      not: {principals: {exact: ["User:alice"]}}
    action:
      deny: {error: TOPIC_AUTHORIZATION_FAILED, message: only alice reads and writes secrets}
"""


class MtlsEnv:
    def __init__(self, gateway: Gateway, ca: DevCa, alice: Issued, bob: Issued,
                 audit: Path, base: Path) -> None:
        self.gateway, self.ca, self.alice, self.bob = gateway, ca, alice, bob
        self.audit, self.base = audit, base

    def audit_events(self, rule_id: str) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        events = [json.loads(line) for line in self.audit.read_text().splitlines() if line]
        return [e for e in events if e["rule_id"] == rule_id]


@contextmanager
def mtls_gateway(kafka: EmbeddedKafka, dev_ca: DevCa, base: Path, data_path: str,
                 principal_mapping_rules: str = "RULE:^CN=(.*?),OU=people,.*$/$1/L",
                 principal_from: str = "subject") -> Iterator[MtlsEnv]:
    rules = base / "rules"
    rules.mkdir()
    (rules / "secrets.yaml").write_text(RULES)
    server = dev_ca.server("gateway-mtls")
    settings = GatewaySettings(
        bootstrap_servers=kafka.ssl_bootstrap, listen_port_base=0, work_dir=base / "work",
        ext_proc_log_level="WARNING", rules_dir=rules, audit_log=base / "audit.jsonl",
        tls=ListenerTls(server.cert, server.key, dev_ca.cert_file,
                        principal_mapping_rules=principal_mapping_rules,
                        principal_from=principal_from),
        upstream_tls=UpstreamTls(dev_ca.cert_file), data_path=data_path)
    # Subjects for the subject rules, SPIFFE ids (URI SANs) for the uri_san ones.
    alice = dev_ca.client("alice", "Alice", "people", uri="spiffe://keg/sa/alice")
    bob = dev_ca.client("bob", "Bob", "people", uri="spiffe://keg/sa/bob")
    with Gateway(settings) as gateway:
        yield MtlsEnv(gateway, dev_ca, alice, bob, base / "audit.jsonl", base)


@pytest.fixture(scope="module")
def mtls(kafka: EmbeddedKafka, dev_ca: DevCa,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsEnv]:
    """A mutual-TLS gateway on the ext_proc data path."""
    with mtls_gateway(kafka, dev_ca, tmp_path_factory.mktemp("mtls"), EXT_PROC_PATH) as env:
        yield env


@pytest.fixture(scope="module")
def mtls_native(kafka: EmbeddedKafka, dev_ca: DevCa,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsEnv]:
    """The same gateway on the native data path: keg's filter inside Envoy maps the
    client certificate to the principal itself."""
    base = tmp_path_factory.mktemp("mtls-native")
    with mtls_gateway(kafka, dev_ca, base, NATIVE) as env:
        statuses = [n for n in env.gateway.fleet_status() if n["role"] == "envoy"]
        assert [n["data_path"] for n in statuses] == [NATIVE]
        yield env


@pytest.fixture(params=[EXT_PROC_PATH, NATIVE])
def mtls_on(request: pytest.FixtureRequest) -> MtlsEnv:
    """The mutual-TLS gateway on each data path."""
    env = request.getfixturevalue("mtls" if request.param == EXT_PROC_PATH else "mtls_native")
    assert isinstance(env, MtlsEnv)
    return env


def _consume(conf: dict[str, str], topic: str, count: int) -> tuple[list[bytes], str | None]:
    consumer = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    error = None
    deadline = time.monotonic() + 30
    try:
        while len(values) < count and error is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            failure = message.error()
            if failure is not None:
                if failure.code() != KafkaError._PARTITION_EOF:
                    error = failure.name()
                continue
            values.append(message.value() or b"")
    finally:
        consumer.close()
    return values, error


def test_librdkafka_produces_and_consumes_over_tls(mtls: MtlsEnv, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap)
    conf = librdkafka_conf(mtls.gateway.bootstrap, mtls.ca, mtls.alice)
    assert produce_records(conf, topic, 20) == [None] * 20
    values, error = _consume(conf, topic, 20)
    assert error is None and sorted(values) == sorted(b"value-%d" % i for i in range(20))


def test_kafka_python_produces_and_consumes_over_tls(mtls: MtlsEnv,
                                                       kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap)
    conf = kafka_python_conf(mtls.gateway.bootstrap, mtls.ca, mtls.alice)
    producer = KafkaProducer(**conf, retries=0)
    for i in range(10):
        producer.send(topic, b"kp-%d" % i).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, **conf, auto_offset_reset="earliest",
                             consumer_timeout_ms=15000, group_id=f"g-{uuid.uuid4().hex[:6]}")
    values = [m.value for m in consumer]
    consumer.close()
    assert sorted(values) == sorted(b"kp-%d" % i for i in range(10))


def test_java_console_tools_produce_and_consume_over_tls(mtls: MtlsEnv,
                                                           kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap)
    config = java_client_properties(mtls.base / "alice.properties", mtls.ca, mtls.alice)
    produced = run_java_tool(
        "console-producer", "--bootstrap-server", mtls.gateway.bootstrap, "--topic", topic,
        "--producer.config", str(config), input="one\ntwo\nthree\n", check=True)
    assert produced.returncode == 0
    consumed = run_java_tool(
        "console-consumer", "--bootstrap-server", mtls.gateway.bootstrap, "--topic", topic,
        "--consumer.config", str(config), "--from-beginning", "--max-messages", "3",
        "--timeout-ms", "30000", check=True)
    assert consumed.stdout.split() == ["one", "two", "three"]


def test_the_certificate_names_the_principal_a_rule_allows_alice_denies_bob(
        mtls_on: MtlsEnv, kafka: EmbeddedKafka) -> None:
    mtls = mtls_on
    topic = create_topic(kafka.bootstrap, name=f"secret.{uuid.uuid4().hex[:8]}")
    alice = librdkafka_conf(mtls.gateway.bootstrap, mtls.ca, mtls.alice)
    bob = librdkafka_conf(mtls.gateway.bootstrap, mtls.ca, mtls.bob)
    assert produce_records(alice, topic, 3) == [None] * 3
    assert produce_records(bob, topic, 1) == ["TOPIC_AUTHORIZATION_FAILED"]
    values, error = _consume(alice, topic, 3)
    assert error is None and len(values) == 3
    _, error = _consume(bob, topic, 1)
    assert error == "TOPIC_AUTHORIZATION_FAILED"
    events = [e for e in mtls.audit_events("secrets-only-alice") if e["topic"] == topic]
    assert {e["principal"] for e in events} == {"User:bob"}
    assert {e["security_protocol"] for e in events} == {"SSL"}


def test_the_first_uri_san_names_the_principal_on_the_native_path(
        kafka: EmbeddedKafka, dev_ca: DevCa, tmp_path: Path) -> None:
    """`principal_from: uri_san`: keg's filter reads the certificate's URI SANs through
    Envoy's ABI and maps the SPIFFE id, as the ext_proc path does."""
    with mtls_gateway(kafka, dev_ca, tmp_path, NATIVE,
                      principal_mapping_rules=r"RULE:^spiffe:\/\/keg\/sa\/(.*)$/$1/",
                      principal_from="uri_san") as mtls:
        topic = create_topic(kafka.bootstrap, name=f"secret.{uuid.uuid4().hex[:8]}")
        alice = librdkafka_conf(mtls.gateway.bootstrap, mtls.ca, mtls.alice)
        bob = librdkafka_conf(mtls.gateway.bootstrap, mtls.ca, mtls.bob)
        assert produce_records(alice, topic, 2) == [None] * 2
        assert produce_records(bob, topic, 1) == ["TOPIC_AUTHORIZATION_FAILED"]
        events = mtls.audit_events("secrets-only-alice")
        assert {(e["principal"], e["security_protocol"]) for e in events} == {("User:bob", "SSL")}


def test_a_certificate_no_mapping_rule_applies_to_is_refused(
        mtls_on: MtlsEnv, kafka: EmbeddedKafka) -> None:
    """A broker refuses a client whose certificate name no ssl.principal.mapping.rules
    rule maps (Kafka's NoMatchingRule); so does the gateway, on either data path: its
    connection closes before any request reaches the broker."""
    topic = create_topic(kafka.bootstrap)
    robot = mtls_on.ca.client("robot", "Robot", "robots")
    conf = librdkafka_conf(mtls_on.gateway.bootstrap, mtls_on.ca, robot)
    assert produce_records(conf, topic, 1, timeout_ms=6000) == ["_MSG_TIMED_OUT"]


def test_a_plaintext_client_is_refused_on_a_tls_listener(mtls: MtlsEnv) -> None:
    host, port = split_host_port(mtls.gateway.bootstrap)
    answer = plaintext_answer(host, port)
    # No Kafka answer: the TLS handshake failed (at most a TLS alert record came back).
    assert answer == b"" or answer[0] == 0x15


def test_mutual_tls_refuses_a_client_without_a_trusted_certificate(
        mtls: MtlsEnv, tmp_path: Path, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap)
    stranger = DevCa(tmp_path / "other-ca").client("mallory", "Mallory", "people")
    for client in (None, stranger):
        conf = librdkafka_conf(mtls.gateway.bootstrap, mtls.ca, client)
        assert produce_records(conf, topic, 1, timeout_ms=6000) == ["_MSG_TIMED_OUT"], client


def test_discovery_verifies_the_brokers_certificate_and_host(kafka: EmbeddedKafka,
                                                             dev_ca: DevCa,
                                                             tmp_path: Path) -> None:
    good = asyncio.run(fetch_topology(kafka.ssl_bootstrap, tls=UpstreamTls(dev_ca.cert_file)))
    assert good.brokers
    with pytest.raises(DiscoveryError, match=r"not trusted.*mismatch"):
        asyncio.run(fetch_topology(kafka.ssl_bootstrap, tls=UpstreamTls(
            dev_ca.cert_file, server_name="kafka.elsewhere.example")))
    other = DevCa(tmp_path / "other")
    with pytest.raises(DiscoveryError, match="not trusted"):
        asyncio.run(fetch_topology(kafka.ssl_bootstrap, tls=UpstreamTls(other.cert_file)))


# -- rotation ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rotating(kafka: EmbeddedKafka, dev_ca: DevCa,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path, Path]]:
    base = tmp_path_factory.mktemp("rotation")
    first = dev_ca.server("gateway-first")
    cert, key = base / "gateway.pem", base / "gateway-key.pem"
    shutil.copy(first.cert, cert)
    shutil.copy(first.key, key)
    settings = GatewaySettings(
        bootstrap_servers=kafka.ssl_bootstrap, listen_port_base=0, work_dir=base / "work",
        ext_proc_log_level="WARNING", tls=ListenerTls(cert, key),
        upstream_tls=UpstreamTls(dev_ca.cert_file))
    with Gateway(settings) as gateway:
        yield gateway, cert, key


def test_certificate_rotation_during_a_100k_record_produce_drops_no_connection(
        rotating: tuple[Gateway, Path, Path], kafka: EmbeddedKafka, dev_ca: DevCa) -> None:
    gateway, cert, key = rotating
    host, port = split_host_port(gateway.bootstrap)
    before = served_certificate(host, port, dev_ca)
    assert before == certificate_fingerprint(cert.read_bytes())
    topic = create_topic(kafka.bootstrap, partitions=3)
    assert gateway.envoy is not None
    listeners = {k: v for k, v in gateway.envoy.dynamic_versions().items()
                 if k.startswith("listener/")}
    stats: list[dict[str, Any]] = []
    conf = {**librdkafka_conf(gateway.bootstrap, dev_ca), "linger.ms": 5,
            "statistics.interval.ms": 500, "stats_cb": lambda s: stats.append(json.loads(s)),
            "message.timeout.ms": 60000}
    producer = Producer(conf)
    total, delivered, errors = 100_000, [0], []

    def on_delivery(err: Any, _message: Any) -> None:
        if err is not None:
            errors.append(err.name())
        delivered[0] += 1

    for i in range(total):
        while True:
            try:
                producer.produce(topic, b"r" * 100, key=b"%d" % i, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    while delivered[0] < 30_000:
        producer.poll(0.05)
    rotated = dev_ca.server("gateway-second")
    shutil.copy(rotated.key, key)
    shutil.copy(rotated.cert, cert)
    rotated_at = delivered[0]
    # New connections see the new certificate while the producer's connections go on.
    wanted = certificate_fingerprint(rotated.cert.read_bytes())
    deadline = time.monotonic() + 30
    while served_certificate(host, port, dev_ca) != wanted:
        assert time.monotonic() < deadline, "the new certificate never reached Envoy"
        producer.poll(0.2)
    assert producer.flush(60) == 0
    assert rotated_at < total  # the rotation happened mid-produce
    assert delivered[0] == total and errors == []
    producer.poll(1)  # one more statistics callback
    # No listener changed (a change would drain its connections), and the producer
    # never lost a connection to the gateway.
    assert {k: v for k, v in gateway.envoy.dynamic_versions().items()
            if k.startswith("listener/")} == listeners
    brokers = stats[-1]["brokers"]
    assert {name: b["disconnects"] for name, b in brokers.items()} \
        == {name: 0 for name in brokers}, brokers

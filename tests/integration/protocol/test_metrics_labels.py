"""Labelled metrics through the real gateway, real broker, real clients, on the data
path of the suite's pass (ext_proc, then native).

A produce to a topic leaves series naming the topic, the client id and the principal
(librdkafka, Produce v9-12 with topic names; Kafka's Java producer, Produce v13 with
topic ids the gateway names from the Metadata answers it saw); a refusal leaves one
naming its Kafka error code, rule and topic. The Produce requests pass through
unheld: no rule asks for them. On the native path keg's Kafka filter counts the traffic
series itself (its own /metrics, envoy/kafka_filter/src/metrics.rs) and the ext_proc
service the decisions of the frames handed to it: a scrape here reads both.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from prometheus_client.parser import text_string_to_metric_families

from control_plane.service import NATIVE, free_port
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.dashboard import exposed, unknown_references
from tests.integration.conftest import create_topic, gateway_settings, rule_dir, scrape_metrics

pytestmark = [pytest.mark.integration]

# No rule names Produce: those requests pass unheld. The refusal test adds FREEZE.
RULES = """\
rules:
  - id: watch-topic-creation
    match: {apis: [CreateTopics]}
    action: {observe: {}}
"""
FREEZE = """\
  - id: freeze-ledger
    match: {apis: [Produce], topics: {prefix: [ledger.]}}
    action: {deny: {error: TOPIC_AUTHORIZATION_FAILED}}
"""


class Metered:
    def __init__(self, gateway: Gateway, rules: Path) -> None:
        self.gateway, self.rules = gateway, rules

    def scrape(self) -> str:
        return scrape_metrics(self.gateway)

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        return sum(sample.value for family in text_string_to_metric_families(self.scrape())
                   for sample in family.samples
                   if sample.name == name
                   and all(sample.labels.get(k) == v for k, v in labels.items()))

    def wait_for(self, name: str, above: float, **labels: str) -> None:
        deadline = time.monotonic() + 30
        while self.value(name, **labels) <= above:
            assert time.monotonic() < deadline, f"{name}{labels} stayed at {above}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def metered(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Metered]:
    base = tmp_path_factory.mktemp("metrics")
    rules = rule_dir(base / "rules", {"rules.yaml": RULES})
    settings = gateway_settings(kafka, base / "envoy", rules_dir=rules,
                                metrics_port=free_port())
    with Gateway(settings) as gateway:
        yield Metered(gateway, rules)


def produce(bootstrap: str, topic: str, count: int, client_id: str) -> list[int]:
    codes: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id,
                         "linger.ms": 0, "retries": 0, "message.timeout.ms": 30000})
    for i in range(count):
        producer.produce(topic, f"value-{i}".encode() * 10, on_delivery=lambda err, _m:
                         codes.append(0 if err is None else err.code()))
        producer.flush(30)
    assert producer.flush(30) == 0
    return codes


def test_a_produce_leaves_series_naming_its_topic_client_and_principal(
        metered: Metered, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap, name=f"orders.{uuid.uuid4().hex[:6]}")
    assert produce(metered.gateway.bootstrap, topic, 5, "billing-service") == [0] * 5
    labels = {"api": "Produce", "topic": topic, "client_id": "billing-service",
              "principal": "User:ANONYMOUS"}
    assert metered.value("keg_topic_requests_total", **labels) == 5
    assert metered.value("keg_topic_record_bytes_total", **labels) >= 5 * 70  # 5 batches
    assert metered.value("keg_requests_total", api="Produce", client_id="billing-service") >= 5


def test_the_java_producer_names_topics_by_id_and_they_are_named(
        metered: Metered, kafka: EmbeddedKafka) -> None:
    """Kafka 4.1's producer sends Produce v13 (topic ids): the series still name the topic."""
    topic = create_topic(kafka.bootstrap, name=f"java.{uuid.uuid4().hex[:6]}")
    run_java_tool("console-producer", "--bootstrap-server", metered.gateway.bootstrap,
                  "--topic", topic, "--producer-property", "client.id=java-app",
                  input="one\ntwo\nthree\n", check=True)
    assert metered.value("keg_topic_requests_total", api="Produce", topic=topic,
                         client_id="java-app") >= 1
    assert metered.value("keg_requests_total", api="Produce", version="13",
                         client_id="java-app") >= 1


def test_a_refusal_leaves_a_series_naming_its_error_code(
        metered: Metered, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap, name=f"ledger.{uuid.uuid4().hex[:6]}")
    applied = metered.value("keg_rule_reloads_total", result="applied")
    plane = metered.gateway.control_plane
    assert plane is not None
    version = metered.gateway.call(lambda: plane.rules_version)
    (metered.rules / "rules.yaml").write_text(RULES + FREEZE)
    metered.wait_for("keg_rule_reloads_total", applied, result="applied")
    # And every Envoy has it (on the native path the Kafka filter's table says which
    # Produce requests go to the ext_proc service's rules).
    deadline = time.monotonic() + 30
    while (metered.gateway.call(lambda: plane.rules_version) == version
           or not metered.gateway.call(plane.nodes_converged)):
        assert time.monotonic() < deadline, "the Envoys never had the new rule set"
        time.sleep(0.1)
    # One record: librdkafka refuses later ones itself once the topic failed.
    codes = produce(metered.gateway.bootstrap, topic, 1, "ledger-writer")
    assert codes == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert metered.value("keg_refusals_total", api="Produce", topic=topic,
                         client_id="ledger-writer", principal="User:ANONYMOUS",
                         rule="freeze-ledger", error="TOPIC_AUTHORIZATION_FAILED") == 1
    assert metered.value("keg_decisions_total", rule="freeze-ledger", outcome="denied",
                         api="Produce", error="TOPIC_AUTHORIZATION_FAILED") == 1
    # The refused Produce was held (a rule reads it): its topic is counted all the same.
    assert metered.value("keg_topic_requests_total", topic=topic) == 1


def test_the_dashboard_queries_what_this_data_path_exposes(
        metered: Metered, kafka: EmbeddedKafka) -> None:
    """The real processes' /metrics, after real traffic (a produce, a refusal, a
    connection that breaks the protocol), have every series and label the dashboard's
    data-path panels query (control-plane and Envoy panels are other processes'). On the
    native path the Kafka filter answers for the traffic series; the ext_proc service
    sees only handed-off frames (no broken connection, say), its series are checked on
    the ext_proc path."""
    topic = create_topic(kafka.bootstrap, name=f"ledger.{uuid.uuid4().hex[:6]}")
    produce(metered.gateway.bootstrap, topic, 1, "dashboard")
    host, port = metered.gateway.bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as garbage:
        garbage.sendall(b"\x00\x00\x00\x01garbage!")  # a frame of 1 byte: no request
        garbage.settimeout(10)
        # The gateway closed it: reset (ext_proc path) or ended (keg's filter).
        with contextlib.suppress(ConnectionResetError):
            assert garbage.recv(100) == b""
    series = exposed(metered.scrape())
    if metered.gateway.settings.data_path == NATIVE:
        assert unknown_references(series, ["keg_requests_total", "keg_topic_"]) == []
    else:
        assert unknown_references(series, ["keg_"], ["keg_api_", "keg_rules_"]) == []


def test_combinations_of_topics_and_client_ids_are_bounded_too(
        kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each label had its bound, their combinations had none: a client changing its client
    id from one request to the next made topics x client ids series (40,885 from one raw
    connection, a 9.5 MB page). A family now admits its first label sets (here 20); the
    others count with topic, client id and principal "other", and none is lost."""
    monkeypatch.setenv("KEG_METRICS_MAX_SERIES", "20")
    rules = rule_dir(tmp_path / "rules", {"rules.yaml": RULES})
    settings = gateway_settings(kafka, tmp_path / "envoy", rules_dir=rules,
                                metrics_port=free_port())
    topic = create_topic(kafka.bootstrap, name=f"many.{uuid.uuid4().hex[:6]}")
    with Gateway(settings) as gateway:
        for n in range(30):
            assert produce(gateway.bootstrap, topic, 1, f"client-{n}") == [0]
        samples = [sample for family in text_string_to_metric_families(scrape_metrics(gateway))
                   for sample in family.samples]
    topics = [s for s in samples if s.name == "keg_topic_requests_total"]
    assert len(topics) <= 21, [s.labels for s in topics]
    assert sum(s.value for s in topics if s.labels["topic"] == topic) >= 10  # admitted
    folded = {"api": "Produce", "topic": "other", "client_id": "other", "principal": "other"}
    assert [s.value for s in topics if s.labels == folded] != []
    assert sum(s.value for s in topics) == 30  # every Produce counted, once
    requests = [s for s in samples if s.name == "keg_requests_total"]
    assert len({tuple(sorted(s.labels.items())) for s in requests}) <= 20 + len(
        {(s.labels["api"], s.labels["version"]) for s in requests})
    assert any(s.labels["client_id"] == "other" for s in requests)

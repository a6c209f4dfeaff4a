"""A deny of CreateTopics also refuses the topics a broker creates by itself when a
Metadata request asks for one it lacks (`auto.create.topics.enable`, Kafka's default):
a producer is the usual creator of topics, and its Metadata request, not CreateTopics,
made them, so such a rule refused `kafka-topics --create` and let every producer
through. Kafka's authorizer checks CREATE on each auto-created topic the same way.
Through real Envoy, the real broker (auto-creation on) and real clients, on both data
paths."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaProducer
from kafka.errors import TopicAuthorizationFailedError

from kafka_wire import ApiKey, ErrorCode
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_with_static_rules
from tests.integration.raw_kafka import RawConnection

pytestmark = pytest.mark.integration

RULES = """
rules:
  - id: no-scratch-topics
    match: {apis: [CreateTopics], topics: {prefix: [scratch.]}}
    action: {deny: {}}
  - id: try-closing-drafts
    mode: dry-run
    match: {apis: [CreateTopics], topics: {prefix: [draft.]}}
    action: {deny: {}}
  - id: no-creation-for-robots
    match: {client_ids: {prefix: [robot-]}}
    action: {deny_apis: [CreateTopics]}
"""


@pytest.fixture(scope="module")
def audit_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("auto-creation-audit") / "audit.jsonl"


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory,
            audit_log: Path) -> Iterator[Gateway]:
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("auto-creation"), RULES,
                                   audit_log=audit_log, ext_proc_workers=1) as gateway:
        yield gateway


def broker_has(kafka: EmbeddedKafka, topic: str) -> bool:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    return topic in admin.list_topics(timeout=10).topics


def produce(gateway: Gateway, topic: str, client_id: str = "keg-test") -> KafkaError | None:
    """One record through the gateway with librdkafka's defaults (a producer asks the
    broker to create a topic it lacks); the delivery's error, None when stored."""
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "client.id": client_id,
                         "message.timeout.ms": 10000})
    outcome: list[KafkaError | None] = []
    producer.produce(topic, b"x", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(20)
    assert outcome, f"no delivery report for {topic}"
    return outcome[0]


def audit_events(audit_log: Path, rule_id: str, count: int = 1) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        events = [e for path in audit_log.parent.glob("audit*.jsonl")
                  for line in path.read_text().splitlines() if line
                  if (e := json.loads(line)).get("rule_id") == rule_id]
        if len(events) >= count or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def test_a_producer_cannot_have_the_broker_create_a_topic_a_rule_denies_creating(
        kafka: EmbeddedKafka, gateway: Gateway, audit_log: Path) -> None:
    denied = f"scratch.{uuid.uuid4().hex[:8]}"
    error = produce(gateway, denied)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    assert not broker_has(kafka, denied)
    events = audit_events(audit_log, "no-scratch-topics")
    assert any(e["outcome"] == "denied" and e.get("topic") == denied
               for e in events), events

    # Another client library, another Metadata version: kafka-python.
    other = f"scratch.{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap, max_block_ms=10000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(other, b"x").get(timeout=20)
    finally:
        producer.close(timeout=5)
    assert not broker_has(kafka, other)

    # And Kafka's own Java producer.
    third = f"scratch.{uuid.uuid4().hex[:8]}"
    done = run_java_tool("console-producer", "--bootstrap-server", gateway.bootstrap,
                         "--topic", third, "--producer-property", "max.block.ms=15000",
                         input="j1\n")
    said = done.stderr + done.stdout
    assert "TopicAuthorizationException" in said or "TOPIC_AUTHORIZATION_FAILED" in said, \
        said[-2000:]
    assert not broker_has(kafka, third)


def test_topics_no_rule_refuses_are_still_created_and_existing_ones_written(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    allowed = f"fresh.{uuid.uuid4().hex[:8]}"
    assert produce(gateway, allowed) is None
    assert broker_has(kafka, allowed)
    # A topic of the denied prefix that exists (made on the broker) is written as ever:
    # the rule refuses creating it, not using it.
    existing = create_topic(kafka.bootstrap, name=f"scratch.{uuid.uuid4().hex[:8]}")
    assert produce(gateway, existing) is None


def test_a_client_refused_createtopics_by_deny_apis_creates_nothing_by_producing(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    topic = f"robots.{uuid.uuid4().hex[:8]}"
    error = produce(gateway, topic, client_id="robot-7")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    assert not broker_has(kafka, topic)
    assert produce(gateway, topic, client_id="human-1") is None
    assert broker_has(kafka, topic)


def test_a_dry_run_creation_deny_reports_the_creation_and_lets_it_happen(
        kafka: EmbeddedKafka, gateway: Gateway, audit_log: Path) -> None:
    topic = f"draft.{uuid.uuid4().hex[:8]}"
    assert produce(gateway, topic) is None
    assert broker_has(kafka, topic)
    events = audit_events(audit_log, "try-closing-drafts")
    assert any(e["outcome"] == "would-deny" and e.get("topic") == topic
               for e in events), events


def test_metadata_without_auto_creation_and_for_every_topic_pass_as_asked(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """What asks for no creation is not changed: a Metadata request that does not allow
    auto-creation gets the broker's own UNKNOWN_TOPIC_OR_PARTITION for a denied prefix,
    and one for every topic lists them all."""
    existing = create_topic(kafka.bootstrap, name=f"scratch.{uuid.uuid4().hex[:8]}")
    missing = f"scratch.{uuid.uuid4().hex[:8]}"
    connection = RawConnection(gateway.bootstrap)
    try:
        answer = connection.request(ApiKey.METADATA, 12, {
            "Topics": [{"Name": missing, "TopicId": uuid.UUID(int=0)}],
            "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False})
        assert [(t["Name"], t["ErrorCode"]) for t in answer["Topics"]] == [
            (missing, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
        every = connection.request(ApiKey.METADATA, 12, {
            "Topics": None, "AllowAutoTopicCreation": True,
            "IncludeTopicAuthorizedOperations": False})
        assert existing in {t["Name"] for t in every["Topics"]}
    finally:
        connection.close()
    assert not broker_has(kafka, missing)


def test_an_old_metadata_version_that_always_creates_is_refused_the_denied_topics(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """Metadata v0-3 has no AllowAutoTopicCreation (the broker creates whatever it
    lacks): a denied topic it names is refused, whether or not it exists, and the
    request's other topics are answered."""
    other = create_topic(kafka.bootstrap, name=f"fresh.{uuid.uuid4().hex[:8]}")
    missing = f"scratch.{uuid.uuid4().hex[:8]}"
    connection = RawConnection(gateway.bootstrap)
    try:
        answer = connection.request(ApiKey.METADATA, 3, {
            "Topics": [{"Name": missing}, {"Name": other}]})
    finally:
        connection.close()
    errors = {t["Name"]: t["ErrorCode"] for t in answer["Topics"]}
    assert errors == {missing: ErrorCode.TOPIC_AUTHORIZATION_FAILED, other: ErrorCode.NONE}
    assert not broker_has(kafka, missing)

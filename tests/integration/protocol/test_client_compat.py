"""What the broker offers reaches clients through the gateway, and answers keep their order.

Regression tests for defects real clients hit: held requests answered out of order
(librdkafka's watermark lookups with a rate rule loaded; Kafka's own
TransactionalMessageCopier with a record rule), the gateway capping Produce, Fetch and
the share-group APIs below what the broker offers (transactions with the broker's
default transaction.version=2 never committed; share consumers received nothing).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_settings, rule_dir

pytestmark = pytest.mark.integration

RECORD_RULE = """
rules:
  - id: copier-headers
    description: a record rule on the copier's topics, both ways
    match: {topics: {prefix: [ruled.]}}
    action: {headers: {set: {x-gateway: keg}}}
"""


@pytest.fixture(scope="module")
def ruled_gateway(kafka: EmbeddedKafka,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway with the shipped rate-limit example and a record rule loaded."""
    base = tmp_path_factory.mktemp("compat")
    rules = rule_dir(base / "rules", {"records.yaml": RECORD_RULE}, ["rate-limits.yaml"])
    with Gateway(gateway_settings(kafka, base / "envoy", rules_dir=rules)) as gateway:
        yield gateway


def produce_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    values = [f"record-{i}".encode() for i in range(count)]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(60) == 0
    return values


def read_committed(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    """Every committed record of partition 0, read directly from the broker."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    idle = 0
    try:
        while idle < 10:
            msgs = consumer.consume(1000, timeout=1)
            idle = 0 if msgs else idle + 1
            got += [bytes(m.value() or b"") for m in msgs if m.error() is None]
            if len(got) >= expected:
                idle += 5  # a few more polls: nothing more may arrive
    finally:
        consumer.close()
    return got


def test_watermarks_with_the_rate_limit_example_loaded(ruled_gateway: Gateway) -> None:
    """A held Metadata request followed by a pass-through ListOffsets on the same
    connection: answers must come back in request order (librdkafka failed 22-26 of 30
    tries with "response with correlation id N matches no request")."""
    topic = create_topic(ruled_gateway.bootstrap)
    produce_values(ruled_gateway.bootstrap, topic, 5)
    failures: list[tuple[int, object]] = []
    for attempt in range(30):
        consumer = Consumer({"bootstrap.servers": ruled_gateway.bootstrap,
                             "group.id": f"wm-{attempt}"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
            if (low, high) != (0, 5):
                failures.append((attempt, (low, high)))
        except Exception as err:
            failures.append((attempt, str(err)))
        finally:
            consumer.close()
    assert failures == []


@pytest.mark.parametrize("ruled", [False, True], ids=["no-rule", "record-rule"])
def test_transactional_message_copier_copies_exactly_once(
        kafka: EmbeddedKafka, gateway: Gateway, ruled_gateway: Gateway, ruled: bool) -> None:
    """Kafka's own system-test tool, broker defaults (transaction.version=2, KIP-890):
    the Java client skips AddPartitionsToTxn and needs Produce v12+."""
    through = ruled_gateway if ruled else gateway
    prefix = "ruled." if ruled else "plain."
    source = create_topic(kafka.bootstrap, name=f"{prefix}in-{uuid.uuid4().hex[:8]}")
    target = create_topic(kafka.bootstrap, name=f"{prefix}out-{uuid.uuid4().hex[:8]}")
    count = 6000
    values = produce_values(kafka.bootstrap, source, count)
    done = run_java_tool(
        "org.apache.kafka.tools.TransactionalMessageCopier",
        "--broker-list", through.bootstrap, "--input-topic", source, "--input-partition", "0",
        "--output-topic", target, "--transactional-id", f"copier-{uuid.uuid4().hex[:8]}",
        "--consumer-group", f"copier-{uuid.uuid4().hex[:8]}", "--transaction-size", "300",
        "--max-messages", str(count), "--use-group-metadata", timeout=300)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, done.stderr[-2000:]
    assert events and events[-1].get("remaining") == 0, events[-3:]
    assert sorted(read_committed(kafka.bootstrap, target, count)) == sorted(values)


def api_versions(bootstrap: str) -> dict[str, str]:
    """API name -> the version range Kafka's broker-api-versions tool was offered."""
    done = run_java_tool("broker-api-versions", "--bootstrap-server", bootstrap, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = {}
    for line in done.stdout.splitlines():
        name, sep, versions = line.strip().partition(": ")
        if sep and "(" in name and "->" not in line:
            found[name] = versions.split(" [")[0]  # "3 to 13", without "[usable: N]"
    return found


def test_the_gateway_offers_every_api_and_version_the_broker_offers(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    direct = api_versions(kafka.bootstrap)
    through = api_versions(gateway.bootstrap)
    assert through == direct
    assert direct["Produce(0)"].endswith("to 13") and direct["Fetch(1)"].endswith("to 18")
    assert "ShareFetch(78)" in direct and "ShareGroupHeartbeat(76)" in direct


def test_a_share_consumer_receives_what_it_receives_directly(
        kafka: EmbeddedKafka, gateway: Gateway, tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap)
    values = produce_values(kafka.bootstrap, topic, 200)

    def share_consume(bootstrap: str) -> list[str]:
        group = f"share-{uuid.uuid4().hex[:8]}"
        done = run_java_tool(
            "org.apache.kafka.tools.VerifiableShareConsumer", "--bootstrap-server", bootstrap,
            "--topic", topic, "--group-id", group, "--max-messages", str(len(values)),
            "--offset-reset-strategy", "earliest", "--verbose", timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        return sorted(e["value"] for e in events if e.get("name") == "record_data")

    direct = share_consume(kafka.bootstrap)
    assert direct == sorted(v.decode() for v in values)
    assert share_consume(gateway.bootstrap) == direct

"""A rule is handed only the APIs it can act on, through the real Envoy, broker and
clients on the native data path.

A safeguard acts on Produce requests (and on Fetch when it caps fetch sizes), nowhere
else; a rule whose match names topics (groups) acts only on APIs that name topics
(groups). Before the rule index knew either, a safeguard or a deny naming only topics
was a candidate for every API, and the module handed every Heartbeat, FindCoordinator,
InitProducerId, ApiVersions (and, for the safeguard, every OffsetCommit and OffsetFetch)
of every client to the Python service for nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from control_plane.providers import StaticRuleProvider
from filter_rules import load_rule_text
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway, GatewaySettings
from tests.integration.conftest import create_topic
from tests.integration.native.conftest import consume
from tests.integration.rules.test_rules_enforcement import produce

pytestmark = pytest.mark.integration

TOPIC_AUTHORIZATION_FAILED = 29
UNSUPPORTED_COMPRESSION_TYPE = 76

RULES = """
rules:
  - id: guarded-topics-compress
    match: {topics: {prefix: [guarded.]}}
    action:
      safeguard:
        compression: {require: [lz4, zstd], allow_uncompressed_below_bytes: 0}
"""
DENY_RULES = """
rules:
  - id: no-secrets
    match: {topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: mallory-is-out
    match: {apis: [Produce, Fetch], principals: {exact: [mallory]}}
    action: {deny: {}}
"""
# Requests a consumer group sends besides Fetch, none of which a safeguard acts on.
GROUP_APIS = ("FindCoordinator", "OffsetFetch", "OffsetCommit", "Heartbeat", "ListOffsets")
# Requests that name no topic: no topic rule acts on them.
TOPICLESS_APIS = ("ApiVersions", "FindCoordinator", "Heartbeat", "InitProducerId")


def gateway_with(kafka: EmbeddedKafka, rules_text: str, work_dir: Path) -> Gateway:
    rules = StaticRuleProvider(load_rule_text(rules_text, "rules.yaml"), version="1")
    return Gateway(GatewaySettings(
        bootstrap_servers=kafka.bootstrap, listen_port_base=0, rules_provider=rules,
        work_dir=work_dir, ext_proc_log_level="WARNING", data_path="native", metrics_port=0))


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway_with(kafka, RULES, tmp_path_factory.mktemp("native-safeguards")) as gw:
        yield gw


@pytest.fixture(scope="module")
def deny_gateway(kafka: EmbeddedKafka,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway_with(kafka, DENY_RULES, tmp_path_factory.mktemp("native-deny")) as gw:
        yield gw


def handed_off(gateway: Gateway, apis: tuple[str, ...]) -> dict[str, float]:
    return {api: gateway.handed_off_requests(api) for api in apis}


def produce_and_consume_in_a_group(gateway: Gateway, topic: str) -> None:
    """An idempotent lz4 producer writes 20 records; a group consumer reads and commits
    them one by one, all through `gateway`."""
    sent = produce({"bootstrap.servers": gateway.bootstrap, "compression.type": "lz4",
                    "enable.idempotence": True, "retries": 5},
                   [(topic, b"v%d" % i * 100) for i in range(20)])
    assert sent == [(topic, 0)] * 20
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "heartbeat.interval.ms": 500})
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        while len(values) < 20:
            msg = consumer.poll(30)
            assert msg is not None, f"only {len(values)} records came back"
            assert msg.error() is None, msg.error()
            values.append(msg.value() or b"")
            consumer.commit(message=msg, asynchronous=False)
        committed = consumer.committed(consumer.assignment(), timeout=10)
    finally:
        consumer.close()
    assert sorted(values) == sorted(b"v%d" % i * 100 for i in range(20))
    assert [tp.offset for tp in committed] == [20], "the group committed through the gateway"


def test_a_consumer_group_never_crosses_into_python_for_a_safeguard(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    topic = create_topic(kafka.bootstrap, name=f"guarded.{uuid.uuid4().hex[:8]}")
    before = handed_off(gateway, (*GROUP_APIS, *TOPICLESS_APIS))
    produce_and_consume_in_a_group(gateway, topic)
    assert handed_off(gateway, (*GROUP_APIS, *TOPICLESS_APIS)) == before, \
        "a safeguard acts on Produce only: no group request went to Python"


def test_requests_that_name_no_topic_never_cross_into_python_for_a_topic_rule(
        kafka: EmbeddedKafka, deny_gateway: Gateway) -> None:
    topic = create_topic(kafka.bootstrap, name=f"open.{uuid.uuid4().hex[:8]}")
    apis = (*TOPICLESS_APIS, "Produce", "Fetch")
    before = handed_off(deny_gateway, apis)
    produce_and_consume_in_a_group(deny_gateway, topic)
    assert handed_off(deny_gateway, apis) == before, \
        "the deny names topics: requests naming none stay in Envoy; the rule for mallory " \
        "names no topics, but these plaintext clients are User:ANONYMOUS"
    assert deny_gateway.handed_off_requests("OffsetCommit") > 0, "OffsetCommit names topics"
    secret = create_topic(kafka.bootstrap, name=f"secret.{uuid.uuid4().hex[:8]}")
    md = AdminClient({"bootstrap.servers": deny_gateway.bootstrap}).list_topics(secret, timeout=30)
    refused = md.topics[secret].error
    assert refused is not None and refused.code() == TOPIC_AUTHORIZATION_FAILED, \
        "the deny still holds (in the broker's answer, which lists the brokers)"
    assert md.brokers and not md.topics[secret].partitions


def test_only_requests_that_may_break_a_safeguard_cross_into_python(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """The module reads the safeguard's checks itself: a Produce that keeps them passes
    natively, one that may break them goes to the Python chain, which refuses it."""
    topic = create_topic(kafka.bootstrap, name=f"guarded.{uuid.uuid4().hex[:8]}")
    before = gateway.handed_off_requests("Produce")
    assert produce({"bootstrap.servers": gateway.bootstrap, "compression.type": "zstd"},
                   [(topic, b"z" * 1000)] * 30) == [(topic, 0)] * 30
    args = ["--bootstrap-server", gateway.bootstrap, "--topic", topic,
            "--compression-codec", "lz4"]  # its own flag: it overrides compression.type
    done = run_java_tool("console-producer", *args, input="j" * 2000 + "\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert gateway.handed_off_requests("Produce") == before, \
        "every batch was compressed as the safeguard requires: nothing went to Python"
    assert gateway.module_counter("handoff_safeguards_kept") > 0

    plain = produce({"bootstrap.servers": gateway.bootstrap, "compression.type": "none"},
                    [(topic, b"x" * 100)] * 3)
    assert plain == [(topic, UNSUPPORTED_COMPRESSION_TYPE)] * 3
    assert gateway.handed_off_requests("Produce") > before
    stored = consume({"bootstrap.servers": kafka.bootstrap, "group.id": "direct"}, topic)
    assert sorted(stored) == sorted([b"z" * 1000] * 30 + [b"j" * 2000]), \
        "what kept the checks is stored once, what broke them never"

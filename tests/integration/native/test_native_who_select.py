"""Who-selective hand-off through the real Envoy, broker and clients: with rules that
name principals, client networks, listeners or client ids, a request none of them
names passes natively (the Python service is not handed it), one they name goes to the
Python chain and is judged there.

Before who-selectors, one `deny` for bob on Produce sent every Produce of every client
through Python: a multi-tenant rule set taxed every tenant. Before client ids were read
by the module, a rule naming one client id did the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions

from control_plane.providers import StaticRuleProvider
from control_plane.topology import SaslPlain
from filter_rules import load_rule_text
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway, GatewaySettings
from tests.integration.conftest import SASL_USERS, create_topic, java_sasl
from tests.integration.native.conftest import consume
from tests.integration.rules.test_rules_enforcement import produce

pytestmark = pytest.mark.integration

TOPIC_AUTHORIZATION_FAILED = 29

RULES = """
rules:
  - id: bob-may-not-produce
    match: {apis: [Produce], principals: {exact: [bob]}}
    action: {deny: {}}
  - id: nothing-from-far-away
    match: {apis: [Produce], client_addresses: ["10.0.0.0/8", "fd00::/8"]}
    action: {deny: {}}
  - id: not-on-the-partner-listener
    match: {apis: [Produce, CreatePartitions], listeners: ["127.0.0.1:1"]}
    action: {deny: {}}
  - id: legacy-app-retired
    match: {apis: [Produce], client_ids: {exact: [legacy-app], prefix: [legacy-batch-]}}
    action: {deny: {}}
  - id: no-secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: no-local-repartitioning
    match: {apis: [CreatePartitions], client_addresses: ["127.0.0.0/8"]}
    action: {deny: {}}
"""


def client(gateway: Gateway, user: str, mechanism: str = "PLAIN") -> dict[str, Any]:
    return {"bootstrap.servers": gateway.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": SASL_USERS[user]}


def direct(kafka: EmbeddedKafka) -> dict[str, Any]:
    return {"bootstrap.servers": kafka.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": "keg",
            "sasl.password": SASL_USERS["keg"]}


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    rules = StaticRuleProvider(load_rule_text(RULES, "rules.yaml"), version="1")
    settings = GatewaySettings(
        bootstrap_servers=kafka.sasl_bootstrap, listen_port_base=0,
        sasl=SaslPlain("keg", SASL_USERS["keg"]), rules_provider=rules,
        work_dir=tmp_path_factory.mktemp("native-who"), ext_proc_log_level="WARNING",
        data_path="native", metrics_port=0)
    with Gateway(settings) as gw:
        yield gw


def stored(kafka: EmbeddedKafka, topic: str) -> list[bytes]:
    return consume({**direct(kafka), "group.id": f"direct-{uuid.uuid4().hex[:6]}"}, topic)


def test_produce_from_a_connection_no_rule_names_stays_in_envoy(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    topic = create_topic(kafka.bootstrap, name=f"who.{uuid.uuid4().hex[:8]}")
    before = gateway.handed_off_requests("Produce")
    # alice (librdkafka, PLAIN) and carol (librdkafka, SCRAM; Kafka's Java producer).
    assert produce(client(gateway, "alice"), [(topic, b"a")] * 20) == [(topic, 0)] * 20
    assert produce(client(gateway, "carol", "SCRAM-SHA-256"), [(topic, b"c")] * 5) == [
        (topic, 0)] * 5
    args = ["--bootstrap-server", gateway.bootstrap, "--topic", topic]
    for prop in java_sasl("alice"):
        args += ["--producer-property", prop]
    done = run_java_tool("console-producer", *args, input="j1\nj2\nj3\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(stored(kafka, topic)) == sorted([b"a"] * 20 + [b"c"] * 5 + [b"j1", b"j2", b"j3"])
    assert gateway.handed_off_requests("Produce") == before, \
        "no rule names alice, carol, 127.0.0.1 or this listener: nothing went to Python"

    # bob is named: his Produce goes to the Python chain, which refuses it.
    assert produce(client(gateway, "bob", "SCRAM-SHA-256"), [(topic, b"b")]) == [
        (topic, TOPIC_AUTHORIZATION_FAILED)]
    assert gateway.handed_off_requests("Produce") > before
    assert b"b" not in stored(kafka, topic)


def test_a_rule_naming_the_clients_network_is_enforced_in_python(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    topic = create_topic(kafka.bootstrap, name=f"who.{uuid.uuid4().hex[:8]}")
    before = gateway.handed_off_requests("CreatePartitions")
    admin = AdminClient(client(gateway, "alice"))
    future = admin.create_partitions([NewPartitions(topic, 3)])[topic]
    with pytest.raises(KafkaException):
        future.result(timeout=30)
    assert gateway.handed_off_requests("CreatePartitions") > before
    metadata = AdminClient(direct(kafka)).list_topics(topic, timeout=30)
    assert len(metadata.topics[topic].partitions) == 1, "the broker never saw it"


def test_only_the_client_ids_a_rule_names_go_to_python(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    topic = create_topic(kafka.bootstrap, name=f"who.{uuid.uuid4().hex[:8]}")
    before = gateway.handed_off_requests("Produce")
    modern = {**client(gateway, "alice"), "client.id": "modern-app"}
    assert produce(modern, [(topic, b"m")] * 10) == [(topic, 0)] * 10
    args = ["--bootstrap-server", gateway.bootstrap, "--topic", topic,
            "--producer-property", "client.id=legacy-batch"]  # the prefix is "legacy-batch-"
    for prop in java_sasl("alice"):
        args += ["--producer-property", prop]
    done = run_java_tool("console-producer", *args, input="j1\nj2\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert gateway.handed_off_requests("Produce") == before, \
        "no rule names modern-app or legacy-batch: nothing went to Python"

    legacy = {**client(gateway, "alice"), "client.id": "legacy-app"}
    assert produce(legacy, [(topic, b"l")]) == [(topic, TOPIC_AUTHORIZATION_FAILED)]
    after_legacy = gateway.handed_off_requests("Produce")
    assert after_legacy > before
    args[args.index("client.id=legacy-batch")] = "client.id=legacy-batch-7"
    refused = run_java_tool("console-producer", *args, input="j3\n")
    assert "TOPIC_AUTHORIZATION_FAILED" in refused.stderr + refused.stdout or \
        "TopicAuthorizationException" in refused.stderr + refused.stdout, refused.stderr[-2000:]
    assert gateway.handed_off_requests("Produce") > after_legacy
    assert sorted(stored(kafka, topic)) == sorted([b"m"] * 10 + [b"j1", b"j2"])

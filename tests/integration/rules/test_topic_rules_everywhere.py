"""A topic rule holds in every API that names the topic, with real admin clients.

Regression tests: a topic-deny rule used to stop only the APIs whose topics sit in
`Topics`/`TopicData`, so DescribeConfigs, AlterConfigs, IncrementalAlterConfigs,
ElectLeaders, ACL operations on the topic and requests naming it by id went through;
and DescribeGroups crashed rule evaluation when a rule had `topics:` but no `apis:`
(the shipped safeguards example), so `kafka-consumer-groups --describe` timed out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType

from kafka_wire import ApiKey
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_settings, rule_dir
from tests.integration.raw_kafka import RawConnection

pytestmark = pytest.mark.integration

DENY_SECRET = """
rules:
  - id: secret-topics-denied
    description: nobody touches secret topics through the gateway, whatever the API
    match: {topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: no-fetching
    description: these topics can be seen, not read
    match: {apis: [Fetch], topics: {prefix: [nofetch.]}}
    action: {deny: {}}
"""


@pytest.fixture(scope="module")
def guarded(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    base = tmp_path_factory.mktemp("topic-rules")
    rules = rule_dir(base / "rules", {"deny.yaml": DENY_SECRET}, ["safeguards.yaml"])
    with Gateway(gateway_settings(kafka, base / "envoy", rules_dir=rules)) as gateway:
        yield gateway


@pytest.fixture
def secret(kafka: EmbeddedKafka) -> str:
    return create_topic(kafka.bootstrap, name=f"secret.{uuid.uuid4().hex[:8]}")


def retention(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    return str(configs["retention.ms"].value)


def test_describe_groups_with_a_topic_rule_without_apis(kafka: EmbeddedKafka,
                                                        guarded: Gateway) -> None:
    topic = create_topic(kafka.bootstrap)
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()
    done = run_java_tool("consumer-groups", "--bootstrap-server", guarded.bootstrap,
                         "--describe", "--group", group, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert topic in done.stdout and group in done.stdout


def test_describe_and_alter_configs_of_a_denied_topic(kafka: EmbeddedKafka, guarded: Gateway,
                                                      secret: str) -> None:
    before = retention(kafka.bootstrap, secret)
    admin = AdminClient({"bootstrap.servers": guarded.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, secret)
    with pytest.raises(KafkaException) as described:
        admin.describe_configs([resource])[resource].result(30)
    assert described.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    change = ConfigResource(ResourceType.TOPIC, secret, incremental_configs=[
        ConfigEntry("retention.ms", "1234", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as altered:
        admin.incremental_alter_configs([change])[change].result(30)
    assert altered.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    legacy = KafkaAdminClient(bootstrap_servers=guarded.bootstrap)
    try:  # AlterConfigs, the non-incremental API
        result = legacy.alter_configs([KConfigResource(ConfigResourceType.TOPIC, secret,
                                                       configs={"retention.ms": "4321"})],
                                      raise_on_unknown=False, incremental=False)
    finally:
        legacy.close()
    assert "TopicAuthorizationFailed" in repr(result), result
    assert retention(kafka.bootstrap, secret) == before  # nothing reached the broker


def test_leader_election_and_acls_on_a_denied_topic(guarded: Gateway, secret: str) -> None:
    election = run_java_tool("leader-election", "--bootstrap-server", guarded.bootstrap,
                             "--election-type", "preferred", "--topic", secret,
                             "--partition", "0", timeout=120)
    elected = election.stdout + election.stderr
    assert "TopicAuthorizationException" in elected, elected[-2000:]
    acls = run_java_tool("acls", "--bootstrap-server", guarded.bootstrap, "--add",
                         "--allow-principal", "User:mallory", "--operation", "Read",
                         "--topic", secret, timeout=120)
    output = acls.stdout + acls.stderr
    # Without the rule the broker (no authorizer) says "Security features are disabled".
    assert "Security features are disabled" not in output
    assert "AuthorizationException" in output


def test_a_denied_topic_named_by_id(kafka: EmbeddedKafka, guarded: Gateway,
                                    secret: str) -> None:
    described = run_java_tool("topics", "--bootstrap-server", kafka.bootstrap, "--describe",
                              "--topic", secret, timeout=120)
    topic_id = described.stdout.split("TopicId:")[1].split()[0]
    by_id = run_java_tool("topics", "--bootstrap-server", guarded.bootstrap, "--describe",
                          "--topic-id", topic_id, timeout=120)
    assert secret not in by_id.stdout


def test_a_fetch_by_topic_id_is_denied(kafka: EmbeddedKafka, guarded: Gateway) -> None:
    """Consumers fetch by topic id (Fetch v13+) now that the broker's versions pass."""
    topic = create_topic(kafka.bootstrap, name=f"nofetch.{uuid.uuid4().hex[:8]}")
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic, b"classified")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": guarded.bootstrap, "group.id": f"c-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    errors, values = [], []
    try:
        for _ in range(15):
            msg = consumer.poll(1)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                errors.append(error.code())
                break
            values.append(msg.value())
    finally:
        consumer.close()
    assert values == [] and errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_an_open_transaction_is_described_without_its_denied_topics(
        kafka: EmbeddedKafka, guarded: Gateway, secret: str) -> None:
    """DescribeTransactions names no topic, yet its answer lists the partitions an open
    transaction writes: a denied topic is left out of it, as Kafka leaves out the topics
    a caller may not describe (regression: kafka-transactions.sh named the secret topic)."""
    other = create_topic(kafka.bootstrap)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": kafka.bootstrap,
                         "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(secret, b"classified")
    producer.produce(other, b"public")
    assert producer.flush(30) == 0
    try:
        def described(bootstrap: str) -> str:
            done = run_java_tool("transactions", "--bootstrap-server", bootstrap, "describe",
                                 "--transactional-id", transactional_id, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            return done.stdout

        direct = described(kafka.bootstrap)
        assert f"{secret}-0" in direct and f"{other}-0" in direct  # the broker lists both
        through = described(guarded.bootstrap)
        assert f"{other}-0" in through and "Ongoing" in through
        assert secret not in through
    finally:
        producer.abort_transaction(30)


def test_config_resources_of_denied_topics_are_not_listed(kafka: EmbeddedKafka,
                                                          guarded: Gateway, secret: str) -> None:
    """ListConfigResources (Kafka 4.1, KIP-1142) names resource types; its answer lists
    every topic. A denied topic is left out, as Metadata for all topics leaves it out
    (regression: the secret topic was listed). kafka-configs.sh lists topics' configs
    without naming them too."""
    other = create_topic(kafka.bootstrap)
    connection = RawConnection(guarded.bootstrap)
    try:
        listed = connection.request(ApiKey.LIST_CONFIG_RESOURCES, 1, {"ResourceTypes": [2]})
    finally:
        connection.close()
    names = {resource["ResourceName"] for resource in listed["ConfigResources"]}
    assert other in names and secret not in names
    done = run_java_tool("configs", "--bootstrap-server", guarded.bootstrap, "--describe",
                         "--entity-type", "topics", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"topic {other} " in done.stdout and secret not in done.stdout


def test_log_dirs_of_every_topic_are_described_without_denied_topics(
        kafka: EmbeddedKafka, guarded: Gateway, secret: str) -> None:
    """DescribeLogDirs for every topic (kafka-log-dirs.sh without --topic-list) lists
    each topic's partitions per log directory: a denied topic is left out, as Metadata
    for all topics leaves it out (regression: its name and size were listed)."""
    other = create_topic(kafka.bootstrap)

    def described(bootstrap: str) -> str:
        done = run_java_tool("log-dirs", "--bootstrap-server", bootstrap, "--describe",
                             timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    direct = described(kafka.bootstrap)
    assert f'"{secret}-0"' in direct and f'"{other}-0"' in direct
    through = described(guarded.bootstrap)
    assert f'"{other}-0"' in through and secret not in through

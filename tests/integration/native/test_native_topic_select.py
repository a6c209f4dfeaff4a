"""Topic-selective hand-off through the real Envoy, broker and clients: with rules on
some topics, a Produce naming none of them passes natively (the module's hand-off
counter does not move, the records arrive as written), one naming a ruled topic goes
to the Python chain (masked, or refused), by name (librdkafka) or by topic id (Kafka's
Java producer, Produce v13: the module names the id from the Metadata answers it saw).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import orjson
import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer

from control_plane.providers import StaticRuleProvider
from filter_rules import load_rule_text
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, deliver, gateway_settings
from tests.integration.native.conftest import consume
from tests.integration.rules.test_rules_enforcement import produce

pytestmark = pytest.mark.integration

TOPIC_AUTHORIZATION_FAILED = 29

RULES = """
rules:
  - id: mask-cards
    match: {topics: {prefix: [cards.]}}
    action: {mask: {fields: [$.card]}}
  - id: no-secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: mask-on-read
    match: {direction: response, topics: {prefix: [read.]}}
    action: {mask: {fields: [$.card]}}
"""
CARD = b'{"card": "4111111111111111", "n": 1}'


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    rules = StaticRuleProvider(load_rule_text(RULES, "rules.yaml"), version="1")
    settings = gateway_settings(kafka, tmp_path_factory.mktemp("native-select"),
                                rules_provider=rules, data_path="native", metrics_port=0)
    with Gateway(settings) as gw:
        yield gw


def counter(gateway: Gateway, name: str) -> int:
    """The sum of Envoy's `keg_kafka.<name>` counters (every listener)."""
    return gateway.module_counter(name)


def seen_by_python(gateway: Gateway, api: str = "Produce", version: int | None = None) -> float:
    """Requests of `api` (and `version`) the Python service saw (handed off to it)."""
    return gateway.handed_off_requests(api, version)


def produce_seen_by_python(gateway: Gateway, version: int | None = None) -> float:
    return seen_by_python(gateway, "Produce", version)


def stored(kafka: EmbeddedKafka, topic: str, expected: int | None) -> list[bytes]:
    """What the broker stored, read directly (not through the gateway)."""
    return consume({"bootstrap.servers": kafka.bootstrap, "group.id": uuid.uuid4().hex},
                   topic, expected)


def masked(value: bytes) -> bool:
    return b"4111111111111111" not in value and orjson.loads(value)["n"] == 1


def test_only_produce_requests_naming_a_ruled_topic_are_handed_off(gateway: Gateway,
                                                                   kafka: EmbeddedKafka) -> None:
    cards = create_topic(kafka.bootstrap, name=f"cards.{uuid.uuid4().hex[:8]}")
    plain = create_topic(kafka.bootstrap, name=f"plain.{uuid.uuid4().hex[:8]}")
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 5})
    try:
        # Connections and both topics' metadata first (Metadata is always handed off:
        # the chain learns topic ids from it).
        assert deliver(producer, plain, CARD) == 0 and deliver(producer, cards, CARD) == 0
        handed = counter(gateway, "handoff_requests")
        passed = counter(gateway, "handoff_not_selected")
        seen = produce_seen_by_python(gateway)
        assert passed >= 1, "a Produce of a topic no rule names passed natively"

        for _ in range(20):
            assert deliver(producer, plain, CARD) == 0
        assert produce_seen_by_python(gateway) == seen, "no Produce of the plain topic went"
        assert counter(gateway, "handoff_requests") == handed, "Envoy counted no hand-off"
        assert counter(gateway, "handoff_not_selected") >= passed + 20
        assert stored(kafka, plain, 21) == [CARD] * 21, "arrived as written"

        for _ in range(5):
            assert deliver(producer, cards, CARD) == 0
        assert produce_seen_by_python(gateway) >= seen + 5, "the ruled topic was handed off"
        assert counter(gateway, "handoff_requests") >= handed + 5
        values = stored(kafka, cards, 6)
        assert len(values) == 6 and all(masked(v) for v in values), values
    finally:
        producer.flush(10)
        del producer


def test_a_deny_rule_still_refuses_its_topic_while_others_pass(gateway: Gateway,
                                                               kafka: EmbeddedKafka) -> None:
    secret = create_topic(kafka.bootstrap, name=f"secret.{uuid.uuid4().hex[:8]}")
    plain = create_topic(kafka.bootstrap, name=f"plain.{uuid.uuid4().hex[:8]}")
    conf = {"bootstrap.servers": gateway.bootstrap}
    assert produce(conf, [(plain, b"warm-up")]) == [(plain, 0)]
    answers = counter(gateway, "handoff_answers")
    assert produce(conf, [(secret, b"s")]) == [(secret, TOPIC_AUTHORIZATION_FAILED)]
    assert counter(gateway, "handoff_answers") > answers, "the Python chain answered"
    seen, passed = produce_seen_by_python(gateway), counter(gateway, "handoff_not_selected")
    assert produce(conf, [(plain, b"p")] * 3) == [(plain, 0)] * 3
    assert produce_seen_by_python(gateway) == seen, "the plain topic passed natively"
    assert counter(gateway, "handoff_not_selected") > passed
    assert stored(kafka, secret, None) == []  # (up to its high watermark: nothing)
    # One request naming both: handed off, the secret topic refused, the plain one stored.
    results = produce({**conf, "linger.ms": 500}, [(secret, b"s2"), (plain, b"p2")])
    assert sorted(results) == sorted([(secret, TOPIC_AUTHORIZATION_FAILED), (plain, 0)])
    assert stored(kafka, plain, 5)[-1] == b"p2"


def test_the_java_producer_naming_topics_by_id_is_selected_too(gateway: Gateway,
                                                               kafka: EmbeddedKafka) -> None:
    """Kafka 4.1's Java producer sends Produce v13 (topic ids): the module names the ids
    from the Metadata answers it rewrote; an id it could not name would be handed off."""
    cards = create_topic(kafka.bootstrap, name=f"cards.{uuid.uuid4().hex[:8]}")
    plain = create_topic(kafka.bootstrap, name=f"plain.{uuid.uuid4().hex[:8]}")

    def java_produce(topic: str, values: list[bytes]) -> None:
        done = run_java_tool("console-producer", "--bootstrap-server", gateway.bootstrap,
                             "--topic", topic, "--producer-property", "acks=all",
                             input="".join(v.decode() + "\n" for v in values), timeout=120)
        assert done.returncode == 0, done.stderr

    passed = counter(gateway, "handoff_not_selected")
    java_produce(plain, [CARD] * 3)
    assert produce_seen_by_python(gateway, 13) == 0, "no v13 Produce of the plain topic handed off"
    assert counter(gateway, "handoff_not_selected") > passed, "it passed natively, by its id"
    assert stored(kafka, plain, 3) == [CARD] * 3
    java_produce(cards, [CARD] * 3)
    assert produce_seen_by_python(gateway, 13) > 0, "the Java producer sent Produce v13"
    values = stored(kafka, cards, 3)
    assert len(values) == 3 and all(masked(v) for v in values), values


def test_a_record_larger_than_the_hand_off_bound_goes_through(gateway: Gateway,
                                                               kafka: EmbeddedKafka) -> None:
    # After a first hand-off on a connection, the module paused reading from the client
    # once the frame it was collecting outgrew the per-connection bound (16 MiB): only
    # more reading could complete that frame, so the connection stalled for good and
    # the producer timed out. Now the frame is read whole and handed off.
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"cards.big-{uuid.uuid4().hex[:6]}"
    big = 20 << 20
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    limit = big + (1 << 20)
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": str(limit)})],
                        operation_timeout=30)[topic].result(30)
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "message.max.bytes": limit,
                         "linger.ms": 0, "message.timeout.ms": 60000, "retries": 0})
    assert deliver(producer, topic, CARD) == 0  # the connection's first hand-off
    value = orjson.dumps({"card": "4111111111111111", "pad": "x" * big})
    assert len(value) > 16 << 20
    assert deliver(producer, topic, value) == 0
    assert deliver(producer, topic, CARD) == 0  # and the connection goes on
    stored_values = stored(kafka, topic, 3)
    assert len(stored_values) == 3
    assert len(stored_values[1]) > big and b"4111111111111111" not in stored_values[1]


def consume_in_session(client: str, bootstrap: str, topic: str, count: int) -> list[bytes]:
    """`count` values of `topic` read from its start through `bootstrap` by a client that
    fetches in a KIP-227 session, 2 KiB per fetch (so most fetches are incremental):
    Kafka's Java console consumer, or kafka-python (Fetch v12, topics by name)."""
    if client == "java":
        done = run_java_tool(
            "console-consumer", "--bootstrap-server", bootstrap, "--topic", topic,
            "--from-beginning", "--max-messages", str(count), "--timeout-ms", "60000",
            "--consumer-property", "max.partition.fetch.bytes=2048",
            "--consumer-property", "fetch.max.bytes=2048", timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return [line.encode() for line in done.stdout.splitlines()]
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             group_id=None, max_partition_fetch_bytes=2048,
                             fetch_max_bytes=2048, consumer_timeout_ms=30_000)
    try:
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == count:
                break
        return values
    finally:
        consumer.close()


@pytest.mark.parametrize("client", ["java", "kafka-python"])
def test_incremental_fetches_are_judged_by_their_answers(
        gateway: Gateway, kafka: EmbeddedKafka, client: str) -> None:
    """Kafka's Java consumer and kafka-python fetch in a session (KIP-227): after the first
    Fetch every one is incremental, naming only what changed, and its answer carries
    records of any partition of the session. Such a Fetch was always handed off once a
    consume-time rule existed, so a consumer of a topic no rule names went through Python
    for every fetch. Now it goes to the broker at once and its answer decides: one naming
    no ruled topic goes to the consumer as it came; one naming a ruled topic goes to the
    Python chain after its request (masked here)."""
    plain = create_topic(kafka.bootstrap, name=f"plain.{uuid.uuid4().hex[:8]}")
    read = create_topic(kafka.bootstrap, name=f"read.{uuid.uuid4().hex[:8]}")
    count = 120
    direct = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    for topic in (plain, read):
        for _batch in range(count // 10):  # small batches: many fetches of 2 KiB each
            for _ in range(10):
                direct.produce(topic, CARD)
            assert direct.flush(30) == 0

    fetches, judged = seen_by_python(gateway, "Fetch"), counter(gateway, "handoff_by_answer")
    passed = counter(gateway, "handoff_answer_not_selected")
    assert consume_in_session(client, gateway.bootstrap, plain, count) == [CARD] * count
    assert seen_by_python(gateway, "Fetch") == fetches, "no Fetch of the plain topic went"
    assert counter(gateway, "handoff_by_answer") > judged, "incremental fetches were sent"
    assert counter(gateway, "handoff_answer_not_selected") > passed, "their answers passed"

    values = consume_in_session(client, gateway.bootstrap, read, count)
    assert len(values) == count and all(masked(v) for v in values), values[:3]
    assert seen_by_python(gateway, "Fetch") > fetches, "the ruled topic's answers went"

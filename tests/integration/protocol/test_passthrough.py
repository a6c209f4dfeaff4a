"""Kafka through Envoy through the ext_proc service, with real clients, byte-exact."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaProducer

from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import create_topic

pytestmark = pytest.mark.integration

RECORDS = 10_000
COMPRESSIONS = ["none", "gzip", "snappy", "lz4", "zstd"]


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, Any], ...]
    timestamp: int


def make_records(n: int, seed: str) -> list[Record]:
    # Recent timestamps: records older than the topic's retention (7 days) may be
    # deleted by the broker's retention check while the test reads them.
    base = int(time.time() * 1000) - n
    return [
        Record(
            key=f"{seed}-key-{i}".encode(),
            value=(f"{seed}-value-{i}-".encode() + bytes(range(i % 200))) * (1 + i % 3),
            headers=(("trace", f"t{i}".encode()), ("bin", bytes([i % 256, 0, 255]))),
            timestamp=base + i,
        )
        for i in range(n)
    ]


def produce_confluent(bootstrap: str, topic: str, records: list[Record], compression: str) -> None:
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "compression.type": compression,
        "linger.ms": 5,
        "enable.idempotence": True,
    })
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for r in records:
        while True:
            try:
                producer.produce(topic, r.value, r.key, headers=list(r.headers),
                                 timestamp=r.timestamp, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert errors == []


def produce_kafka_python(bootstrap: str, topic: str, records: list[Record],
                         compression: str) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if compression == "none" else compression,
        linger_ms=5,
        acks="all",
    )
    futures = [
        producer.send(topic, value=r.value, key=r.key, headers=list(r.headers),
                      timestamp_ms=r.timestamp)
        for r in records
    ]
    producer.flush(60)
    for f in futures:
        f.get(timeout=30)
    producer.close(10)


def consume_all(bootstrap: str, topic: str, count: int, group: str | None = None,
                timeout: float = 60) -> list[Record]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group or f"g-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1.0):
                assert msg.error() is None, msg.error()
                out.append(Record(msg.key(), msg.value(), tuple(msg.headers() or ()),  # type: ignore[arg-type]
                                  msg.timestamp()[1]))
    finally:
        consumer.close()
    return out


PRODUCERS = {"confluent-kafka": produce_confluent, "kafka-python": produce_kafka_python}


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_produce_and_consume_byte_exact(gateway: Gateway, kafka: EmbeddedKafka, client: str,
                                        compression: str) -> None:
    topic = create_topic(gateway.bootstrap, partitions=1)
    sent = make_records(RECORDS, f"{client}-{compression}")
    PRODUCERS[client](gateway.bootstrap, topic, sent, compression)

    through_gateway = consume_all(gateway.bootstrap, topic, RECORDS)
    assert len(through_gateway) == RECORDS
    assert through_gateway == sent  # one partition: order, keys, values, headers, timestamps
    # And the broker stored exactly that: a direct read agrees with the gateway's.
    assert consume_all(kafka.bootstrap, topic, RECORDS) == through_gateway


def test_consumer_group_of_two_commits_through_gateway(gateway: Gateway) -> None:
    topic = create_topic(gateway.bootstrap, partitions=4)
    group = f"group-{uuid.uuid4().hex[:8]}"
    members = [
        Consumer({
            "bootstrap.servers": gateway.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "partition.assignment.strategy": "range",
        })
        for _ in range(2)
    ]
    try:
        for m in members:
            m.subscribe([topic])
        # Let the group settle: both members own disjoint halves of the partitions.
        deadline = time.monotonic() + 90
        while True:
            for m in members:
                assert m.consume(10, 0.2) == []  # nothing produced yet
            assignments = [{tp.partition for tp in m.assignment()} for m in members]
            if all(assignments) and assignments[0] | assignments[1] == {0, 1, 2, 3} \
                    and assignments[0].isdisjoint(assignments[1]):
                break
            assert time.monotonic() < deadline, f"group never settled: {assignments}"

        sent = make_records(2_000, "group")
        produce_confluent(gateway.bootstrap, topic, sent, "lz4")
        values: set[bytes | None] = set()
        per_member: list[set[int | None]] = [set(), set()]
        deadline = time.monotonic() + 60
        while len(values) < len(sent) and time.monotonic() < deadline:
            for i, m in enumerate(members):
                for msg in m.consume(500, 0.2):
                    assert msg.error() is None, msg.error()
                    per_member[i].add(msg.partition())
                    values.add(msg.value())
        assert values == {r.value for r in sent}
        assert per_member == assignments  # each member read exactly its own partitions
        for m in members:
            m.commit(asynchronous=False)
        committed = members[0].committed([TopicPartition(topic, p) for p in range(4)],
                                         timeout=30)
        assert sum(tp.offset for tp in committed) == len(sent)
    finally:
        for m in members:
            m.close()


def test_java_console_clients_through_gateway(gateway: Gateway) -> None:
    topic = create_topic(gateway.bootstrap)
    lines = [f"java-line-{i}" for i in range(50)]
    produced = run_java_tool(
        "console-producer", "--bootstrap-server", gateway.bootstrap, "--topic", topic,
        input="\n".join(lines) + "\n", timeout=120,
    )
    assert produced.returncode == 0, produced.stderr
    consumed = run_java_tool(
        "console-consumer", "--bootstrap-server", gateway.bootstrap, "--topic", topic,
        "--from-beginning", "--max-messages", str(len(lines)), "--timeout-ms", "60000",
        timeout=120,
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.split() == lines

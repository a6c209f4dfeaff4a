"""A consumer's Fetch answers a record rule reads, sized to what one hand-off can carry
in time: real Envoy with keg's module, the real Python service, the real broker and
librdkafka with its default fetch sizes.

A consumer of many partitions with a backlog asks for 1 MiB a partition and up to 50 MiB
an answer (librdkafka's and Java's defaults): 32 partitions made 32 MiB answers of small
records, which the service could not mask within the hand-off timeout, so every fetch
failed (a retriable error) and the consumer asked for the same offsets for ever, 0
records read. The module now lowers such a Fetch's max_bytes
(`core::topics::HANDOFF_FETCH_MAX_BYTES`, 4 MiB); the broker answers at least one batch
whatever it says (KIP-74), so every answer is progress.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer

from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_with_static_rules

pytestmark = pytest.mark.integration

PARTITIONS = 32
# 200-byte JSON records, a little over 1 MiB a partition: the first answer of a default
# consumer holds about 168,000 of them.
PER_PARTITION = 5_600
FETCH_MASK_RULES = """
rules:
  - id: mask-email-at-fetch
    match: {direction: response, topics: {prefix: [fmask.]}}
    action: {mask: {fields: [$.email]}}
"""


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # A 1 s hand-off timeout: a 32 MiB answer of small records takes the service longer
    # on any machine, a 4 MiB one a fraction of it.
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("native-fetch-size"),
                                   FETCH_MASK_RULES, data_path="native",
                                   message_timeout_s=1.0) as gw:
        yield gw


def _fill(bootstrap: str, topic: str) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.size": 1_000_000, "compression.type": "none"})
    count = 0
    for partition in range(PARTITIONS):
        for n in range(PER_PARTITION):
            seq = partition * PER_PARTITION + n
            value = json.dumps({"seq": seq, "email": f"user{seq}@example.com",
                                "note": "x" * 120}).encode()
            while True:
                try:
                    producer.produce(topic, value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.1)
            count += 1
    assert producer.flush(60) == 0
    return count


def test_a_consumer_of_many_partitions_with_a_backlog_reads_it_all_through_a_fetch_rule(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap, partitions=PARTITIONS,
                         name=f"fmask.{uuid.uuid4().hex[:6]}")
    total = _fill(kafka.bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen: set[int] = set()
    unmasked = 0
    progress = time.monotonic()
    try:
        while len(seen) < total and time.monotonic() - progress < 30:
            message = consumer.poll(1.0)
            if message is None or message.error() is not None:
                continue
            record = json.loads(message.value() or b"{}")
            assert record["seq"] not in seen, f"record {record['seq']} twice"
            seen.add(record["seq"])
            unmasked += "@" in record["email"]
            progress = time.monotonic()
    finally:
        consumer.close()
    failures = gateway.module_counter("handoff_failures")
    assert len(seen) == total, f"{len(seen):,} of {total:,} read ({failures} hand-offs failed)"
    assert unmasked == 0
    assert gateway.module_counter("handoff_fetch_capped") > 0

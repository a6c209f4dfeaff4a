"""Every frame real clients and the gateway exchanged decodes and re-encodes byte-exact.

librdkafka and kafka-python produce (compressed), consume in a group, commit and run
admin calls through a recording relay in front of the gateway; kafka_wire must read
every recorded request and response and write each back as the same bytes.
(Values against kafka-python's own decoder: tests/unit/kafka_wire/test_codec_crosscheck.py.)
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

import kafka_wire as kw
from kafka_wire import ApiKey
from tests.integration.conftest import create_topic
from tests.integration.relay import RecordingRelay

pytestmark = pytest.mark.integration


def exercise_librdkafka(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd",
                         "enable.idempotence": True, "client.id": "rdkafka-it"})
    for i in range(500):
        producer.produce(topic, f"v{i}".encode(), f"k{i}".encode(), headers=[("h", b"1")])
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "client.id": "rdkafka-it"})
    consumer.subscribe([topic])
    got, deadline = 0, time.monotonic() + 60
    while got < 500 and time.monotonic() < deadline:
        got += len(consumer.consume(500, 0.5))
    assert got == 500
    consumer.commit(asynchronous=False)
    consumer.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.describe_configs([ConfigResource("topic", topic)])[
        ConfigResource("topic", topic)].result(30)


def exercise_kafka_python(bootstrap: str, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip",
                             client_id="kafka-python-it")
    for i in range(300):
        producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    producer.flush(30)
    producer.close(10)
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, client_id="kafka-python-it",
                             group_id=f"g-{uuid.uuid4().hex[:6]}",
                             auto_offset_reset="earliest", consumer_timeout_ms=10_000)
    assert sum(1 for _ in zip(range(800), consumer, strict=False)) == 800
    consumer.commit()
    consumer.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kafka-python-it")
    admin.list_groups()
    admin.describe_topics([topic])
    admin.close()


def test_real_client_frames_round_trip(relay: RecordingRelay) -> None:
    topic = create_topic(relay.bootstrap, partitions=2)
    exercise_librdkafka(relay.bootstrap, topic)
    exercise_kafka_python(relay.bootstrap, topic)
    seen: Counter[tuple[str, int]] = Counter()
    for conn in relay.snapshot():
        for rec in conn.frames:
            if rec.direction == "request":
                header, body = kw.decode_request(rec.frame)
                again = kw.write_request_header(header) + kw.encode_body(
                    header.api_key, header.api_version, "request", body)
            else:
                correlation_id, tags, offset = kw.read_response_header(
                    rec.frame, rec.api_key, rec.api_version)
                body, _ = kw.decode_body(rec.api_key, rec.api_version, "response", rec.frame,
                                         offset)
                again = kw.write_response_header(correlation_id, rec.api_key, rec.api_version,
                                                 tags) + kw.encode_body(
                    rec.api_key, rec.api_version, "response", body)
            assert again == rec.frame, f"{kw.api_name(rec.api_key)} v{rec.api_version} " \
                f"{rec.direction} from {conn.client_id}"
            seen[(rec.direction, rec.api_key)] += 1
    # The run really covered the data path and the group protocol, both ways.
    for api in (
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.METADATA,
        ApiKey.JOIN_GROUP,
        ApiKey.OFFSET_COMMIT,
    ):
        assert seen[("request", api)] and seen[("response", api)], kw.api_name(api)
    assert sum(seen.values()) > 100

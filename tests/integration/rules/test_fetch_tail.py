"""A Fetch answer cut at the broker's size limit ends with part of a record batch:
clients skip it, yet its complete records are readable, and a consume-time rule never
saw them (the records filter passed the partial batch as it came). A consumer that chose
its max_bytes read a masked topic in the clear, almost whole (found by a new user with a
raw Fetch). Through real Envoy and the real broker, on both data paths."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import orjson
import pytest
from confluent_kafka import Producer

from kafka_wire import ApiKey, ErrorCode
from kafka_wire.records import BatchView, iter_batches
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_with_static_rules
from tests.integration.raw_kafka import RawConnection

pytestmark = pytest.mark.integration

RULES = """
rules:
  - id: mask-ssn-when-read
    match: {direction: response, topics: {prefix: [tail.]}}
    action: {mask: {fields: [$.ssn]}}
"""
SSN = b"111-22-3333"


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("fetch-tail"), RULES) as gateway:
        yield gateway


def fetch(bootstrap: str, topic: str, max_bytes: int) -> bytes:
    """The records of partition 0 from offset 0, as a Fetch v12 with these limits gets them."""
    connection = RawConnection(bootstrap)
    try:
        answer = connection.request(ApiKey.FETCH, 12, {
            "ReplicaId": -1, "MaxWaitMs": 100, "MinBytes": 1, "MaxBytes": max_bytes,
            "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1, "Topics": [
                {"Topic": topic, "Partitions": [
                    {"Partition": 0, "CurrentLeaderEpoch": -1, "FetchOffset": 0,
                     "LastFetchedEpoch": -1, "LogStartOffset": -1,
                     "PartitionMaxBytes": max_bytes}]}],
            "ForgottenTopicsData": [], "RackId": ""})
    finally:
        connection.close()
    partition = answer["Responses"][0]["Partitions"][0]
    assert partition["ErrorCode"] == ErrorCode.NONE, partition
    return bytes(partition["Records"] or b"")


def test_the_partial_batch_a_fetch_answer_ends_with_is_not_handed_out_unread(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    topic = create_topic(kafka.bootstrap, name=f"tail.{uuid.uuid4().hex[:8]}")
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 100,
                         "compression.type": "none"})
    for batch in range(2):  # two batches of 200 records
        for i in range(200):
            producer.produce(topic, orjson.dumps({"ssn": SSN.decode(), "n": batch * 200 + i}))
        producer.flush(30)
    direct = fetch(kafka.bootstrap, topic, 1 << 20)
    sizes = [len(entry.raw) for entry in iter_batches(direct)]
    assert len(sizes) == 2 and direct.count(SSN) == 400, sizes
    # The second batch cut 100 bytes short of its end: most of its records are whole.
    limit = sizes[0] + sizes[1] - 100
    assert fetch(kafka.bootstrap, topic, limit).count(SSN) > 150  # what a broker sends

    through = fetch(gateway.bootstrap, topic, limit)
    assert through.count(SSN) == 0
    entries = list(iter_batches(through))
    assert len(entries) == 1 and isinstance(entries[0], BatchView)
    assert through.count(b'"ssn":"') == 200  # the whole first batch, masked

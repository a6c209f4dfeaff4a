"""Deny rules inside a fetch session (KIP-227): the broker keeps the session's epoch, so a
refusal must never leave it behind. Through real Envoy and the real broker, with raw
Fetch requests as Kafka's Java consumer sends them (librdkafka opens no sessions)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_wire import ApiKey, ErrorCode
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_with_static_rules
from tests.integration.raw_kafka import RawConnection

pytestmark = pytest.mark.integration

RULES = """
rules:
  - id: deny-secret
    match: {topics: {prefix: [secret.]}}
    action: {deny: {}}
"""
FETCH_VERSION = 12  # topics by name, sessions


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("sessions"), RULES) as gateway:
        yield gateway


def fetch(connection: RawConnection, session_id: int, epoch: int,
          topics: list[str]) -> dict[str, Any]:
    return connection.request(ApiKey.FETCH, FETCH_VERSION, {
        "ReplicaId": -1, "MaxWaitMs": 100, "MinBytes": 1, "MaxBytes": 1 << 20,
        "IsolationLevel": 0, "SessionId": session_id, "SessionEpoch": epoch,
        "Topics": [{"Topic": topic, "Partitions": [
            {"Partition": 0, "CurrentLeaderEpoch": -1, "FetchOffset": 0, "LastFetchedEpoch": -1,
             "LogStartOffset": -1, "PartitionMaxBytes": 1 << 20}]} for topic in topics],
        "ForgottenTopicsData": [], "RackId": ""})


def partition_errors(answer: dict[str, Any]) -> dict[str, int]:
    return {t["Topic"]: p["ErrorCode"] for t in answer["Responses"] for p in t["Partitions"]}


def test_an_incremental_fetch_adding_only_a_denied_topic_keeps_the_session_going(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """An incremental fetch that only added a denied topic's partition was answered by
    the gateway, so its epoch never reached the broker: the session's next fetch was
    refused (INVALID_FETCH_SESSION_EPOCH) and the consumer had to start a new session.
    It goes on now, its answer refuses the denied partition, and the session keeps its
    epochs."""
    public = create_topic(kafka.bootstrap, name=f"public.{uuid.uuid4().hex[:6]}")
    secret = create_topic(kafka.bootstrap, name=f"secret.{uuid.uuid4().hex[:6]}")
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for topic in (public, secret):
        producer.produce(topic, b"a record")
    assert producer.flush(30) == 0
    connection = RawConnection(gateway.bootstrap)
    try:
        opened = fetch(connection, 0, 0, [public])
        assert opened["ErrorCode"] == ErrorCode.NONE and opened["SessionId"] != 0, opened
        assert partition_errors(opened) == {public: ErrorCode.NONE}, opened
        session = opened["SessionId"]
        added = fetch(connection, session, 1, [secret])
        assert added["ErrorCode"] == ErrorCode.NONE, added
        assert partition_errors(added)[secret] == ErrorCode.TOPIC_AUTHORIZATION_FAILED, added
        assert not any(p.get("Records") for t in added["Responses"] for p in t["Partitions"]
                       if t["Topic"] == secret), added
        following = fetch(connection, session, 2, [])
        assert following["ErrorCode"] == ErrorCode.NONE, following
        assert following["SessionId"] == session, following
    finally:
        connection.close()

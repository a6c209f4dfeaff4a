"""Audit events are complete: topic, partition, bytes, records, latency, error code, rule
id and version, principal and client, for Produce, Fetch and the other APIs, on both
data paths (the network ext_proc session and the native module's frames hand-off).

Each event waits for its request's answer: it is written when the answer leaves the
gateway (the broker's, or the gateway's own), never before, with that latency.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

import kafka_wire
from ext_proc import audit as audit_module
from ext_proc.audit import MemoryAuditLog
from ext_proc.connection import ConnectionInfo
from ext_proc.server import DataPath, ProcessorSettings
from ext_proc.session import KafkaSession
from filter_rules import CompiledRuleSet, load_rule_text
from kafka_wire import ApiKey
from kafka_wire.records import BatchHeader, Record, encode_batch
from tests.unit.clock import ManualClock

CONN = ConnectionInfo(client_host="10.0.0.5", client_port=5000, gateway_address="gw:19092",
                      connection_id="c-7", broker_id=1)
RULES = """
rules:
  - id: watch-produce
    match: {apis: [Produce]}
    action: {observe: {}}
  - id: secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: no-deletes
    match: {apis: [DeleteTopics]}
    action: {deny: {}}
  - id: tag-orders
    match: {topics: {exact: [orders]}}
    action: {headers: {set: {x-seen: "1"}}}
  - id: mask-pii
    match: {direction: response, topics: {prefix: [pii.]}}
    action: {mask: {fields: [$.email]}}
"""
# Every field an event must carry (partition: where the decision is about one).
ALWAYS = ("event_id", "ts", "principal", "client_id", "client_host", "api_name", "rule_id",
          "rule_version", "action", "mode", "outcome", "error_code", "bytes", "records",
          "latency_ms")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    """perf_counter for ext_proc.audit, moved by hand: latencies are exact."""
    clock = ManualClock(1000.0)

    class FakeTime:
        perf_counter = staticmethod(clock)
        time = staticmethod(time.time)

    monkeypatch.setattr(audit_module, "time", FakeTime)
    return clock


@pytest.fixture
def data_path() -> Iterator[DataPath]:
    path = DataPath(ProcessorSettings())
    path.audit = MemoryAuditLog()
    path._auditing = True
    path.engine.install(CompiledRuleSet(load_rule_text(RULES, "r.yaml")))
    yield path
    path.close()


def events(data_path: DataPath) -> list[dict[str, Any]]:
    assert isinstance(data_path.audit, MemoryAuditLog)
    return data_path.audit.records


def complete(event: dict[str, Any]) -> None:
    missing = [name for name in ALWAYS if event.get(name) is None]
    assert not missing, f"{event['rule_id']}: {missing} not set in {event}"


def batch(*docs: dict[str, Any], headers: int = 0) -> bytes:
    records = [Record(i, 0, b"k%d" % i, orjson.dumps(d), [("h", b"v")] * headers)
               for i, d in enumerate(docs)]
    return encode_batch(BatchHeader(base_timestamp=1_700_000_000_000), records)


def produce(cid: int, topics: dict[str, bytes], acks: int = -1) -> bytes:
    body = {"TransactionalId": None, "Acks": acks, "TimeoutMs": 1000, "TopicData": [
        {"Name": name, "PartitionData": [{"Index": 2, "Records": records}]}
        for name, records in topics.items()]}
    return kafka_wire.encode_request(
        kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, cid, "billing-app", {}), body)


def produce_answer(cid: int, topics: list[str]) -> bytes:
    body = {"Responses": [{"Name": name, "PartitionResponses": [
        {"Index": 2, "ErrorCode": 0, "BaseOffset": 0, "LogAppendTimeMs": -1,
         "LogStartOffset": 0, "RecordErrors": [], "ErrorMessage": None}]}
        for name in topics], "ThrottleTimeMs": 0}
    return kafka_wire.encode_response(cid, ApiKey.PRODUCE, 9, body)


def session(data_path: DataPath) -> KafkaSession:
    return data_path.session(CONN, 1 << 20)


def test_a_produce_event_waits_for_the_brokers_answer_and_carries_its_latency(
        data_path: DataPath, clock: ManualClock) -> None:
    orders = batch({"n": 1}, {"n": 2}, {"n": 3})
    logs = batch({"n": 4})
    s = session(data_path)
    forwarded = s.from_client(produce(1, {"orders": orders, "logs": logs}))
    assert forwarded  # re-encoded with the header the record rule set
    assert events(data_path) == [], "written only once the answer leaves"
    clock.now += 0.0125
    s.from_broker(produce_answer(1, ["orders", "logs"]))
    got = events(data_path)
    # The observe rule matches the request as a whole: one event per topic, each with
    # that topic's batches; the record rule one event for the partition's records.
    observed = {e["topic"]: e for e in got if e["rule_id"] == "watch-produce"}
    assert set(observed) == {"orders", "logs"}
    assert (observed["orders"]["bytes"], observed["orders"]["records"]) == (len(orders), 3)
    assert (observed["logs"]["bytes"], observed["logs"]["records"]) == (len(logs), 1)
    assert observed["orders"]["partition"] is None  # the decision is about the topic
    (tagged,) = [e for e in got if e["rule_id"] == "tag-orders"]
    assert (tagged["topic"], tagged["partition"], tagged["outcome"], tagged["records"]) == (
        "orders", 2, "modified", 3)
    assert tagged["bytes"] == 3 * (2 + len(b'{"n":1}'))  # key + value, no headers yet
    for event in got:
        complete(event)
        assert event["latency_ms"] == 12.5
        assert (event["client_id"], event["principal"], event["error_code"]) == (
            "billing-app", "User:ANONYMOUS", 0)
        assert event["rule_version"] == data_path.engine.compiled.version
        assert (event["api_name"], event["api_version"], event["correlation_id"]) == (
            "Produce", 9, 1)
    assert len({e["event_id"] for e in got}) == len(got) == 3


def test_a_request_the_gateway_answers_has_its_own_latency(
        data_path: DataPath, clock: ManualClock) -> None:
    s = session(data_path)
    # A forwarded request is in flight first: the gateway's answer waits behind it.
    s.from_client(produce(1, {"logs": batch({"n": 1})}))
    assert s.from_client(produce(2, {"secret.keys": batch({"n": 2})})) == b""
    clock.now += 0.002
    assert s.take_client_bytes() == b"", "the answer to request 1 comes first"
    assert [e["correlation_id"] for e in events(data_path)] == []
    clock.now += 0.003
    out = s.from_broker(produce_answer(1, ["logs"]))
    assert len(out) > len(produce_answer(1, ["logs"]))  # the broker's answer, then ours
    by_request = {(e["correlation_id"], e["rule_id"]): e for e in events(data_path)}
    denied = by_request[(2, "secrets")]
    assert (denied["outcome"], denied["topic"], denied["error_code"]) == (
        "denied", "secret.keys", 29)
    assert denied["latency_ms"] == 5.0  # until its answer went out, after request 1's
    assert by_request[(1, "watch-produce")]["latency_ms"] == 5.0
    complete(denied)


def test_an_acks_zero_produce_is_written_once_judged(data_path: DataPath,
                                                     clock: ManualClock) -> None:
    s = session(data_path)
    clock.now += 0.001
    s.from_client(produce(5, {"secret.x": batch({"n": 1})}, acks=0))
    (denied,) = [e for e in events(data_path) if e["rule_id"] == "secrets"]
    assert denied["answered"] is False and denied["latency_ms"] == 0.0
    complete(denied)


def test_other_apis_carry_the_requests_size_and_no_records(data_path: DataPath,
                                                           clock: ManualClock) -> None:
    request = kafka_wire.encode_request(
        kafka_wire.RequestHeader(ApiKey.DELETE_TOPICS, 6, 9, "admin", {}),
        {"Topics": [{"Name": "orders", "TopicId": uuid.UUID(int=0)}], "TimeoutMs": 1000})
    s = session(data_path)
    s.from_client(request)
    clock.now += 0.004
    s.take_client_bytes()
    (event,) = events(data_path)
    assert (event["api_name"], event["topic"], event["outcome"], event["error_code"]) == (
        "DeleteTopics", "orders", "denied", 29)
    assert (event["bytes"], event["records"], event["latency_ms"]) == (len(request), 0, 4.0)
    complete(event)


def fetch(cid: int, topic_id: uuid.UUID) -> bytes:
    body = {"ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 1 << 20,
            "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1, "Topics": [
                {"TopicId": topic_id, "Partitions": [{"Partition": 0, "FetchOffset": 0}]}],
            "ForgottenTopicsData": [], "RackId": ""}
    return kafka_wire.encode_request(kafka_wire.RequestHeader(ApiKey.FETCH, 16, cid, "reader", {}),
                                     body)


def fetch_answer(cid: int, topic_id: uuid.UUID, records: bytes) -> bytes:
    body = {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 0, "Responses": [
        {"TopicId": topic_id, "Partitions": [
            {"PartitionIndex": 0, "ErrorCode": 0, "HighWatermark": 1, "LastStableOffset": 1,
             "LogStartOffset": 0, "AbortedTransactions": [], "PreferredReadReplica": -1,
             "Records": records}]}]}
    return kafka_wire.encode_response(cid, ApiKey.FETCH, 16, body)


def test_a_fetch_is_audited_after_its_records_were_filtered(data_path: DataPath,
                                                            clock: ManualClock) -> None:
    pii = uuid.uuid4()
    data_path.engine.topic_ids.add(pii, "pii.users")
    s = session(data_path)
    s.from_client(fetch(3, pii))
    clock.now += 0.020
    records = batch({"email": "a@x"}, {"email": "b@x"}, {"n": 1})
    s.from_broker(fetch_answer(3, pii, records))
    (masked,) = events(data_path)
    assert (masked["rule_id"], masked["topic"], masked["partition"], masked["outcome"]) == (
        "mask-pii", "pii.users", 0, "modified")
    assert masked["records"] == 2  # the third record has no email: unchanged
    assert masked["latency_ms"] == 20.0 and masked["client_id"] == "reader"
    complete(masked)


def test_a_connection_closed_before_the_answer_still_writes_its_events(
        data_path: DataPath, clock: ManualClock) -> None:
    s = session(data_path)
    s.from_client(produce(1, {"logs": batch({"n": 1})}))
    clock.now += 0.5
    s.close()
    (event,) = events(data_path)
    assert event["rule_id"] == "watch-produce" and event["latency_ms"] == 500.0


def test_the_frames_hand_off_writes_the_same_events(data_path: DataPath,
                                                    clock: ManualClock) -> None:
    frames = data_path.frames_session(CONN)
    reply = frames.request(produce(1, {"orders": batch({"n": 1})}), principal="User:alice",
                           security_protocol="SASL_PLAINTEXT")
    assert reply.to_broker and not reply.want_response
    denied = frames.request(produce(2, {"secret.x": batch({"n": 1})}),
                            principal="User:alice", security_protocol="SASL_PLAINTEXT")
    assert denied.answer is not None
    got = events(data_path)
    assert {(e["correlation_id"], e["rule_id"]) for e in got} == {
        (1, "watch-produce"), (1, "tag-orders"), (2, "watch-produce"), (2, "secrets")}
    for event in got:
        complete(event)
        assert event["principal"] == "User:alice"
        assert event["security_protocol"] == "SASL_PLAINTEXT"


def test_metadata_for_all_topics_is_one_event_without_a_topic(data_path: DataPath) -> None:
    data_path.engine.install(CompiledRuleSet(load_rule_text(
        "rules:\n  - id: watch-metadata\n    match: {apis: [Metadata]}\n"
        "    action: {observe: {}}\n", "m.yaml")))
    s = session(data_path)
    request = kafka_wire.encode_request(kafka_wire.RequestHeader(ApiKey.METADATA, 12, 4, "app", {}),
                                        {"Topics": None, "AllowAutoTopicCreation": True,
                                         "IncludeTopicAuthorizedOperations": False})
    s.from_client(request)
    s.close()
    (event,) = events(data_path)
    assert event["topic"] is None and event["bytes"] == len(request) and event["records"] == 0

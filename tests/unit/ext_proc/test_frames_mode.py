"""Frames mode: whole frames handed over by keg's native filter, judged by the same chain.

The sans-IO `FramesSession`, then the real gRPC service with a real gRPC client speaking
the hand-off protocol (docs/native.md) as the Rust module does.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2 as pb
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2_grpc as pb_grpc
from google.protobuf.json_format import MessageToDict

import kafka_wire
from ext_proc import ExtProcServer, ProcessorSettings
from ext_proc import server as server_module
from ext_proc.connection import ConnectionInfo
from ext_proc.filters.rules import RuleEngine
from ext_proc.frames import (
    FRAMES_MODE,
    MODE_HEADER,
    FramesSession,
    fail_open_ranges,
    interest_table,
)
from filter_rules import CompiledRuleSet, RuleSet, load_rule_text
from kafka_wire import ApiKey
from kafka_wire.errors import FrameError
from kafka_wire.records import BatchHeader, Record, encode_batch
from tests.unit.ext_proc.conftest import json_batch, json_values
from tests.unit.registry_stub import Registry

ORDER_JSON = {"type": "object", "properties": {"email": {"type": "string"}}}

CONN = ConnectionInfo(client_host="10.0.0.5", client_port=5000, gateway_address="gw:19092",
                      broker_id=1)
RULES = """
rules:
  - id: secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: only-alice-reads-pii
    match: {apis: [Fetch], topics: {prefix: [pii.]}, not: {principals: {exact: [alice]}}}
    action: {deny: {}}
  - id: mask-emails
    match: {direction: response, topics: {prefix: [pii.]}}
    action: {mask: {fields: [$.email]}}
"""


def engine(rules: str = RULES) -> RuleEngine:
    return RuleEngine(CompiledRuleSet(load_rule_text(rules, "r.yaml")))


def produce(cid: int, topic: str) -> bytes:
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": 0, "Records": json_batch([{"a": 1}])}]}]}
    return kafka_wire.encode_request(
        kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, cid, "app", {}), body
    )


def fetch(cid: int, topic_id: uuid.UUID, version: int = 16) -> bytes:
    body = {"ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 1 << 20,
            "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1, "Topics": [
                {"TopicId": topic_id, "Partitions": [{"Partition": 0, "FetchOffset": 0}]}],
            "ForgottenTopicsData": [], "RackId": ""}
    header = kafka_wire.RequestHeader(ApiKey.FETCH, version, cid, "app", {})
    return kafka_wire.encode_request(header, body)


def fetch_answer(cid: int, topic_id: uuid.UUID, records: bytes, version: int = 16) -> bytes:
    body = {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 0, "Responses": [
        {"TopicId": topic_id, "Partitions": [
            {"PartitionIndex": 0, "ErrorCode": 0, "HighWatermark": 1, "LastStableOffset": 1,
             "LogStartOffset": 0, "AbortedTransactions": [], "PreferredReadReplica": -1,
             "Records": records}]}]}
    return kafka_wire.encode_response(cid, ApiKey.FETCH, version, body)


def fetched_values(fetch_body: dict[str, Any]) -> list[Any]:
    return json_values(fetch_body["Responses"][0]["Partitions"][0]["Records"])


def metadata(cid: int, version: int = 12) -> bytes:
    header = kafka_wire.RequestHeader(ApiKey.METADATA, version, cid, "app", {})
    return kafka_wire.encode_request(header, {"Topics": None})


def metadata_answer(cid: int, topics: dict[str, uuid.UUID], version: int = 12) -> bytes:
    body = {"Brokers": [{"NodeId": 1, "Host": "gw", "Port": 19092, "Rack": None}],
            "ClusterId": "c", "ControllerId": 1, "Topics": [
                {"ErrorCode": 0, "Name": name, "TopicId": tid, "IsInternal": False,
                 "Partitions": []} for name, tid in topics.items()]}
    return kafka_wire.encode_response(cid, ApiKey.METADATA, version, body)


def test_a_denied_produce_is_answered_in_its_slot_and_never_forwarded() -> None:
    session = FramesSession(CONN, engine())
    reply = session.request(produce(1, "secret.x"))
    assert reply.to_broker == b"" and reply.answer is not None and not reply.want_response
    _, answer = kafka_wire.decode_response(reply.answer[4:], ApiKey.PRODUCE, 9)
    assert answer["Responses"][0]["PartitionResponses"][0]["ErrorCode"] == 29
    allowed = produce(2, "orders")
    assert session.request(allowed).to_broker == allowed  # the same bytes, untouched


def test_fetch_by_topic_id_is_judged_with_the_given_principal_and_masked() -> None:
    session = FramesSession(CONN, engine())
    pii = uuid.uuid4()
    learn = session.request(metadata(1))
    assert learn.want_response  # topic ids are learned from the answer
    session.response(metadata_answer(1, {"pii.users": pii}), ApiKey.METADATA, 12)

    refused = session.request(fetch(2, pii), principal="User:bob",
                              security_protocol="SASL_PLAINTEXT")
    assert refused.answer is not None and refused.to_broker == b""
    allowed = session.request(fetch(3, pii), principal="User:alice",
                              security_protocol="SASL_PLAINTEXT")
    assert allowed.to_broker and allowed.want_response
    stored = json_batch([{"email": "a@x", "n": 1}])
    out = session.response(fetch_answer(3, pii, stored), ApiKey.FETCH, 16)
    _, body = kafka_wire.decode_response(out[4:], ApiKey.FETCH, 16)
    assert fetched_values(body) == [{"email": "****", "n": 1}]


def test_requests_over_a_rate_ask_the_module_to_pause_only_for_what_each_adds() -> None:
    """Requests the module sent before its first pause are judged back to back, each
    owing what the ones before it left: their pauses add up to the last one's throttle
    (regression: the sum of all throttles held a producer past its delivery timeout)."""
    session = FramesSession(CONN, engine("""
rules:
  - id: slow
    match: {apis: [Produce]}
    action: {rate: {per: client_id, requests_per_second: 10, burst_seconds: 1}}
"""))
    replies = [session.request(produce(cid, "orders")) for cid in range(1, 31)]
    assert [r.throttle_ms for r in replies[:10]] == [0] * 10  # the burst
    paused = [r.throttle_ms for r in replies[10:]]
    assert all(0 < ms <= 150 for ms in paused), paused  # a tenth of a second each
    assert 1_900 <= sum(paused) <= 2_200  # 20 requests over at 10/s: 2 s in all
    assert all(r.to_broker for r in replies)  # a throttle delays, it never refuses


def test_requests_that_come_while_muted_are_sent_back_unjudged_to_a_module_that_defers(
        ) -> None:
    """A module that sends deferred requests again (it says so) gets the requests it
    sent before a throttle reached it back unjudged, to be judged when the mute is over:
    judged at once, a pipelining client's queue ran its bucket into the deepest debt it
    may owe, then all went at the mute's end (4 MB in 12 s through 100 KB/s)."""
    rules = """
rules:
  - id: slow
    match: {apis: [Produce]}
    action: {rate: {per: client_id, requests_per_second: 10, burst_seconds: 1}}
"""
    session = FramesSession(CONN, engine(rules))
    session.module_defers = True
    replies = [session.request(produce(cid, "orders")) for cid in range(1, 14)]
    assert [r.throttle_ms for r in replies[:10]] == [0] * 10  # the burst
    assert 0 < replies[10].throttle_ms <= 150 and replies[10].to_broker
    deferred = replies[11:]
    assert all(r.defer_ms > 0 and r.to_broker == b"" and r.answer is None
               and not r.want_response and r.throttle_ms == 0 for r in deferred)
    # A module before defer_ms would drop such a request: it gets them judged.
    older = FramesSession(CONN, engine(rules))
    judged = [older.request(produce(cid, "orders")) for cid in range(1, 14)]
    assert all(r.to_broker and r.defer_ms == 0 for r in judged)


def test_answers_are_matched_in_order_even_to_requests_that_share_an_id() -> None:
    """Kafka answers a connection's requests in order; a client may reuse a correlation
    id while it is in flight (kept per id, the second answer closed the connection). An
    answer that never came (its hand-off failed, the module answered the client) is
    passed over for the next one."""
    session = FramesSession(CONN, engine())
    for cid in (7, 7, 8, 9):
        assert session.request(metadata(cid)).want_response
    for cid in (7, 7, 9):  # 8's answer never comes here
        session.response(metadata_answer(cid, {"orders": uuid.uuid4()}), ApiKey.METADATA, 12)
    with pytest.raises(FrameError):
        session.response(metadata_answer(7, {}), ApiKey.METADATA, 12)


def test_a_response_not_asked_for_or_a_cut_frame_is_refused() -> None:
    session = FramesSession(CONN, engine())
    with pytest.raises(FrameError):
        session.response(fetch_answer(9, uuid.uuid4(), b""), ApiKey.FETCH, 16)
    with pytest.raises(FrameError):
        session.request(produce(1, "orders")[:-3])


def test_the_interest_table_names_only_what_the_rules_need() -> None:
    quiet = {k for k, _, _ in interest_table(RuleEngine(CompiledRuleSet(RuleSet())))}
    # Without rules only what teaches topic ids (Metadata, CreateTopics, DeleteTopics,
    # DescribeTopicPartitions answers) and group protocols (JoinGroup, SyncGroup) goes.
    assert quiet == {ApiKey.METADATA, 11, 14, 19, 20, 75}
    ruled = {k: (lo, hi) for k, lo, hi in interest_table(engine())}
    assert ruled[ApiKey.PRODUCE] == (0, 0x7FFF) and ruled[ApiKey.FETCH] == (0, 0x7FFF)


def test_only_what_learners_alone_want_fails_open() -> None:
    """With the service down, a frame only its learners want (topic ids, group
    protocols) is forwarded; one a rule judges fails closed, as do versions keg cannot
    read (the chain must refuse those)."""
    quiet = RuleEngine(CompiledRuleSet(RuleSet()))
    table, fail_open = interest_table(quiet), fail_open_ranges(quiet)
    assert {r.api_key for r in fail_open} == {k for k, _, _ in table}
    for r in fail_open:
        assert r.high == kafka_wire.supported_versions(r.api_key)[1]  # type: ignore[index]
        assert r.unless is None
    judged = RuleEngine(CompiledRuleSet(load_rule_text("""
rules:
  - id: hide-secrets
    match: {apis: [Metadata], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: no-group-x
    match: {apis: [JoinGroup], groups: {exact: [x]}}
    action: {deny: {}}
""", "rules.yaml")))
    keys = {r.api_key for r in fail_open_ranges(judged)}
    assert ApiKey.METADATA not in keys and ApiKey.JOIN_GROUP not in keys
    assert ApiKey.SYNC_GROUP in keys and ApiKey.CREATE_TOPICS in keys


def test_what_only_dry_run_rules_judge_fails_open() -> None:
    """A dry-run rule never changes or answers a request: with the service down its
    requests pass (keg up's default rules are dry runs and observers; before, they
    refused Produce to payments.* and every admin request while it was down)."""
    rules = engine("""
rules:
  - id: would-freeze-drafts
    mode: dry-run
    match: {apis: [Produce], topics: {prefix: [draft.]}}
    action: {deny: {}}
  - id: would-mask-drafts
    mode: dry-run
    match: {topics: {prefix: [draft.]}}
    action: {mask: {fields: [$.card]}}
  - id: report-topic-creation
    mode: dry-run
    match: {apis: [CreateTopics]}
    action: {observe: {}}
  - id: audit-deletes
    match: {apis: [DeleteTopics]}
    action: {observe: {}}
  - id: no-secret-groups
    match: {apis: [JoinGroup], groups: {prefix: [secret.]}}
    action: {deny: {}}
  - id: would-limit-groups
    mode: dry-run
    match: {apis: [JoinGroup]}
    action: {rate: {requests_per_second: 1}}
""")
    table = {k for k, _, _ in interest_table(rules)}
    assert {ApiKey.PRODUCE, ApiKey.CREATE_TOPICS} <= table
    ranges = fail_open_ranges(rules)
    assert all(r.unless is None for r in ranges)
    fails_open = {r.api_key for r in ranges}
    assert {ApiKey.PRODUCE, ApiKey.CREATE_TOPICS} <= fails_open
    # An enforced rule, an observer included (its audit is what it is for), fails closed,
    # even beside a dry run.
    assert ApiKey.DELETE_TOPICS not in fails_open and ApiKey.JOIN_GROUP not in fails_open


def test_a_produce_fails_open_unless_it_names_a_topic_an_enforced_rule_acts_on() -> None:
    """Beside a dry run on drafts, an enforced rule on secrets (and a record rule on
    payments): a Produce of drafts fails open, one naming a secret or a payment closed
    (the module reads its topics). Fetch stays whole: its answer may name others."""
    rules = engine("""
rules:
  - id: would-freeze-drafts
    mode: dry-run
    match: {apis: [Produce, Fetch], topics: {prefix: [draft.]}}
    action: {deny: {}}
  - id: no-secrets
    match: {apis: [Produce, Fetch], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: mask-payments
    match: {topics: {exact: [payments]}}
    action: {mask: {fields: [$.card]}}
""")
    produce = [r for r in fail_open_ranges(rules) if r.api_key == ApiKey.PRODUCE]
    assert len(produce) == 1 and produce[0].unless is not None
    assert produce[0].unless.to_json() == {"exact": ["payments"], "prefix": ["secret."],
                                           "regex": []}
    assert ApiKey.FETCH not in {r.api_key for r in fail_open_ranges(rules)}
    # A rule without topics on Produce: every Produce it may judge fails closed.
    anyone = engine("""
rules:
  - id: would-freeze-drafts
    mode: dry-run
    match: {apis: [Produce], topics: {prefix: [draft.]}}
    action: {deny: {}}
  - id: no-bob
    match: {apis: [Produce], principals: {exact: [bob]}}
    action: {deny: {}}
""")
    assert ApiKey.PRODUCE not in {r.api_key for r in fail_open_ranges(anyone)}


# -- over a real gRPC stream, as the native module speaks it ----------------------------


def message(data: bytes, *, response: bool = False, **keg: Any) -> pb.ProcessingRequest:
    request = pb.ProcessingRequest()
    (request.write_data if response else request.read_data).data = data
    if keg:
        request.metadata.filter_metadata["keg"].update(keg)
    return request


def test_the_service_speaks_frames_mode_over_grpc(tmp_path: Any) -> None:
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "r.yaml").write_text(RULES)
    pii = uuid.uuid4()

    async def run() -> list[pb.ProcessingResponse]:
        server = ExtProcServer(ProcessorSettings(port=0, rules_dir=rules_dir))
        port = await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.NetworkExternalProcessorStub(channel)

                async def messages() -> AsyncIterator[pb.ProcessingRequest]:
                    yield message(metadata(1))
                    yield message(metadata_answer(1, {"pii.users": pii}), response=True,
                                  api_key=ApiKey.METADATA, api_version=12)
                    yield message(produce(2, "secret.x"))
                    yield message(fetch(3, pii), principal="User:alice",
                                  security_protocol="SASL_PLAINTEXT")
                    yield message(fetch_answer(3, pii, json_batch([{"email": "a@x"}])),
                                  response=True, api_key=ApiKey.FETCH, api_version=16)

                call = stub.Process(messages(), metadata=(
                    (MODE_HEADER, FRAMES_MODE), ("x-keg-client-address", "10.0.0.5:5000"),
                    ("x-keg-gateway-address", "gw:19092"), ("x-keg-broker-id", "1")))
                return [reply async for reply in call]
        finally:
            await server.stop()

    meta, meta_answer, denied, allowed, masked = asyncio.run(run())
    assert MessageToDict(meta.dynamic_metadata) == {"keg": {"want_response": True}}
    assert meta.read_data.data == metadata(1)
    assert meta_answer.write_data.data == metadata_answer(1, {"pii.users": pii})
    assert denied.read_data.data == b"" and denied.write_data.data
    assert MessageToDict(denied.dynamic_metadata) == {"keg": {"want_response": False}}
    assert allowed.read_data.data == fetch(3, pii)
    _, body = kafka_wire.decode_response(masked.write_data.data[4:], ApiKey.FETCH, 16)
    assert fetched_values(body) == [{"email": "****"}]


# --- vouched schema ids ------------------------------------------------------------------


def schema_rules(url: str, extra: str = "") -> RuleEngine:
    return engine(f"""
rules:
  - id: ids
    match: {{topics: {{exact: [orders, masked]}}}}
    action: {{schema: {{registry: {{url: "{url}"}}}}}}
  - id: ids-fetched
    match: {{direction: response, topics: {{exact: [orders, masked]}}}}
    action: {{schema: {{registry: {{url: "{url}"}}}}}}
  - id: mask
    match: {{topics: {{exact: [masked]}}}}
    action: {{mask: {{fields: [$.email]}}}}
""")


def framed_batch(*schema_ids: int) -> bytes:
    records = [Record(i, 0, None, b"\x00" + sid.to_bytes(4, "big") + b'{"email": "a@x"}', [])
               for i, sid in enumerate(schema_ids)]
    return encode_batch(BatchHeader(base_timestamp=1_700_000_000_000), records)


def produce_records(cid: int, topic: str, records: bytes) -> bytes:
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": 0, "Records": records}]}]}
    return kafka_wire.encode_request(
        kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, cid, "app", {}), body)


def test_validating_schema_rules_vouch_with_the_json_schemas_the_filter_checks() -> None:
    registry = Registry()
    email = {"type": "object", "required": ["email"],
             "properties": {"email": {"type": "string"}}}
    registry.add(1, email, "JSON", ["orders-value"])
    registry.add(2, {"type": "object", "properties": {"email": {"pattern": "@"}}}, "JSON",
                 ["orders-value"])
    registry.add(3, {"type": "record", "name": "R", "fields": []}, None, ["orders-value"])
    rules = f"""
rules:
  - id: ids
    match: {{topics: {{exact: [orders]}}}}
    action: {{schema: {{registry: {{url: "{registry.url}"}}, validate_payload: true}}}}
"""
    session = FramesSession(CONN, engine(rules))
    try:
        reply = session.request(produce_records(1, "orders", framed_batch(1, 2)))
        assert reply.to_broker and reply.answer is None
        # Id 2's schema has a pattern (two regex dialects): checked here, never vouched.
        (vouch,) = reply.vouched
        assert vouch.ids == (1,)
        assert vouch.to_json()["json_schemas"] == {"1": orjson.dumps(email).decode()}
        avro = session.request(produce_records(2, "orders", framed_batch(3)))
        assert avro.answer is not None  # its payload is not Avro: refused, and not vouched
        assert [v.ids for v in avro.vouched] == [(1,)]
    finally:
        session.close()
        registry.close()


def test_ids_only_schema_rules_vouch_for_the_ids_they_passed() -> None:
    registry = Registry()
    registry.add(1, ORDER_JSON, "JSON", ["orders-value", "masked-value"])
    session = FramesSession(CONN, schema_rules(registry.url))
    try:
        first = session.request(produce_records(1, "orders", framed_batch(1, 1)))
        assert first.to_broker and first.answer is None
        (vouch,) = first.vouched
        assert (vouch.topic, vouch.ids) == ("orders", (1,))
        assert 0 < vouch.ttl_ms <= 1000
        assert vouch.to_json() == {"topic": "orders", "ids": [1], "ttl_ms": vouch.ttl_ms}
        # A refused id is never vouched for; the passing one still is.
        refused = session.request(produce_records(2, "orders", framed_batch(1, 99)))
        assert refused.answer is not None
        assert [v.ids for v in refused.vouched] == [(1,)]
        # Another rule on the topic (a mask): nothing the module could repeat alone.
        assert session.request(produce_records(3, "masked", framed_batch(1))).vouched == ()
        # Fetch answers: vouched in the reply to the answer (take_vouched).
        orders = uuid.uuid4()
        session.request(metadata(4))
        session.response(metadata_answer(4, {"orders": orders}), ApiKey.METADATA, 12)
        assert session.request(fetch(5, orders)).want_response
        session.response(fetch_answer(5, orders, framed_batch(1)), ApiKey.FETCH, 16)
        assert [(v.topic, v.ids) for v in session.take_vouched()] == [("orders", (1,))]
        assert session.take_vouched() == ()
    finally:
        session.close()
        registry.close()


def fetch_named(cid: int, topic: str, epoch: int = -1, version: int = 12) -> bytes:
    body = {"ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 1 << 20,
            "IsolationLevel": 0, "SessionId": 0 if epoch <= 0 else 5, "SessionEpoch": epoch,
            "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": 0}]}],
            "ForgottenTopicsData": [], "RackId": ""}
    header = kafka_wire.RequestHeader(ApiKey.FETCH, version, cid, "app", {})
    return kafka_wire.encode_request(header, body)


def test_only_fetches_that_may_get_records_a_rule_reads_bring_their_answer_back() -> None:
    """Regression: with any consume-time record rule, every Fetch the chain judged asked for
    its answer, so a deny rule on Fetch brought each answer of its topics (up to 1 MiB a
    partition) through Python and back, though no rule reads them."""
    session = FramesSession(CONN, engine(RULES + """
  - id: deny-nobody
    match: {apis: [Fetch], topics: {prefix: [audit.]}, principals: {exact: [nobody]}}
    action: {deny: {}}
"""))
    assert not session.request(fetch_named(1, "audit.log")).want_response
    assert session.request(fetch_named(2, "pii.users"), principal="User:alice",
                            security_protocol="SASL_PLAINTEXT").want_response
    # An incremental fetch is answered for its whole session: it comes back.
    assert session.request(fetch_named(3, "audit.log", epoch=4), principal="User:alice",
                            security_protocol="SASL_PLAINTEXT").want_response


def test_topic_ids_the_module_names_are_known_without_a_metadata_answer() -> None:
    """Regression: each worker of the pool learned topic ids only from the Metadata answers
    it saw; a consumer whose Metadata went to another worker got UNKNOWN_TOPIC_ID for its
    first Fetch (v13+) and backed off 500 ms. The module now names the ids it hands over."""
    pii = uuid.uuid4()
    unknown = FramesSession(CONN, engine()).request(fetch(1, pii), principal="User:alice",
                            security_protocol="SASL_PLAINTEXT")
    assert unknown.to_broker == b"" and unknown.answer is not None  # UNKNOWN_TOPIC_ID
    session = FramesSession(CONN, engine())
    named = session.request(fetch(2, pii), topic_ids={pii.hex: "pii.users", "zz": "bad"},
                            principal="User:alice", security_protocol="SASL_PLAINTEXT")
    assert named.want_response
    out = session.response(fetch_answer(2, pii, json_batch([{"email": "a@x"}])), ApiKey.FETCH, 16)
    _, body = kafka_wire.decode_response(out[4:], ApiKey.FETCH, 16)
    assert fetched_values(body) == [{"email": "****"}]
    assert body["Responses"][0]["Partitions"][0]["ErrorCode"] == 0


def test_an_incremental_fetchs_answer_is_read_with_the_topic_ids_the_module_names() -> None:
    """An incremental Fetch (KIP-227) that names nothing is answered with records of its
    session's partitions: the worker reading the answer may never have seen their ids
    named (the full Fetch that named them passed natively). The module names the ids the
    answer carries with the answer, as it does with requests."""
    pii = uuid.uuid4()
    records = json_batch([{"email": "a@x"}])

    def answered(topic_ids: dict[str, str] | None) -> dict[str, Any]:
        session = FramesSession(CONN, engine())
        header = kafka_wire.RequestHeader(ApiKey.FETCH, 16, 1, "app", {})
        incremental = kafka_wire.encode_request(header, {
            "ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 1 << 20,
            "IsolationLevel": 0, "SessionId": 5, "SessionEpoch": 3, "Topics": [],
            "ForgottenTopicsData": [], "RackId": ""})
        assert session.request(incremental, principal="User:alice",
                               security_protocol="SASL_PLAINTEXT").want_response
        out = session.response(fetch_answer(1, pii, records), ApiKey.FETCH, 16,
                               topic_ids=topic_ids)
        return kafka_wire.decode_response(out[4:], ApiKey.FETCH, 16)[1]

    named = answered({pii.hex: "pii.users"})
    assert fetched_values(named) == [{"email": "****"}]
    assert named["Responses"][0]["Partitions"][0]["ErrorCode"] == 0
    # Not named: its records are withheld (never unmasked), the consumer is told why.
    unnamed = answered(None)
    assert unnamed["Responses"][0]["Partitions"][0]["ErrorCode"] == 100  # UNKNOWN_TOPIC_ID
    assert not unnamed["Responses"][0]["Partitions"][0]["Records"], "no record goes out"


def test_a_quiet_stream_whose_client_pings_stays_up(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """keg's Kafka filter pings its streams every 30 s while a Kafka connection is
    quiet. The service took pings between no data as abuse (gRPC's default: more often
    than every 5 minutes, two strikes), sent GOAWAY ("too_many_pings"), and the next
    frame of a quiet connection failed: fail-closed, Envoy closed it (regression; seen
    after 150 s of quiet through the real Envoy). Time scaled down 30x: the client pings
    every second, the service accepts pings 1/3 s apart (as it accepts the module's 30 s
    ones, 10 s apart), the stream stays quiet for 8 s, then a frame on it is answered."""
    monkeypatch.setattr(server_module, "KEEPALIVE_ACCEPTED", (
        ("grpc.http2.min_ping_interval_without_data_ms", 333),
        ("grpc.keepalive_permit_without_calls", 1)))
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "r.yaml").write_text(RULES)
    pinging = [("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_permit_without_calls", 1),
               ("grpc.http2.max_pings_without_data", 0),
               ("grpc.http2.min_time_between_pings_ms", 1000)]

    async def run() -> list[pb.ProcessingResponse]:
        server = ExtProcServer(ProcessorSettings(port=0, rules_dir=rules_dir))
        port = await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                                 options=pinging) as channel:
                stub = pb_grpc.NetworkExternalProcessorStub(channel)

                async def messages() -> AsyncIterator[pb.ProcessingRequest]:
                    yield message(produce(1, "secret.x"))
                    await asyncio.sleep(8)  # quiet: pings only (two strikes: GOAWAY)
                    yield message(produce(2, "secret.x"))

                call = stub.Process(messages(), metadata=((MODE_HEADER, FRAMES_MODE),))
                return [reply async for reply in call]
        finally:
            await server.stop()

    first, second = asyncio.run(run())
    assert first.write_data.data and second.write_data.data  # both refused, in their slots


def test_the_service_accepts_the_modules_keepalive_pings() -> None:
    """What the service accepts keeps up with what the module sends (its Rust client)."""
    source = (Path(__file__).parents[3] / "envoy/kafka_filter/src/handoff/grpc.rs").read_text()
    found = re.search(r"http2_keep_alive_interval\(Duration::from_secs\((\d+)\)\)", source)
    assert found is not None, "the module's keepalive interval moved"
    accepted = dict(server_module.KEEPALIVE_ACCEPTED)
    assert accepted["grpc.http2.min_ping_interval_without_data_ms"] * 2 <= \
        int(found.group(1)) * 1000
    assert accepted["grpc.keepalive_permit_without_calls"] == 1

"""RecordsFilter without a network: Produce requests and Fetch responses, decoded."""

from __future__ import annotations

import struct
from typing import Any

import cramjam
import google_crc32c
import pytest

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters.records import RecordsFilter
from ext_proc.filters.rules import RuleDecision, RuleEngine
from ext_proc.identity import IdentityTracker
from filter_rules import CompiledRuleSet, load_rule_text
from interceptors.engine import RecordLimits
from kafka_wire import ApiKey
from kafka_wire.compression import MAX_DECOMPRESSED, Compression
from kafka_wire.records import (
    BatchHeader,
    Record,
    encode_batch,
    verify_crc,
)
from tests.unit.ext_proc.conftest import json_batch, json_values, only_batch

CONN = ConnectionInfo(client_host="10.0.0.5", client_port=5000, gateway_address="gw:19092")
RULES = """
rules:
  - id: drop-heartbeats
    match: {topics: {prefix: [d.]}}
    action: {drop: {when: {fields: {$.kind: {exact: [heartbeat]}}}}}
  - id: amounts
    match: {topics: {prefix: [v.]}}
    action:
      validate: {json_schema: {type: object, properties: {amount: {minimum: 0}}}}
  - id: mask-on-read
    match: {direction: response, topics: {prefix: [d.]}}
    action: {mask: {fields: [$.email]}}
"""


def records_filter() -> tuple[RecordsFilter, list[RuleDecision]]:
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(RULES, "r.yaml")), decisions.append)
    return RecordsFilter(engine, IdentityTracker()), decisions


def produce(topic: str, records: bytes, partition: int = 0) -> dict[str, Any]:
    return {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": partition, "Records": records}]},
        {"Name": "untouched", "PartitionData": [{"Index": 0, "Records": b"raw"}]}]}


HEADER = kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 1, "client", {})


def test_only_produce_and_fetch_with_record_rules_are_asked_for() -> None:
    f, _ = records_filter()
    assert f.wants_request(ApiKey.PRODUCE, 9) and f.wants_request(ApiKey.FETCH, 12)
    assert not f.wants_request(ApiKey.METADATA, 12)
    empty = RecordsFilter(RuleEngine(CompiledRuleSet(load_rule_text("rules: []", "e.yaml"))),
                          IdentityTracker())
    assert not empty.wants_request(ApiKey.PRODUCE, 9) and not empty.wants_request(ApiKey.FETCH, 12)


def test_drops_renumber_and_other_topics_pass_as_bytes() -> None:
    f, decisions = records_filter()
    body = produce("d.x", json_batch([{"kind": "a"}, {"kind": "heartbeat"}, {"kind": "b"}]))
    verdict = f.judge(HEADER, body, CONN)
    assert verdict is not None and verdict.changed and verdict.answer is None
    records = body["TopicData"][0]["PartitionData"][0]["Records"]
    assert json_values(records) == [{"kind": "a"}, {"kind": "b"}]
    view = only_batch(records)
    assert view.last_offset_delta == 1  # renumbered: the broker refuses gaps on produce
    assert body["TopicData"][1]["PartitionData"][0]["Records"] == b"raw"
    assert [(d.rule.id, d.outcome, d.records) for d in decisions] == [
        ("drop-heartbeats", "dropped", 1)]


def test_an_idempotent_producers_later_batches_are_shifted() -> None:
    f, _ = records_filter()
    first = produce("d.x", json_batch([{"kind": "heartbeat"}, {"kind": "a"}], producer_id=7,
                                 producer_epoch=0, base_sequence=0))
    f.judge(HEADER, first, CONN)
    view = only_batch(first["TopicData"][0]["PartitionData"][0]["Records"])
    assert (view.base_sequence, view.records_count) == (0, 1)
    second = produce("d.x", json_batch([{"kind": "b"}, {"kind": "c"}], producer_id=7,
                                  producer_epoch=0, base_sequence=2))
    verdict = f.judge(HEADER, second, CONN)
    assert verdict is not None and verdict.changed
    view = only_batch(second["TopicData"][0]["PartitionData"][0]["Records"])
    assert (view.base_sequence, view.records_count) == (1, 2)  # no gap for the broker
    assert verify_crc(view)


def test_an_invalid_record_refuses_its_partition_with_record_errors() -> None:
    f, _ = records_filter()
    body = produce("v.x", json_batch([{"amount": 1}, {"amount": -1}]))
    verdict = f.judge(HEADER, body, CONN)
    assert verdict is not None and verdict.patch is not None
    assert [t["Name"] for t in body["TopicData"]] == ["untouched"]
    response: dict[str, Any] = {"Responses": [{"Name": "untouched", "PartitionResponses": [
        {"Index": 0, "ErrorCode": 0, "BaseOffset": 5}]}]}
    assert verdict.patch(response)
    refused = response["Responses"][1]["PartitionResponses"][0]
    assert refused["ErrorCode"] == 87
    assert refused["RecordErrors"][0]["BatchIndex"] == 1
    assert "keg rule amounts" in refused["RecordErrors"][0]["BatchIndexErrorMessage"]
    assert refused["ErrorMessage"].startswith("keg rule amounts rejected record 1: $.amount")
    encoded = kafka_wire.encode_body(ApiKey.PRODUCE, 9, "response", response)
    assert kafka_wire.decode_body(ApiKey.PRODUCE, 9, "response", encoded)[0]["Responses"][1]


def test_refusals_are_reported_with_the_code_the_client_gets() -> None:
    f, decisions = records_filter()
    f.judge(HEADER, produce("v.x", json_batch([{"amount": -1}])), CONN)
    assert [(d.rule.id, d.outcome, d.error_code, d.answered) for d in decisions] == [
        ("amounts", "rejected", 87, True)]
    decisions.clear()
    unanswered = produce("v.x", json_batch([{"amount": -1}]))
    unanswered["Acks"] = 0
    verdict = f.judge(HEADER, unanswered, CONN)
    assert verdict is not None and not verdict.expects_response
    assert [(d.outcome, d.error_code, d.answered) for d in decisions] == [
        ("rejected", 87, False)]  # no answer tells the producer: it must not pass unseen


def test_a_request_with_nothing_left_is_answered_by_the_gateway() -> None:
    f, _ = records_filter()
    body = produce("v.x", json_batch([{"amount": -1}]))
    body["TopicData"].pop()  # only the refused topic
    verdict = f.judge(HEADER, body, CONN)
    assert verdict is not None and verdict.answer is not None
    assert verdict.answer["Responses"][0]["PartitionResponses"][0]["ErrorCode"] == 87


# A full Fetch of topic d.x (its answer carries d.x alone).
FETCH_D_X: dict[str, Any] = {"SessionEpoch": -1, "Topics": [{"Topic": "d.x", "Partitions": []}]}


def test_fetch_responses_are_rewritten_with_offsets_kept() -> None:
    f, _ = records_filter()
    verdict = f.judge(kafka_wire.RequestHeader(ApiKey.FETCH, 12, 2, "c", {}), FETCH_D_X, CONN)
    assert verdict is not None and verdict.patch is not None
    stored = json_batch([{"email": "a@x", "kind": "a"}, {"email": "b@x", "kind": "heartbeat"}],
                   base_offset=40)
    response: dict[str, Any] = {"Responses": [{"Topic": "d.x", "Partitions": [
        {"PartitionIndex": 0, "ErrorCode": 0, "HighWatermark": 42, "Records": stored}]}]}
    assert verdict.patch(response)
    records = response["Responses"][0]["Partitions"][0]["Records"]
    view = only_batch(records)
    assert view.base_offset == 40 and view.last_offset_delta == 1
    assert json_values(records) == [
        {"email": "****", "kind": "a"}, {"email": "****", "kind": "heartbeat"}]


def bomb_batch(records_count: int = 1, expands_to: int = MAX_DECOMPRESSED + 1) -> bytes:
    """A zstd batch whose payload expands past the decompression limit."""
    header = BatchHeader(base_timestamp=1_700_000_000_000, records_count=records_count,
                         attributes=int(Compression.ZSTD))
    payload = bytes(cramjam.zstd.compress(b"\0" * expands_to))
    good = encode_batch(header, [Record(0, 0, None, b"x", [])])
    # The bomb in place of the payload, with a length and CRC to match: valid on the wire.
    data = bytearray(good[:61]) + payload
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">i", data, 57, records_count)  # what the header claims
    struct.pack_into(">I", data, 17, google_crc32c.value(bytes(data[21:])))
    return bytes(data)


@pytest.mark.parametrize(("bomb", "reason"), [
    (bomb_batch(), "decompresses to 67108865 bytes exceeds the gateway's 33554432"),
    (bomb_batch(records_count=1_000_000, expands_to=1000),
     "a batch of 1000000 records exceeds the gateway's 100000 per batch"),
], ids=["bytes", "records"])
def test_a_bomb_is_refused_before_any_work(bomb: bytes, reason: str) -> None:
    f, _ = records_filter()
    body = produce("d.x", bomb)
    verdict = f.judge(HEADER, body, CONN)
    assert verdict is not None and verdict.patch is not None
    assert [t["Name"] for t in body["TopicData"]] == ["untouched"]
    response: dict[str, Any] = {"Responses": []}
    verdict.patch(response)
    refused = response["Responses"][0]["PartitionResponses"][0]
    assert refused["ErrorCode"] == 10  # MESSAGE_TOO_LARGE: not retriable, says why
    assert reason in refused["ErrorMessage"]


def test_a_batch_that_does_not_decode_is_refused_not_forwarded() -> None:
    f, _ = records_filter()
    corrupt = bytearray(json_batch([{"a": 1}]))
    corrupt[-3:] = b"\xff\xff\xff"  # the last record runs past the batch
    body = produce("d.x", bytes(corrupt))
    verdict = f.judge(HEADER, body, CONN)
    assert verdict is not None and verdict.patch is not None
    response: dict[str, Any] = {"Responses": []}
    verdict.patch(response)
    refused = response["Responses"][0]["PartitionResponses"][0]
    assert refused["ErrorCode"] == 2  # CORRUPT_MESSAGE
    assert "does not decode" in refused["ErrorMessage"]


def test_a_fetched_batch_that_does_not_decode_is_withheld() -> None:
    f, _ = records_filter()
    verdict = f.judge(kafka_wire.RequestHeader(ApiKey.FETCH, 12, 2, "c", {}), FETCH_D_X, CONN)
    assert verdict is not None and verdict.patch is not None
    response: dict[str, Any] = {"Responses": [{"Topic": "d.x", "Partitions": [
        {"PartitionIndex": 0, "ErrorCode": 0, "HighWatermark": 1, "Records": bomb_batch()}]}]}
    assert verdict.patch(response)
    partition = response["Responses"][0]["Partitions"][0]
    # Empty records, as the broker answers an error: librdkafka refuses a null set.
    assert (partition["ErrorCode"], partition["Records"]) == (2, b"")


def test_record_rules_that_run_past_the_frames_time_are_refused() -> None:
    engine = RuleEngine(CompiledRuleSet(load_rule_text(RULES, "r.yaml")),
                        limits=RecordLimits(max_frame_seconds=0.0))
    f = RecordsFilter(engine, IdentityTracker())
    body = produce("d.x", json_batch([{"kind": "order", "n": i} for i in range(300)]))
    verdict = f.judge(HEADER, body, CONN)
    assert verdict is not None and verdict.patch is not None
    response: dict[str, Any] = {"Responses": []}
    verdict.patch(response)
    refused = response["Responses"][0]["PartitionResponses"][0]
    # Out of time is retriable (a busy gateway may manage next time): REQUEST_TIMED_OUT.
    assert refused["ErrorCode"] == 7 and "ran past the frame's 0 s budget" in \
        refused["ErrorMessage"]


def fetched(*partitions: bytes) -> dict[str, Any]:
    return {"Responses": [{"Topic": "d.x", "Partitions": [
        {"PartitionIndex": i, "ErrorCode": 0, "HighWatermark": 100, "Records": records}
        for i, records in enumerate(partitions)]}]}


def frame_limited_filter(records_per_frame: int) -> RecordsFilter:
    engine = RuleEngine(CompiledRuleSet(load_rule_text(RULES, "r.yaml")),
                        limits=RecordLimits(max_records_per_frame=records_per_frame))
    return RecordsFilter(engine, IdentityTracker())


def test_a_fetched_answer_with_too_much_for_one_frame_goes_out_cut_short() -> None:
    """A Java consumer reading a 400,000-record backlog through a mask: answers past the
    frame's budget were withheld with CORRUPT_MESSAGE, and Java's poll() threw
    `KafkaException: Encountered corrupt message` at every such fetch (a new user's
    report). The answer now goes out with the batches judged so far, as a broker cuts
    one at its size limit; the consumer fetches the rest next time."""
    f = frame_limited_filter(3)
    verdict = f.judge(kafka_wire.RequestHeader(ApiKey.FETCH, 12, 2, "c", {}), FETCH_D_X, CONN)
    assert verdict is not None and verdict.patch is not None
    first = json_batch([{"email": "a@x"}, {"email": "b@x"}], base_offset=0)
    second = json_batch([{"email": "c@x"}, {"email": "d@x"}], base_offset=2)
    other = json_batch([{"email": "e@x"}, {"email": "f@x"}], base_offset=0)
    response = fetched(first + second, other)
    assert verdict.patch(response)
    cut, empty = response["Responses"][0]["Partitions"]
    assert cut["ErrorCode"] == 0 and json_values(cut["Records"]) == [
        {"email": "****"}, {"email": "****"}]
    assert (empty["ErrorCode"], empty["Records"]) == (0, b"")


@pytest.mark.parametrize("api", [ApiKey.FETCH, ApiKey.SHARE_FETCH])
def test_a_first_batch_past_the_frames_budget_is_still_withheld(api: int) -> None:
    """Cutting before anything was judged would hand out nothing, at every fetch: the
    partition is withheld as before. A ShareFetch answer is never cut (the offsets it
    acquired and left out would be acknowledged as gaps)."""
    f = frame_limited_filter(1 if api == ApiKey.FETCH else 3)
    body = (FETCH_D_X if api == ApiKey.FETCH else
            {"GroupId": "g", "Topics": [{"TopicId": "d.x", "Partitions": []}]})
    verdict = f.judge(kafka_wire.RequestHeader(api, 12 if api == ApiKey.FETCH else 1, 2, "c",
                                               {}), body, CONN)
    assert verdict is not None and verdict.patch is not None
    batches = (json_batch([{"email": "a@x"}, {"email": "b@x"}], base_offset=0)
               + json_batch([{"email": "c@x"}, {"email": "d@x"}], base_offset=2))
    response = fetched(batches)
    assert verdict.patch(response)
    partition = response["Responses"][0]["Partitions"][0]
    assert (partition["ErrorCode"], partition["Records"]) == (2, b"")

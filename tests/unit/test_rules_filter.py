"""RulesFilter without a network: decisions on decoded requests, envelopes included."""

from __future__ import annotations

from typing import Any

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters.rules import RuleDecision, RuleEngine, RulesFilter
from ext_proc.identity import IdentityTracker
from filter_rules import CompiledRuleSet, load_rule_text
from kafka_wire.api_keys import ENVELOPE, PRODUCE
from kafka_wire.envelope import Principal, envelope_request_body

RULES = """
rules:
  - id: payments-only-alice
    match: {apis: [Produce], topics: {prefix: [payments.]}, not: {principals: {exact: [alice]}}}
    action: {deny: {}}
"""
CONN = ConnectionInfo(client_host="10.0.0.5", client_port=5000, gateway_address="gw:19092")


def produce_body(*topics: str) -> dict[str, Any]:
    return {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"Name": t, "PartitionData": [{"Index": 0, "Records": b""}]} for t in topics]}


def rules_filter() -> tuple[RulesFilter, list[RuleDecision]]:
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(RULES, "t.yaml")), decisions.append)
    return RulesFilter(engine, IdentityTracker()), decisions


def envelope(principal: str, *topics: str) -> tuple[kafka_wire.RequestHeader, dict[str, Any]]:
    inner = kafka_wire.RequestHeader(PRODUCE, 9, 77, "client-of-broker", {})
    body = envelope_request_body(inner, produce_body(*topics), Principal("User", principal),
                                 "192.0.2.9")
    header = kafka_wire.RequestHeader(ENVELOPE, 0, 5, "broker-1", {})
    decoded = kafka_wire.decode_body(ENVELOPE, 0, "request", kafka_wire.encode_body(
        ENVELOPE, 0, "request", body))[0]
    return header, decoded


def test_envelope_is_judged_as_its_inner_principal() -> None:
    f, decisions = rules_filter()
    assert f.wants_request(ENVELOPE, 0)
    assert f.filter_request(*envelope("alice", "payments.x"), CONN) is None

    verdict = f.filter_request(*envelope("bob", "payments.x"), CONN)
    assert verdict is not None and verdict.answer is not None
    assert verdict.answer["ErrorCode"] == 0  # the envelope itself succeeded...
    data = verdict.answer["ResponseData"]
    correlation_id, _tags, offset = kafka_wire.read_response_header(data, PRODUCE, 9)
    inner, _ = kafka_wire.decode_body(PRODUCE, 9, "response", data, offset)
    assert correlation_id == 77  # ...and carries the inner request's refusal
    assert inner["Responses"][0]["PartitionResponses"][0]["ErrorCode"] == 29
    assert [(d.principal, d.outcome, d.topic) for d in decisions] == [
        ("User:bob", "denied", "payments.x")]


def test_partial_denial_inside_an_envelope_rewrites_the_inner_request() -> None:
    f, _ = rules_filter()
    header, body = envelope("bob", "payments.x", "other")
    verdict = f.filter_request(header, body, CONN)
    assert verdict is not None and verdict.changed and verdict.patch is not None
    _inner_header, inner_body = kafka_wire.decode_request(body["RequestData"])
    assert [t["Name"] for t in inner_body["TopicData"]] == ["other"]
    answer = kafka_wire.write_response_header(77, PRODUCE, 9) + kafka_wire.encode_body(
        PRODUCE, 9, "response", {"Responses": [{"Name": "other", "PartitionResponses": [
            {"Index": 0, "ErrorCode": 0, "BaseOffset": 5}]}]})
    response: dict[str, Any] = {"ErrorCode": 0, "ResponseData": answer}
    assert verdict.patch(response)
    _, merged = kafka_wire.decode_response(response["ResponseData"], PRODUCE, 9)
    codes = {t["Name"]: t["PartitionResponses"][0]["ErrorCode"] for t in merged["Responses"]}
    assert codes == {"other": 0, "payments.x": 29}


def test_direct_requests_use_the_connections_principal() -> None:
    f, decisions = rules_filter()
    header = kafka_wire.RequestHeader(PRODUCE, 9, 1, "c", {})
    verdict = f.filter_request(header, produce_body("payments.y"), CONN)  # ANONYMOUS
    assert verdict is not None and verdict.answer is not None
    assert decisions[0].principal == "User:ANONYMOUS"

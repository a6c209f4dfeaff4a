"""kafka_wire.endpoints: no broker address leaves the gateway, in any answer.

Generated from the schemas, independently of the module's own walk: every response
schema whose JSON has a `Host` field, at every version, is built with every field set
and every host a broker's; after `rewrite_endpoints` the encoded answer must not
contain the broker's host anywhere (rewritten to the gateway's, or redacted), except
where the schema's Host is not an address (ACL host patterns, Kafka Streams
application endpoints).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import kafka_wire as kw
from kafka_wire import ApiKey
from kafka_wire.endpoints import (
    EndpointPolicy,
    carries_endpoints,
    endpoint_policy,
    rewrite_config_endpoints,
    rewrite_endpoints,
)
from tests.unit.kafka_wire.schema_scan import has_field
from tests.unit.kafka_wire.test_codec import ALL, Builder, spec_of

BROKER_HOST = "broker-7.internal.example"
GATEWAY = ("gw.example", 19092)


def has_host_field(api_key: int, version: int) -> bool:
    return has_field(api_key, version, "response", lambda f: f["name"] == "Host")


RESPONSES = sorted({(k, v) for k, v, kind in ALL if kind == "response" and has_host_field(k, v)})


def with_broker_hosts(value: Any) -> Any:
    """Every Host a broker's, every node id a real node's."""
    if isinstance(value, list):
        for item in value:
            with_broker_hosts(item)
    elif isinstance(value, dict):
        if "Host" in value:
            value["Host"] = BROKER_HOST
            for field in ("NodeId", "BrokerId", "LeaderId"):
                if field in value:
                    value[field] = 7
        for item in value.values():
            with_broker_hosts(item)
    return value


def route(node: int) -> tuple[str, int]:
    assert node == 7
    return GATEWAY


def test_the_generated_list_holds_every_address_carrying_api() -> None:
    keys = {k for k, _ in RESPONSES}
    assert {0, 1, 3, 10, 29, 31, 55, 60, 78, 79} <= keys


@pytest.mark.parametrize(("api_key", "version"), RESPONSES)
def test_no_broker_host_survives(api_key: int, version: int) -> None:
    spec, flexible = spec_of(api_key, version, "response")
    body = with_broker_hosts(Builder(version, flexible, nulls=False).struct(spec, top=True))
    before = kw.encode_body(api_key, version, "response", body)
    assert BROKER_HOST.encode() in before
    policy = endpoint_policy(api_key)
    changed = rewrite_endpoints(api_key, version, body, route)
    after = kw.encode_body(api_key, version, "response", body)
    if policy is EndpointPolicy.NOT_AN_ADDRESS:
        assert not changed and after == before and not carries_endpoints(api_key, version)
        return
    assert carries_endpoints(api_key, version)
    assert changed and BROKER_HOST.encode() not in after, (api_key, version)
    if policy is EndpointPolicy.BROKER:
        assert GATEWAY[0].encode() in after


def describe_configs(configs: list[tuple[str, str | None]], broker: str = "7") -> dict[str, Any]:
    return {"ThrottleTimeMs": 0, "Results": [{
        "ErrorCode": 0, "ErrorMessage": None, "ResourceType": 4, "ResourceName": broker,
        "Configs": [{"Name": n, "Value": v, "ReadOnly": True, "ConfigSource": 1,
                     "IsSensitive": False, "Synonyms": [
                         {"Name": n, "Value": v, "Source": 1}], "ConfigType": 2,
                     "Documentation": None} for n, v in configs]}]}


def test_broker_configs_show_the_gateway_and_hide_other_endpoints() -> None:
    body = describe_configs([
        ("advertised.listeners", f"PLAINTEXT://{BROKER_HOST}:9092,SASL://{BROKER_HOST}:9093"),
        ("listeners", "PLAINTEXT://0.0.0.0:9092,CONTROLLER://:9093"),
        ("controller.quorum.voters", f"1@{BROKER_HOST}:9093"),
        ("log.dirs", "/var/lib/kafka"),
        ("num.partitions", "3"),
    ])
    assert rewrite_config_endpoints(body, route)
    configs = {c["Name"]: c for c in body["Results"][0]["Configs"]}
    assert configs["advertised.listeners"]["Value"] == (
        "PLAINTEXT://gw.example:19092,SASL://gw.example:19092")
    assert configs["advertised.listeners"]["Synonyms"][0]["Value"] == (
        configs["advertised.listeners"]["Value"])
    for name in ("listeners", "controller.quorum.voters"):
        assert configs[name]["Value"] is None and configs[name]["IsSensitive"]
        assert configs[name]["Synonyms"][0]["Value"] is None
    assert configs["log.dirs"]["Value"] == "/var/lib/kafka"
    assert configs["num.partitions"]["Value"] == "3"
    encoded = kw.encode_body(ApiKey.DESCRIBE_CONFIGS, 4, "response", body)
    assert BROKER_HOST.encode() not in encoded and b"0.0.0.0" not in encoded


def test_kafkas_built_in_default_is_left_as_it_is() -> None:
    """`listeners`' DEFAULT_CONFIG synonym (PLAINTEXT://:9092 on every Kafka) was
    redacted: lossy, and no address of the cluster."""
    body = describe_configs([("listeners", "PLAINTEXT://kafka-1:9092")])
    [config] = body["Results"][0]["Configs"]
    config["Synonyms"].append({"Name": "listeners", "Value": "PLAINTEXT://:9092", "Source": 5})
    assert rewrite_config_endpoints(body, route)
    assert [s["Value"] for s in config["Synonyms"]] == [None, "PLAINTEXT://:9092"]
    defaulted = describe_configs([("listeners", "PLAINTEXT://:9092")])
    defaulted["Results"][0]["Configs"][0]["ConfigSource"] = 5
    defaulted["Results"][0]["Configs"][0]["Synonyms"][0]["Source"] = 5
    assert not rewrite_config_endpoints(defaulted, route)


def test_an_error_answer_without_a_node_is_left_alone() -> None:
    body = {"ErrorCode": 15, "ErrorMessage": None, "NodeId": -1, "Host": "", "Port": -1}
    assert not rewrite_endpoints(ApiKey.FIND_COORDINATOR, 3, body, route)


# -- leader hints hidden as a response passes (Produce v10+, Fetch v16+) -----------------


def fetch_answer(cid: int, version: int, with_hints: bool) -> bytes:
    from kafka_wire.records import BatchHeader, Record, encode_batch

    records = encode_batch(BatchHeader(base_timestamp=1), [Record(0, 0, b"k", b"v" * 300, [])])
    body: dict[str, Any] = {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 7, "Responses": [
        {"TopicId": uuid.UUID(int=5), "Partitions": [
            {"PartitionIndex": p, "ErrorCode": 6 if with_hints else 0, "HighWatermark": 10,
             "LastStableOffset": 10, "LogStartOffset": 0, "AbortedTransactions": None,
             "PreferredReadReplica": -1, "Records": records,
             "CurrentLeader": {"LeaderId": 7, "LeaderEpoch": 3}} for p in range(3)]}]}
    if with_hints:
        body["NodeEndpoints"] = [{"NodeId": 7, "Host": BROKER_HOST, "Port": 9092,
                                  "Rack": None}]
    return kw.encode_response(cid, ApiKey.FETCH, version, body)


def test_a_passing_fetch_answer_loses_its_leader_hints_at_every_split() -> None:
    from ext_proc.connection import ConnectionInfo
    from ext_proc.server import rule_free_session

    conn = ConnectionInfo(gateway_address="gw.example:19092", routes={7: GATEWAY})
    request = kw.encode_request(kw.RequestHeader(ApiKey.FETCH, 16, 1, "c", {}), {
        "ReplicaId": -1, "MaxWaitMs": 1, "MinBytes": 1, "MaxBytes": 1, "IsolationLevel": 0,
        "SessionId": 0, "SessionEpoch": -1, "Topics": [], "ForgottenTopicsData": [],
        "RackId": ""})
    for with_hints in (True, False):
        answer = fetch_answer(1, 16, with_hints)
        for cut in range(0, len(answer), 7):
            session = rule_free_session(conn)
            session.from_client(request)
            out = session.from_broker(answer[:cut]) + session.from_broker(answer[cut:])
            assert len(out) == len(answer)  # passed, never held or re-encoded
            assert BROKER_HOST.encode() not in out
            assert out == answer or with_hints
            _, body = kw.decode_response(out[4:], ApiKey.FETCH, 16)
            assert "NodeEndpoints" not in body or not body["NodeEndpoints"]
            if with_hints:  # hidden as an unknown tag the client skips
                assert 0x7F in body.get("_unknown_tags", {})
            assert [p["Records"] for p in body["Responses"][0]["Partitions"]] == [
                p["Records"] for p in kw.decode_response(answer[4:], ApiKey.FETCH, 16)[1][
                    "Responses"][0]["Partitions"]]


def test_the_hints_of_a_held_answer_are_rewritten_not_hidden() -> None:
    body = kw.decode_response(fetch_answer(1, 16, True)[4:], ApiKey.FETCH, 16)[1]
    assert rewrite_endpoints(ApiKey.FETCH, 16, body, route)
    assert body["NodeEndpoints"] == [{"NodeId": 7, "Host": GATEWAY[0], "Port": GATEWAY[1],
                                      "Rack": None}]

"""KafkaSession: responses a filter wants are rewritten; everything else is untouched."""

from __future__ import annotations

import pytest

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.server import rule_free_session
from ext_proc.session import KafkaSession, ProtocolViolation
from kafka_wire import ApiKey
from kafka_wire.framing import HeldBytes

CONN = ConnectionInfo(gateway_address="gw:19092", routes={1: ("gw", 19092), 2: ("gw", 19093)})


def request(api_key: int, version: int, correlation_id: int, body: dict[str, object]) -> bytes:
    header = kafka_wire.RequestHeader(api_key, version, correlation_id, "test", {})
    return kafka_wire.encode_request(header, body)


def metadata_response(correlation_id: int, version: int = 12) -> bytes:
    body = {
        "Brokers": [
            {"NodeId": 1, "Host": "broker-1.internal", "Port": 9092, "Rack": None},
            {"NodeId": 2, "Host": "broker-2.internal", "Port": 9092, "Rack": "r2"},
        ],
        "ClusterId": "abc",
        "ControllerId": 1,
        "Topics": [],
    }
    return kafka_wire.encode_response(correlation_id, ApiKey.METADATA, version, body)


def max_version(api_key: int) -> int:
    versions = kafka_wire.supported_versions(api_key)
    assert versions is not None
    return versions[1]


def session() -> KafkaSession:
    return rule_free_session(CONN)


def split_feed(feed: object, data: bytes, cut: int) -> bytes:
    return feed(data[:cut]) + feed(data[cut:])  # type: ignore[operator]


def test_metadata_brokers_point_at_gateway_at_every_split() -> None:
    meta_request = request(ApiKey.METADATA, 12, 7, {"Topics": None})
    response = metadata_response(7)
    for cut in range(1, len(response)):
        s = session()
        assert s.from_client(meta_request) == meta_request
        out = split_feed(s.from_broker, response, cut)
        _, body = kafka_wire.decode_response(out[4:], ApiKey.METADATA, 12)
        assert [(b["Host"], b["Port"]) for b in body["Brokers"]] == [("gw", 19092),
                                                                       ("gw", 19093)]
        assert body["ClusterId"] == "abc" and body["Brokers"][1]["Rack"] == "r2"


def test_unknown_broker_goes_to_own_listener() -> None:
    s = rule_free_session(ConnectionInfo(gateway_address="gw:19092", routes={1: ("gw", 19092)}))
    s.from_client(request(ApiKey.METADATA, 12, 1, {"Topics": None}))
    out = s.from_broker(metadata_response(1))
    _, body = kafka_wire.decode_response(out[4:], ApiKey.METADATA, 12)
    assert {(b["Host"], b["Port"]) for b in body["Brokers"]} == {("gw", 19092)}


def test_frames_nobody_wants_pass_as_the_same_object() -> None:
    s = session()
    produce = request(ApiKey.PRODUCE, 9, 1, {"Acks": -1, "TimeoutMs": 1000, "TopicData": []})
    assert s.from_client(produce) is produce
    response = kafka_wire.encode_response(1, ApiKey.PRODUCE, 9, {"Responses": []})
    assert s.from_broker(response) is response
    assert s.frames_rewritten == 0


def test_api_versions_pass_as_the_broker_sent_them() -> None:
    s = session()
    s.from_client(request(ApiKey.API_VERSIONS, 3, 1, {"ClientSoftwareName": "t",
                                                "ClientSoftwareVersion": "1"}))
    advertised = [
        {"ApiKey": ApiKey.PRODUCE, "MinVersion": 3, "MaxVersion": 13},
        {"ApiKey": ApiKey.FETCH, "MinVersion": 4, "MaxVersion": 18},
        {"ApiKey": ApiKey.METADATA, "MinVersion": 0, "MaxVersion": 99},
        {"ApiKey": 78, "MinVersion": 1, "MaxVersion": 1},
        {"ApiKey": 4242, "MinVersion": 0, "MaxVersion": 3},  # unknown to the codec: kept
    ]
    response = kafka_wire.encode_response(1, ApiKey.API_VERSIONS, 3, {"ErrorCode": 0,
                                                               "ApiKeys": advertised})
    out = s.from_broker(response)
    _, body = kafka_wire.decode_response(out[4:], ApiKey.API_VERSIONS, 3)
    got = {e["ApiKey"]: (e["MinVersion"], e["MaxVersion"]) for e in body["ApiKeys"]}
    assert got[ApiKey.PRODUCE] == (3, 13)  # KIP-890 transactions need Produce v12+
    assert got[ApiKey.FETCH] == (4, 18)
    assert got[78] == (1, 1)  # share groups (KIP-932)
    assert got[4242] == (0, 3)  # unknown to the codec: kept
    # Only an address-carrying API past what keg reads is clipped (a newer broker).
    assert got[ApiKey.METADATA] == (0, max_version(ApiKey.METADATA))


def test_api_versions_within_what_keg_reads_are_forwarded_untouched() -> None:
    s = session()
    s.from_client(request(ApiKey.API_VERSIONS, 3, 1, {"ClientSoftwareName": "t",
                                                "ClientSoftwareVersion": "1"}))
    advertised = [{"ApiKey": ApiKey.PRODUCE, "MinVersion": 3, "MaxVersion": 13},
                  {"ApiKey": 76, "MinVersion": 1, "MaxVersion": 1}]
    response = kafka_wire.encode_response(1, ApiKey.API_VERSIONS, 3, {"ErrorCode": 0,
                                                               "ApiKeys": advertised})
    assert s.from_broker(response) == response


def test_unsupported_api_versions_answer_is_read_as_v0() -> None:
    s = session()
    s.from_client(request(ApiKey.API_VERSIONS, 3, 5, {"ClientSoftwareName": "t",
                                                "ClientSoftwareVersion": "1"}))
    v0 = kafka_wire.encode_response(5, ApiKey.API_VERSIONS, 0, {
        "ErrorCode": 35, "ApiKeys": [{"ApiKey": 18, "MinVersion": 0, "MaxVersion": 3}]})
    assert s.from_broker(v0) == v0


@pytest.mark.parametrize("bad", [
    b"\xff\xff\xff\xff" + b"\0" * 8,  # negative size
    b"\0\0\0\x10" + b"\xff\xb3\0\0\0\0\0\1" + b"\0" * 8,  # negative api key
])
def test_malformed_requests_violate_protocol(bad: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        session().from_client(bad)


def test_response_without_request_violates_protocol() -> None:
    with pytest.raises(ProtocolViolation, match="correlation id 9"):
        session().from_broker(metadata_response(9))


def test_held_frames_are_bounded_for_the_whole_process() -> None:
    """Frames a filter must read are held until complete: all connections together
    hold at most the budget; a frame past it closes its connection only."""
    budget = HeldBytes(limit=1000)
    # ApiVersions requests are held (the identity observer reads their client id).
    meta = request(ApiKey.API_VERSIONS, 3, 1, {"ClientSoftwareName": "x" * 600,
                                         "ClientSoftwareVersion": "1"})
    first = KafkaSession(CONN, rule_free_session(CONN).chain.filters, held_bytes=budget)
    second = KafkaSession(CONN, rule_free_session(CONN).chain.filters, held_bytes=budget)
    assert first.from_client(meta[:100]) == b""  # held: its size is taken at once
    assert budget.held == len(meta) - 4
    with pytest.raises(ProtocolViolation, match="would exceed the gateway's 1000 bytes"):
        second.from_client(meta)
    assert first.from_client(meta[100:]) == meta  # complete: processed and released
    assert budget.held == 0
    first.from_client(meta[:10])
    first.close()  # a connection gone mid-frame gives its share back
    assert budget.held == 0 and budget.refused == 1

"""KIP-559 group payloads: consumer and Connect codecs, the per-connection tracker, and
the observing filter inside a KafkaSession."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kafka_wire as kw
from ext_proc.connection import ConnectionInfo
from ext_proc.filters.group_protocol import GroupProtocolObserver
from ext_proc.session import KafkaSession
from kafka_wire import ApiKey, ErrorCode
from kafka_wire.errors import DecodeError, EncodeError, KafkaWireError, UnknownApiError
from kafka_wire.framing import frame_bytes
from kafka_wire.group_protocol import (
    CONNECT,
    CONNECTOR_TASK,
    CONSUMER,
    GroupObservation,
    GroupPayload,
    GroupProtocolTracker,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_payload,
    encode_subscription,
)

# -- the consumer protocol ----------------------------------------------------------

SUBSCRIPTIONS: dict[int, dict[str, Any]] = {
    0: {"Topics": ["orders", "payments"], "UserData": b"\x01\x02"},
    1: {
        "Topics": ["orders"],
        "UserData": None,
        "OwnedPartitions": [{"Topic": "orders", "Partitions": [0, 2]}],
    },
    2: {
        "Topics": ["orders"],
        "UserData": b"",
        "OwnedPartitions": [{"Topic": "orders", "Partitions": [1]}],
        "GenerationId": 7,
    },
    3: {
        "Topics": ["orders", "payments"],
        "UserData": None,
        "OwnedPartitions": [],
        "GenerationId": 3,
        "RackId": "az-1",
    },
}


@pytest.mark.parametrize("version", sorted(SUBSCRIPTIONS))
def test_consumer_subscription_matches_kafka_python_byte_for_byte(version: int) -> None:
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

    fields = SUBSCRIPTIONS[version]
    ours = encode_subscription(CONSUMER, version, fields)
    theirs = ConsumerProtocolSubscription(
        version=version,
        topics=fields["Topics"],
        user_data=fields["UserData"],
        owned_partitions=[(p["Topic"], p["Partitions"]) for p in fields.get("OwnedPartitions", [])],
        generation_id=fields.get("GenerationId", -1),
        rack_id=fields.get("RackId"),
    ).encode()
    assert ours == theirs
    payload = decode_subscription(CONSUMER, theirs)
    assert payload == GroupPayload(CONSUMER, "subscription", version, fields)
    assert encode_payload(payload) == theirs


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_consumer_assignment_round_trips_with_kafka_python(version: int) -> None:
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

    fields: dict[str, Any] = {
        "AssignedPartitions": [
            {"Topic": "orders", "Partitions": [0, 1, 2]},
            {"Topic": "payments", "Partitions": [5]},
        ],
        "UserData": b"sticky" if version else None,
    }
    ours = encode_assignment(CONSUMER, version, fields)
    theirs = ConsumerProtocolAssignment(
        version=version,
        assigned_partitions=[(p["Topic"], p["Partitions"]) for p in fields["AssignedPartitions"]],
        user_data=fields["UserData"],
    ).encode()
    assert ours == theirs
    assert decode_assignment(CONSUMER, ours).fields == fields


def test_a_newer_consumer_version_is_read_as_the_newest_and_keeps_its_tail() -> None:
    v3 = encode_subscription(CONSUMER, 3, SUBSCRIPTIONS[3])
    v5 = struct.pack(">h", 5) + v3[2:] + b"\x00\x00\x00\x2afuture"
    payload = decode_subscription(CONSUMER, v5)
    assert payload.version == 5
    assert payload.fields == SUBSCRIPTIONS[3]
    assert payload.extra == b"\x00\x00\x00\x2afuture"
    assert encode_payload(payload) == v5


def test_consumer_payload_errors() -> None:
    with pytest.raises(DecodeError, match="no version"):
        decode_subscription(CONSUMER, b"\x00")
    with pytest.raises(DecodeError, match="unsupported version -1"):
        decode_assignment(CONSUMER, b"\xff\xff\x00\x00\x00\x00")
    with pytest.raises(DecodeError):
        decode_subscription(CONSUMER, encode_subscription(CONSUMER, 1, SUBSCRIPTIONS[1])[:-3])
    with pytest.raises(UnknownApiError, match="'sr'"):
        decode_subscription("sr", b"\x00\x00")
    with pytest.raises(EncodeError):
        encode_subscription(CONSUMER, 0, {"Topics": [1]})


# -- Kafka Connect --------------------------------------------------------------------


def jstring(s: str) -> bytes:
    """Kafka's old Type.STRING, written independently of the code under test."""
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def jconnectors(entries: list[tuple[str, list[int]]] | None) -> bytes:
    if entries is None:
        return struct.pack(">i", -1)
    out = struct.pack(">i", len(entries))
    for name, tasks in entries:
        out += jstring(name) + struct.pack(f">i{len(tasks)}i", len(tasks), *tasks)
    return out


def java_assignment(version: int, revoked: bool = True) -> bytes:
    """ConnectProtocol / IncrementalCooperativeConnectProtocol.serializeAssignment."""
    out = struct.pack(">hh", version, 0) + jstring("worker-1") + jstring("http://w1:8083")
    out += struct.pack(">q", 42)
    out += jconnectors([("jdbc-sink", [CONNECTOR_TASK, 0, 1]), ("s3", [2])])
    if version >= 1:
        out += jconnectors([("old", [3])] if revoked else None) + struct.pack(">i", 5000)
    return out


def test_connect_worker_state_v0() -> None:
    data = struct.pack(">h", 0) + jstring("http://w1:8083") + struct.pack(">q", 17)
    payload = decode_subscription(CONNECT, data)
    assert payload.version == 0
    assert payload.fields == {"Url": "http://w1:8083", "ConfigOffset": 17}
    assert encode_payload(payload) == data


@pytest.mark.parametrize("version", [1, 2])
def test_connect_worker_state_with_allocation(version: int) -> None:
    allocation = java_assignment(version)
    data = (
        struct.pack(">h", version) + jstring("http://w2:8083") + struct.pack(">q", 42)
        + struct.pack(">i", len(allocation)) + allocation
    )
    payload = decode_subscription(CONNECT, data)
    assert payload.fields["Url"] == "http://w2:8083"
    nested = payload.fields["Allocation"]
    assert isinstance(nested, GroupPayload)
    assert nested.version == version
    assert nested.fields["Assignment"] == [
        {"Connector": "jdbc-sink", "Tasks": [CONNECTOR_TASK, 0, 1]},
        {"Connector": "s3", "Tasks": [2]},
    ]
    assert nested.fields["Revoked"] == [{"Connector": "old", "Tasks": [3]}]
    assert nested.fields["ScheduledDelay"] == 5000
    assert encode_payload(payload) == data


def test_connect_worker_state_null_or_missing_allocation() -> None:
    head = struct.pack(">h", 2) + jstring("http://w3:8083") + struct.pack(">q", -1)
    null = decode_subscription(CONNECT, head + struct.pack(">i", -1))
    assert null.fields["Allocation"] is None
    assert encode_payload(null) == head + struct.pack(">i", -1)
    missing = decode_subscription(CONNECT, head)  # Kafka tolerates the missing field
    assert "Allocation" not in missing.fields
    assert encode_payload(missing) == head


def test_connect_assignment_v0_and_v1() -> None:
    v0 = java_assignment(0)
    p0 = decode_assignment(CONNECT, v0)
    assert p0.fields == {
        "Error": 0,
        "Leader": "worker-1",
        "LeaderUrl": "http://w1:8083",
        "ConfigOffset": 42,
        "Assignment": [
            {"Connector": "jdbc-sink", "Tasks": [-1, 0, 1]},
            {"Connector": "s3", "Tasks": [2]},
        ],
    }
    assert encode_payload(p0) == v0
    v1 = java_assignment(1, revoked=False)
    p1 = decode_assignment(CONNECT, v1)
    assert p1.fields["Revoked"] is None and p1.fields["ScheduledDelay"] == 5000
    assert encode_payload(p1) == v1


def test_connect_assignment_tolerates_missing_tail_fields() -> None:
    full = java_assignment(1)
    head_len = 2 + 2 + len(jstring("worker-1")) + len(jstring("http://w1:8083")) + 8
    short = decode_assignment(CONNECT, full[:head_len])
    assert set(short.fields) == {"Error", "Leader", "LeaderUrl", "ConfigOffset"}
    assert encode_payload(short) == full[:head_len]
    with pytest.raises(EncodeError, match="present up to the first absent"):
        encode_assignment(CONNECT, 1, {**short.fields, "ScheduledDelay": 1})


def test_connect_errors_and_newer_versions() -> None:
    with pytest.raises(DecodeError, match="unsupported version"):
        decode_assignment(CONNECT, b"\xff\xfe" + java_assignment(0)[2:])
    v0 = java_assignment(0)
    with pytest.raises(DecodeError, match="array count -1"):  # v0 arrays are not nullable
        decode_assignment(CONNECT, v0[: -len(jconnectors([("jdbc-sink", [-1, 0, 1]), ("s3", [2])]))]
                          + struct.pack(">i", -1))
    with pytest.raises(DecodeError):
        decode_assignment(CONNECT, v0[:-1])
    with pytest.raises(DecodeError, match="string length"):
        decode_subscription(CONNECT, b"\x00\x00\xff\xff")
    # A version 3 is read as v1+, like Kafka does ("assume versions can be parsed").
    v3 = b"\x00\x03" + java_assignment(1)[2:] + b"tail"
    p3 = decode_assignment(CONNECT, v3)
    assert p3.version == 3 and p3.extra == b"tail" and encode_payload(p3) == v3


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=80), kind=st.sampled_from(["subscription", "assignment"]),
       protocol_type=st.sampled_from([CONSUMER, CONNECT]))
def test_random_payload_bytes_raise_only_decode_errors(
        data: bytes, kind: str, protocol_type: str) -> None:
    decode = decode_subscription if kind == "subscription" else decode_assignment
    try:
        payload = decode(protocol_type, data)
    except KafkaWireError:
        return
    # Whatever decodes re-encodes to the same bytes.
    assert encode_payload(payload) == data


connector_entries = st.lists(
    st.fixed_dictionaries({
        "Connector": st.text(max_size=8),
        "Tasks": st.lists(st.integers(-1, 2**31 - 1), max_size=4),
    }),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(
    version=st.integers(1, 3),
    error=st.integers(-(2**15), 2**15 - 1),
    assigned=st.none() | connector_entries,
    revoked=st.none() | connector_entries,
    delay=st.integers(-(2**31), 2**31 - 1),
)
def test_connect_assignment_round_trip(
    version: int, error: int, assigned: Any, revoked: Any, delay: int
) -> None:
    fields = {
        "Error": error, "Leader": "l", "LeaderUrl": "u", "ConfigOffset": 9,
        "Assignment": assigned, "Revoked": revoked, "ScheduledDelay": delay,
    }
    data = encode_assignment(CONNECT, version, fields)
    assert decode_assignment(CONNECT, data).fields == fields


# -- the tracker ------------------------------------------------------------------------

RANGE_SUB = encode_subscription(CONSUMER, 0, {"Topics": ["orders"], "UserData": None})
COOP_SUB = encode_subscription(CONSUMER, 3, SUBSCRIPTIONS[3])
ASSIGN_A = encode_assignment(
    CONSUMER, 0, {"AssignedPartitions": [{"Topic": "orders", "Partitions": [0]}], "UserData": None}
)
ASSIGN_B = encode_assignment(
    CONSUMER, 0, {"AssignedPartitions": [{"Topic": "orders", "Partitions": [1]}], "UserData": None}
)


def wire_body(api_key: int, version: int, kind: str, value: dict[str, Any]) -> dict[str, Any]:
    """What the codec decodes from the wire for `value` (all fields at that version)."""
    return kw.decode_body(api_key, version, kind, kw.encode_body(api_key, version, kind, value))[0]


def join_request(version: int, member: str = "", group: str = "g1",
                 protocol_type: str = CONSUMER) -> dict[str, Any]:
    return wire_body(ApiKey.JOIN_GROUP, version, "request", {
        "GroupId": group, "SessionTimeoutMs": 10000, "RebalanceTimeoutMs": 30000,
        "MemberId": member, "ProtocolType": protocol_type,
        "Protocols": [{"Name": "cooperative-sticky", "Metadata": COOP_SUB},
                      {"Name": "range", "Metadata": RANGE_SUB}],
    })


def join_response(version: int, member: str, leader: str,
                  members: list[tuple[str, bytes]], name: str = "range",
                  protocol_type: str | None = CONSUMER) -> dict[str, Any]:
    return wire_body(ApiKey.JOIN_GROUP, version, "response", {
        "ErrorCode": 0, "GenerationId": 4, "ProtocolType": protocol_type, "ProtocolName": name,
        "Leader": leader, "MemberId": member,
        "Members": [{"MemberId": m, "Metadata": md} for m, md in members],
    })


def sync_request(version: int, member: str, assignments: list[tuple[str, bytes]],
                 protocol_type: str | None = CONSUMER, name: str | None = "range",
                 group: str = "g1") -> dict[str, Any]:
    return wire_body(ApiKey.SYNC_GROUP, version, "request", {
        "GroupId": group, "GenerationId": 4, "MemberId": member,
        "ProtocolType": protocol_type, "ProtocolName": name,
        "Assignments": [{"MemberId": m, "Assignment": a} for m, a in assignments],
    })


def sync_response(version: int, assignment: bytes, protocol_type: str | None = CONSUMER,
                  name: str | None = "range") -> dict[str, Any]:
    return wire_body(ApiKey.SYNC_GROUP, version, "response", {
        "ErrorCode": 0, "ProtocolType": protocol_type, "ProtocolName": name,
        "Assignment": assignment,
    })


def topics(observation: GroupObservation) -> list[tuple[str, str, Any]]:
    out: list[tuple[str, str, Any]] = []
    for p in observation.payloads:
        assert p.payload is not None, p.error
        f = p.payload.fields
        value = f.get("Topics") or [
            (tp["Topic"], tp["Partitions"]) for tp in f.get("AssignedPartitions", [])
        ]
        out.append((p.member_id, p.path, value))
    return out


def test_old_versions_use_the_connection_memory() -> None:
    t = GroupProtocolTracker()
    first = t.on_request(ApiKey.JOIN_GROUP, 5, join_request(5, "m-a"), correlation_id=10)
    assert [(p.protocol_name, p.path) for p in first.payloads] == [
        ("cooperative-sticky", "message"), ("range", "message")]
    assert first.payloads[0].payload is not None
    assert first.payloads[0].payload.fields["RackId"] == "az-1"
    # JoinGroupResponse v5: ProtocolName is there, ProtocolType is not.
    joined = t.on_response(
        ApiKey.JOIN_GROUP,
        5,
        join_response(
            5, "m-a", "m-a", [("m-a", RANGE_SUB), ("m-b", RANGE_SUB)], protocol_type=None
        ),
        correlation_id=10,
    )
    assert topics(joined) == [("m-a", "connection-memory", ["orders"]),
                              ("m-b", "connection-memory", ["orders"])]
    assert {p.protocol_name for p in joined.payloads} == {"range"}
    assert t.group_protocol("g1") == (CONSUMER, "range")
    # SyncGroup v3 carries neither.
    synced = t.on_request(ApiKey.SYNC_GROUP, 3, sync_request(3, "m-a", [("m-a", ASSIGN_A),
                                                                 ("m-b", ASSIGN_B)]), 11)
    assert topics(synced) == [("m-a", "connection-memory", [("orders", [0])]),
                              ("m-b", "connection-memory", [("orders", [1])])]
    answer = t.on_response(ApiKey.SYNC_GROUP, 3, sync_response(3, ASSIGN_A, None, None), 11)
    assert topics(answer) == [("m-a", "connection-memory", [("orders", [0])])]
    assert answer.payloads[0].group_id == "g1"
    assert (t.counters.message, t.counters.connection_memory) == (2, 5)


def test_new_versions_are_self_describing() -> None:
    t = GroupProtocolTracker()
    # No JoinGroupRequest seen (say the tracker started late): v7+/v5+ still decode.
    joined = t.on_response(
        ApiKey.JOIN_GROUP, 7, join_response(7, "m-a", "m-a", [("m-a", RANGE_SUB)])
    )
    assert topics(joined) == [("m-a", "message", ["orders"])]
    synced = t.on_request(ApiKey.SYNC_GROUP, 5, sync_request(5, "m-a", [("m-a", ASSIGN_A)]), 3)
    assert topics(synced) == [("m-a", "message", [("orders", [0])])]
    answer = t.on_response(ApiKey.SYNC_GROUP, 5, sync_response(5, ASSIGN_A), 3)
    assert topics(answer) == [("m-a", "message", [("orders", [0])])]
    assert answer.payloads[0].protocol_name == "range"


def test_old_versions_without_memory_are_reported_unknown() -> None:
    t = GroupProtocolTracker()
    synced = t.on_request(ApiKey.SYNC_GROUP, 3, sync_request(3, "m-a", [("m-a", ASSIGN_A)]), 1)
    [p] = synced.payloads
    assert (p.path, p.payload, p.raw) == ("unknown", None, ASSIGN_A)
    assert p.error is not None and "no protocol type" in p.error
    answer = t.on_response(ApiKey.SYNC_GROUP, 3, sync_response(3, ASSIGN_A, None, None), 1)
    assert [x.path for x in answer.payloads] == ["unknown"]
    assert t.counters.unknown == 2


def test_inconsistent_sync_group_is_reported() -> None:
    t = GroupProtocolTracker()
    t.on_request(ApiKey.JOIN_GROUP, 7, join_request(7, "m-a"), 1)
    t.on_response(ApiKey.JOIN_GROUP, 7, join_response(7, "m-a", "m-a", [("m-a", RANGE_SUB)]), 1)
    ok = t.on_request(ApiKey.SYNC_GROUP, 5, sync_request(5, "m-a", []), 2)
    assert ok.inconsistencies == ()
    bad = t.on_request(ApiKey.SYNC_GROUP, 5, sync_request(
        5, "m-a", [("m-a", ASSIGN_A)], protocol_type=CONSUMER, name="roundrobin"), 3)
    [i] = bad.inconsistencies
    assert (i.group_id, i.field, i.expected, i.actual, i.error_code) == (
        "g1", "ProtocolName", "range", "roundrobin", ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    worse = t.on_request(ApiKey.SYNC_GROUP, 5, sync_request(
        5, "m-a", [], protocol_type=CONNECT, name="range"), 4)
    assert [(i.field, i.expected, i.actual) for i in worse.inconsistencies] == [
        ("ProtocolType", CONSUMER, CONNECT)]
    # Null fields (ignorable in v5) are not checked, like the coordinator does.
    assert t.on_request(ApiKey.SYNC_GROUP, 5, sync_request(5, "m-a", [], None, None), 5) \
        .inconsistencies == ()
    assert t.counters.inconsistencies == 2


def test_responses_match_their_requests_by_correlation_or_order() -> None:
    t = GroupProtocolTracker()
    t.on_request(ApiKey.JOIN_GROUP, 5, join_request(5, "a", group="g-a"), 1)
    t.on_request(ApiKey.JOIN_GROUP, 5, join_request(5, "b", group="g-b", protocol_type=CONNECT), 2)
    # Answered by correlation id: the consumer group's answer first.
    r1 = t.on_response(ApiKey.JOIN_GROUP, 5, join_response(5, "a", "a", [("a", RANGE_SUB)]), 1)
    assert r1.payloads[0].group_id == "g-a" and r1.payloads[0].protocol_type == CONSUMER
    connect_md = encode_subscription(CONNECT, 0, {"Url": "http://w:8083", "ConfigOffset": 3})
    r2 = t.on_response(ApiKey.JOIN_GROUP, 5, join_response(
        5, "b", "b", [("b", connect_md)], name="default"))  # no id: oldest unanswered
    [p] = r2.payloads
    assert (p.group_id, p.protocol_type, p.protocol_name, p.path) == (
        "g-b", CONNECT, "default", "connection-memory")
    assert p.payload is not None and p.payload.fields["Url"] == "http://w:8083"
    # A response to a request this tracker never saw matches nothing.
    stray = t.on_response(ApiKey.JOIN_GROUP, 5, join_response(5, "c", "c", [("c", RANGE_SUB)]), 99)
    assert [x.path for x in stray.payloads] == ["unknown"]


def test_bad_payload_bytes_are_reported_not_raised() -> None:
    t = GroupProtocolTracker()
    t.on_request(ApiKey.JOIN_GROUP, 5, join_request(5, "a"), 1)
    r = t.on_response(ApiKey.JOIN_GROUP, 5, join_response(5, "a", "a", [("a", b"\x00\x00\x00")]), 1)
    [p] = r.payloads
    assert p.payload is None and p.error is not None and p.path == "connection-memory"
    assert t.counters.errors == 1
    # An empty SyncGroup assignment (an error answer) yields no payload.
    t.on_request(ApiKey.SYNC_GROUP, 3, sync_request(3, "a", []), 2)
    assert t.on_response(ApiKey.SYNC_GROUP, 3, sync_response(3, b"", None, None), 2).payloads == ()


def test_unrelated_api_keys_are_ignored() -> None:
    t = GroupProtocolTracker()
    assert t.on_request(ApiKey.METADATA, 12, {}, 1) == GroupObservation()
    assert t.on_response(ApiKey.METADATA, 12, {}, 1) == GroupObservation()


# -- the observing filter inside a session ------------------------------------------


def response_frame(correlation_id: int, api_key: int, version: int,
                   body: dict[str, Any]) -> bytes:
    return kw.encode_response(correlation_id, api_key, version, body)


@pytest.mark.parametrize("split", [1, 7, 64, 10_000])
def test_session_observes_requests_and_forwards_every_byte_unchanged(split: int) -> None:
    seen: list[GroupObservation] = []
    observer = GroupProtocolObserver(sink=lambda conn, obs: seen.append(obs))
    session = KafkaSession(ConnectionInfo(connection_id="c1"), [observer])
    requests = b"".join([
        kw.encode_request(kw.RequestHeader(ApiKey.METADATA, 12, 1, "cli"), {"Topics": None}),
        kw.encode_request(kw.RequestHeader(ApiKey.JOIN_GROUP, 5, 2, "cli"), join_request(5, "m-a")),
        kw.encode_request(kw.RequestHeader(ApiKey.SYNC_GROUP, 3, 3, "cli"),
                          sync_request(3, "m-a", [("m-a", ASSIGN_A)])),
    ])
    responses = b"".join([
        response_frame(1, ApiKey.METADATA, 12, {"Brokers": [], "Topics": []}),
        response_frame(2, ApiKey.JOIN_GROUP, 5, join_response(5, "m-a", "m-a", [("m-a", RANGE_SUB)],
                                                       protocol_type=None)),
        response_frame(3, ApiKey.SYNC_GROUP, 3, sync_response(3, ASSIGN_A, None, None)),
    ])
    out_requests = b"".join(session.from_client(requests[i:i + split])
                            for i in range(0, len(requests), split))
    out_responses = b"".join(session.from_broker(responses[i:i + split])
                             for i in range(0, len(responses), split))
    assert out_requests == requests
    assert out_responses == responses
    paths = [(p.api, p.path) for obs in seen for p in obs.payloads]
    assert paths == [
        ("JoinGroupRequest", "message"), ("JoinGroupRequest", "message"),
        ("SyncGroupRequest", "connection-memory"),
        ("JoinGroupResponse", "connection-memory"),
        ("SyncGroupResponse", "connection-memory"),
    ]
    assert all(p.payload is not None for obs in seen for p in obs.payloads)


def test_session_forwards_an_undecodable_observed_request() -> None:
    observer = GroupProtocolObserver()
    session = KafkaSession(ConnectionInfo(), [observer])
    good = kw.encode_request(kw.RequestHeader(ApiKey.JOIN_GROUP, 5, 2, "cli"), join_request(5))
    bad = frame_bytes(good[4:-3])  # its last field cut short: it does not decode
    with pytest.raises(DecodeError):
        kw.decode_request(bad[4:], trailing=True)
    assert session.from_client(bad) == bad
    assert observer.tracker.counters.message == 0


# -- INCONSISTENT_GROUP_PROTOCOL: judged, and answered by the guard ---------------------


def test_conflicts_are_judged_only_against_a_confirmed_group_when_asked() -> None:
    t = GroupProtocolTracker()
    t.on_request(ApiKey.JOIN_GROUP, 7, join_request(7, "m-a"), 1)
    # Only the JoinGroupRequest seen: the group's protocol name is not known yet.
    assert t.conflicts("g1", "m-a", "connect", None, confirmed=True) == ()
    [c] = t.conflicts("g1", "m-a", "connect", None)
    assert (c.field, c.expected, c.actual, c.error_code) == ("ProtocolType", CONSUMER,
                                                             "connect", 23)
    t.on_response(ApiKey.JOIN_GROUP, 7, join_response(7, "m-a", "m-a", []), 1)
    assert [(c.field, c.actual) for c in t.conflicts(
        "g1", "m-a", CONSUMER, "roundrobin", confirmed=True)] == [("ProtocolName", "roundrobin")]
    assert t.conflicts("g1", "m-a", None, None, confirmed=True) == ()  # fields not given
    assert t.conflicts("other", "m-a", "connect", "x") == ()


def test_a_cancelled_request_is_not_matched_to_a_later_response() -> None:
    t = GroupProtocolTracker()
    t.on_request(ApiKey.JOIN_GROUP, 7, join_request(7, "m-a"), 1)
    t.on_response(ApiKey.JOIN_GROUP, 7, join_response(7, "m-a", "m-a", []), 1)
    t.on_request(ApiKey.SYNC_GROUP, 5, sync_request(5, "m-a", [], name="roundrobin"), 2)
    assert t.cancel(ApiKey.SYNC_GROUP, 2) and not t.cancel(ApiKey.SYNC_GROUP, 2)
    t.on_request(ApiKey.SYNC_GROUP, 3, sync_request(3, "m-a", []), 3)
    # Matched by order (no correlation id): must be request 3's, decoded from memory.
    [p] = t.on_response(ApiKey.SYNC_GROUP, 3, sync_response(3, ASSIGN_A, None, None)).payloads
    assert p.path == "connection-memory" and p.payload is not None


def test_guard_answers_an_inconsistent_sync_group_in_the_session() -> None:
    version = 5  # the first SyncGroup carrying ProtocolType/ProtocolName
    observer = GroupProtocolObserver()
    session = KafkaSession(ConnectionInfo(connection_id="c1"), [observer, observer.guard()])
    session.from_client(kw.encode_request(kw.RequestHeader(ApiKey.JOIN_GROUP, 7, 1, "cli"),
                                          join_request(7, "m-a")))
    session.from_broker(response_frame(1, ApiKey.JOIN_GROUP, 7,
                                       join_response(7, "m-a", "m-a", [("m-a", RANGE_SUB)])))
    bad = kw.encode_request(kw.RequestHeader(ApiKey.SYNC_GROUP, version, 2, "cli"),
                            sync_request(version, "m-a", [], protocol_type="connect"))
    assert session.from_client(bad) == b""  # never forwarded
    _, answer = kw.decode_response(session.take_client_bytes()[4:], ApiKey.SYNC_GROUP, version)
    assert answer["ErrorCode"] == 23
    good = kw.encode_request(kw.RequestHeader(ApiKey.SYNC_GROUP, version, 3, "cli"),
                             sync_request(version, "m-a", [("m-a", ASSIGN_A)]))
    assert session.from_client(good) == good
    assert not observer.guard().wants(ApiKey.SYNC_GROUP, 4, "request")

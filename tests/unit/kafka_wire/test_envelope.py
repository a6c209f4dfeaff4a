"""KIP-590 envelopes: forwarded requests with their principal and client address."""

from __future__ import annotations

import contextlib
import ipaddress
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kafka_wire as kw
from kafka_wire import ApiKey
from kafka_wire.envelope import (
    Principal,
    decode_client_address,
    decode_envelope_request,
    decode_envelope_response,
    decode_principal,
    encode_client_address,
    encode_principal,
    envelope_request_body,
    envelope_response_body,
    read_envelope_request,
    read_envelope_response,
)
from kafka_wire.errors import DecodeError, EncodeError, KafkaWireError

CREATE_BODY: dict[str, Any] = {
    "Topics": [
        {"Name": "orders", "NumPartitions": 3, "ReplicationFactor": 1,
         "Assignments": [], "Configs": [{"Name": "cleanup.policy", "Value": "compact"}]},
    ],
    "timeoutMs": 30000,
    "validateOnly": False,
}


def envelope_frame(inner: kw.RequestHeader, body: dict[str, Any], principal: Any,
                   address: str, correlation_id: int = 900) -> bytes:
    outer = kw.RequestHeader(ApiKey.ENVELOPE, 0, correlation_id, "broker-2")
    return kw.encode_request(outer, envelope_request_body(inner, body, principal, address))[4:]


def test_principal_bytes_match_kafkas_default_principal_builder() -> None:
    # int16 version 0 | compact string Type | compact string Name | bool | empty tags
    expected = b"\x00\x00" + b"\x05User" + b"\x06alice" + b"\x01" + b"\x00"
    principal = Principal("User", "alice", token_authenticated=True)
    assert encode_principal(principal) == expected
    assert decode_principal(expected) == principal
    assert str(principal) == "User:alice"


@pytest.mark.parametrize("bad", [b"", b"\x00", b"\x00\x01" + b"\x05User\x06alice\x00\x00",
                                 b"\x00\x00\x05User", b"\x00\x00\x05User\x06alice\x00\x00xx"])
def test_bad_principal_bytes(bad: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_principal(bad)


@pytest.mark.parametrize("address", ["10.1.2.3", "::1", "2001:db8::7"])
def test_client_addresses(address: str) -> None:
    raw = encode_client_address(address)
    assert len(raw) in (4, 16)
    assert decode_client_address(raw) == ipaddress.ip_address(address)


def test_bad_client_addresses() -> None:
    with pytest.raises(DecodeError, match="5 bytes"):
        decode_client_address(b"\x01\x02\x03\x04\x05")
    with pytest.raises(EncodeError):
        encode_client_address("not-an-ip")


def test_forwarded_create_topics_request() -> None:
    inner = kw.RequestHeader(ApiKey.CREATE_TOPICS, 7, 42, "adminclient-1")
    frame = envelope_frame(inner, CREATE_BODY, Principal("User", "alice"), "192.168.7.9")
    outer, forwarded = decode_envelope_request(frame)
    assert (outer.api_key, outer.api_version, outer.client_id) == (ApiKey.ENVELOPE, 0, "broker-2")
    assert forwarded.header == inner
    assert (
        forwarded.body
        == kw.decode_body(
            ApiKey.CREATE_TOPICS,
            7,
            "request",
            kw.encode_body(ApiKey.CREATE_TOPICS, 7, "request", CREATE_BODY),
        )[0]
    )
    assert forwarded.body["Topics"][0]["Name"] == "orders"
    assert forwarded.principal == Principal("User", "alice", False)
    assert forwarded.principal_error is None
    assert forwarded.client_address == ipaddress.IPv4Address("192.168.7.9")
    # The envelope body round-trips byte-exactly through the codec.
    body, _ = kw.decode_body(ApiKey.ENVELOPE, 0, "request", frame, kw.read_request_header(frame)[1])
    again = kw.encode_request(outer, body)[4:]
    assert again == frame


def test_forwarded_request_with_a_custom_or_null_principal() -> None:
    inner = kw.RequestHeader(ApiKey.ALTER_CONFIGS, 2, 5, None)
    body = {"Resources": [{"ResourceType": 2, "ResourceName": "orders",
                           "Configs": [{"Name": "retention.ms", "Value": "1000"}]}],
            "ValidateOnly": False}
    custom = envelope_frame(inner, body, b"my-serde:bob", "::1")
    _, fwd = decode_envelope_request(custom)
    assert fwd.principal is None and fwd.principal_bytes == b"my-serde:bob"
    assert fwd.principal_error is not None
    assert fwd.client_address == ipaddress.IPv6Address("::1")
    assert fwd.header.client_id is None
    _, null = decode_envelope_request(envelope_frame(inner, body, None, "127.0.0.1"))
    assert null.principal is None and null.principal_bytes is None and null.principal_error is None


def test_forwarded_response() -> None:
    inner = kw.RequestHeader(ApiKey.CREATE_TOPICS, 7, 42, "adminclient-1")
    answer = {"ThrottleTimeMs": 0, "Topics": [
        {"Name": "orders", "ErrorCode": 36, "ErrorMessage": "exists", "NumPartitions": 3,
         "ReplicationFactor": 1, "Configs": None}]}
    frame = kw.encode_response(900, ApiKey.ENVELOPE, 0, envelope_response_body(inner, answer))[4:]
    correlation_id, fwd = decode_envelope_response(frame, 0, inner)
    assert correlation_id == 900
    assert (fwd.error_code, fwd.correlation_id) == (0, 42)
    assert fwd.body is not None and fwd.body["Topics"][0]["ErrorMessage"] == "exists"
    # An envelope-level error carries no inner response (NOT_CONTROLLER = 41).
    failed = kw.encode_response(901, ApiKey.ENVELOPE, 0, envelope_response_body(inner, None, 41))[
        4:
    ]
    assert decode_envelope_response(failed, 0, inner)[1] == read_envelope_response(
        {"ResponseData": None, "ErrorCode": 41}, inner)
    assert decode_envelope_response(failed, 0, inner)[1].body is None


def test_envelope_errors() -> None:
    inner = kw.RequestHeader(ApiKey.CREATE_TOPICS, 7, 42, "adminclient-1")
    not_envelope = kw.encode_request(inner, CREATE_BODY)[4:]
    with pytest.raises(DecodeError, match="not an EnvelopeRequest"):
        decode_envelope_request(not_envelope)
    body = envelope_request_body(inner, CREATE_BODY, None, "10.0.0.1")
    with pytest.raises(DecodeError):  # the inner request is cut short
        read_envelope_request({**body, "RequestData": body["RequestData"][:-2]})
    with pytest.raises(DecodeError):  # an api key the schema set lacks
        read_envelope_request({**body, "RequestData": struct.pack(">hhih", 999, 0, 1, -1)})
    with pytest.raises(DecodeError, match="3 bytes"):
        read_envelope_request({**body, "ClientHostAddress": b"\x01\x02\x03"})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_random_envelope_bytes_raise_only_decode_errors(data: bytes) -> None:
    inner = kw.RequestHeader(ApiKey.CREATE_TOPICS, 7, 42, "x")
    for attempt in (
        lambda: decode_envelope_request(data),
        lambda: decode_envelope_response(data, 0, inner),
        lambda: decode_principal(data),
        lambda: read_envelope_request(
            {"RequestData": data, "RequestPrincipal": data, "ClientHostAddress": bytes(4)}),
    ):
        with contextlib.suppress(KafkaWireError):
            attempt()

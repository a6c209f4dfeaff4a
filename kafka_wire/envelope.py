"""Envelope (KIP-590, API key 58): a request forwarded by a broker, with who sent it.

A broker that receives an admin write request it cannot serve forwards it to the
controller wrapped in an EnvelopeRequest:

    RequestData        bytes   the client's request: header + body, no size prefix
    RequestPrincipal   bytes   the client's principal, serialized by the broker's
                               KafkaPrincipalSerde; Kafka's DefaultKafkaPrincipalBuilder
                               writes int16 version | DefaultPrincipalData (flexible):
                               Type, Name, TokenAuthenticated
    ClientHostAddress  bytes   the client's IP address, 4 (IPv4) or 16 (IPv6) bytes

The EnvelopeResponse carries ResponseData (the inner response: header + body, no size
prefix, null on an envelope-level error) and the envelope's ErrorCode. A response
carries no API key, so reading the inner response needs the inner request's header.

The principal's format is pluggable in Kafka (a custom KafkaPrincipalSerde): bytes that
are not DefaultPrincipalData are kept raw and reported, never fatal.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Any

from kafka_wire.codec import (
    Buffer,
    RequestHeader,
    decode_body,
    decode_request,
    decode_response,
    decode_struct,
    encode_request,
    encode_response,
    encode_struct,
    read_request_header,
)
from kafka_wire.enums import ApiKey
from kafka_wire.errors import DecodeError, EncodeError, KafkaWireError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

PRINCIPAL_SCHEMA = "DefaultPrincipalData"
PRINCIPAL_VERSION = 0
_I16 = struct.Struct(">h")


@dataclass(frozen=True, slots=True)
class Principal:
    """A KafkaPrincipal as DefaultKafkaPrincipalBuilder serializes it."""

    type: str
    name: str
    token_authenticated: bool = False

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """The contents of an EnvelopeRequest."""

    header: RequestHeader  # the inner request's own header
    body: dict[str, Any]  # the inner request's body
    principal: Principal | None  # None when absent or not in the default format
    principal_bytes: bytes | None  # RequestPrincipal as sent (None when null)
    principal_error: str | None  # why principal_bytes did not decode, if they did not
    client_address: IPAddress


@dataclass(frozen=True, slots=True)
class ForwardedResponse:
    """The contents of an EnvelopeResponse."""

    error_code: int  # the envelope's own error (0, or e.g. NOT_CONTROLLER)
    correlation_id: int | None  # the inner response's, None without ResponseData
    body: dict[str, Any] | None  # the inner response's body, None without ResponseData


# -- principal and address ----------------------------------------------------------


def decode_principal(data: Buffer) -> Principal:
    """DefaultKafkaPrincipalBuilder.deserialize: int16 version | DefaultPrincipalData."""
    if len(data) < 2:
        raise DecodeError(f"principal: {len(data)} bytes, no version")
    (version,) = _I16.unpack_from(data, 0)
    if version != PRINCIPAL_VERSION:
        raise DecodeError(f"principal: invalid principal data version {version}")
    value, end = decode_struct(PRINCIPAL_SCHEMA, version, data, 2)
    if end != len(data):
        raise DecodeError(f"principal: {len(data) - end} trailing bytes")
    return Principal(value["Type"], value["Name"], value["TokenAuthenticated"])


def encode_principal(principal: Principal) -> bytes:
    value = {
        "Type": principal.type,
        "Name": principal.name,
        "TokenAuthenticated": principal.token_authenticated,
    }
    return _I16.pack(PRINCIPAL_VERSION) + encode_struct(PRINCIPAL_SCHEMA, PRINCIPAL_VERSION, value)


def decode_client_address(data: Buffer) -> IPAddress:
    raw = bytes(data)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw)
    if len(raw) == 16:
        return ipaddress.IPv6Address(raw)
    raise DecodeError(f"client host address of {len(raw)} bytes (expected 4 or 16)")


def encode_client_address(address: IPAddress | str) -> bytes:
    try:
        return ipaddress.ip_address(address).packed
    except ValueError as exc:
        raise EncodeError(f"client host address: {exc}") from exc


# -- EnvelopeRequest ------------------------------------------------------------------


def read_envelope_request(body: dict[str, Any]) -> ForwardedRequest:
    """Open a decoded EnvelopeRequest body (as `decode_body(58, 0, "request", ...)` gives)."""
    header, inner = decode_request(body["RequestData"])
    raw = body["RequestPrincipal"]
    principal_bytes = None if raw is None else bytes(raw)
    principal: Principal | None = None
    principal_error: str | None = None
    if principal_bytes is not None:
        try:
            principal = decode_principal(principal_bytes)
        except KafkaWireError as exc:
            principal_error = str(exc)
    return ForwardedRequest(
        header=header,
        body=inner,
        principal=principal,
        principal_bytes=principal_bytes,
        principal_error=principal_error,
        client_address=decode_client_address(body["ClientHostAddress"]),
    )


def decode_envelope_request(frame: Buffer) -> tuple[RequestHeader, ForwardedRequest]:
    """A whole EnvelopeRequest frame (no size prefix) -> (outer header, its contents)."""
    header, off = read_request_header(frame)
    if header.api_key != ApiKey.ENVELOPE:
        raise DecodeError(f"api key {header.api_key} is not an EnvelopeRequest")
    body, end = decode_body(ApiKey.ENVELOPE, header.api_version, "request", frame, off)
    if end != len(frame):
        raise DecodeError(f"EnvelopeRequest: {len(frame) - end} trailing bytes")
    return header, read_envelope_request(body)


def envelope_request_body(
    inner_header: RequestHeader,
    inner_body: dict[str, Any],
    principal: Principal | bytes | None,
    client_address: IPAddress | str,
) -> dict[str, Any]:
    """The EnvelopeRequest body forwarding `inner_*` (encode it with encode_request)."""
    principal_bytes = encode_principal(principal) if isinstance(principal, Principal) else principal
    return {
        "RequestData": encode_request(inner_header, inner_body)[4:],
        "RequestPrincipal": principal_bytes,
        "ClientHostAddress": encode_client_address(client_address),
    }


# -- EnvelopeResponse -----------------------------------------------------------------


def read_envelope_response(body: dict[str, Any], inner: RequestHeader) -> ForwardedResponse:
    """Open a decoded EnvelopeResponse body; `inner` is the forwarded request's header."""
    data = body["ResponseData"]
    if data is None:
        return ForwardedResponse(body["ErrorCode"], None, None)
    correlation_id, inner_body = decode_response(data, inner.api_key, inner.api_version)
    return ForwardedResponse(body["ErrorCode"], correlation_id, inner_body)


def decode_envelope_response(
    frame: Buffer, envelope_version: int, inner: RequestHeader
) -> tuple[int, ForwardedResponse]:
    """A whole EnvelopeResponse frame (no size prefix) -> (outer correlation id, contents)."""
    correlation_id, body = decode_response(frame, ApiKey.ENVELOPE, envelope_version)
    return correlation_id, read_envelope_response(body, inner)


def envelope_response_body(
    inner: RequestHeader, inner_body: dict[str, Any] | None, error_code: int = 0
) -> dict[str, Any]:
    """The EnvelopeResponse body answering the forwarded request `inner` with `inner_body`."""
    data = None
    if inner_body is not None:
        data = encode_response(inner.correlation_id, inner.api_key, inner.api_version, inner_body)
        data = data[4:]
    return {"ResponseData": data, "ErrorCode": error_code}


__all__ = [
    "PRINCIPAL_SCHEMA",
    "ForwardedRequest",
    "ForwardedResponse",
    "IPAddress",
    "Principal",
    "decode_client_address",
    "decode_envelope_request",
    "decode_envelope_response",
    "decode_principal",
    "encode_client_address",
    "encode_principal",
    "envelope_request_body",
    "envelope_response_body",
    "read_envelope_request",
    "read_envelope_response",
]

"""The Kafka message codec: schema-driven, sans-IO, byte-exact.

Values are plain dicts keyed by the schema's field names ("Brokers", "NodeId"):

- struct arrays are lists of dicts, primitive arrays lists; nullable null is None;
- string -> str, bytes -> bytes, uuid -> uuid.UUID (16 bytes accepted on encode),
  records -> memoryview (zero-copy over an immutable bytes buffer, else a copy);
- a struct holds exactly the fields of its version; absent tagged fields hold their
  default; tags the schema does not know are kept as {tag: bytes} under
  "_unknown_tags" and written back in tag order;
- on encode a missing field takes its schema default.

Decoding raises only DecodeError (UnknownApiError, a subclass, for what the schema set
lacks); encoding raises only EncodeError (or UnknownApiError).

Byte-exactness holds for canonical encodings, the ones every Kafka implementation
writes: bools as 0/1, shortest varints, tagged fields in tag order, and a known tagged
field only when it is not at its default (Kafka's writers all follow this).
"""

from __future__ import annotations

import struct
from typing import Any

from kafka_wire import _catalog
from kafka_wire._catalog import (
    api_name,
    known_api_keys,
    request_header_version,
    response_header_version,
    supported_versions,
)
from kafka_wire._codegen import StructReader, StructWriter
from kafka_wire._header import (
    RequestHeader,
    read_request_header,
    read_response_header,
    write_request_header,
    write_request_header_into,
    write_response_header,
    write_response_header_into,
)
from kafka_wire._prims import UNKNOWN_TAGS, Buffer
from kafka_wire.errors import DecodeError, EncodeError

_INT32 = struct.Struct(">i")

# What malformed input can raise inside a generated reader or writer.
_DECODE_FAILURES = (struct.error, IndexError, ValueError, OverflowError)
_ENCODE_FAILURES = (struct.error, TypeError, AttributeError, ValueError, OverflowError, KeyError)


def _as_buffer(buf: Buffer) -> Buffer:
    if isinstance(buf, memoryview) and (buf.format != "B" or buf.ndim != 1):
        return buf.cast("B")
    return buf


# `where` names the message in error text; it is a tuple formatted only on failure.
Where = tuple[Any, ...]


def _describe(where: Where) -> str:
    if len(where) == 3:
        api_key, api_version, kind = where
        return f"{api_name(api_key) or api_key} {kind} v{api_version}"
    return f"{where[0]} v{where[1]}"


def _read(
    reader: StructReader, buf: Buffer, offset: int, where: Where
) -> tuple[dict[str, Any], int]:
    buf = _as_buffer(buf)
    if not 0 <= offset <= len(buf):
        raise DecodeError(f"{_describe(where)}: offset {offset} outside {len(buf)} bytes")
    try:
        value, off = reader(buf, offset)
    except DecodeError:
        raise
    except _DECODE_FAILURES as exc:
        raise DecodeError(f"{_describe(where)}: {exc}") from exc
    if off > len(buf):
        raise DecodeError(f"{_describe(where)}: truncated ({off - len(buf)} bytes missing)")
    return value, off


def _write(writer: StructWriter, out: bytearray, value: Any, where: Where) -> None:
    try:
        writer(out, value)
    except EncodeError:
        raise
    except _ENCODE_FAILURES as exc:
        raise EncodeError(f"{_describe(where)}: {exc}") from exc


def _trailing(where: Where, extra: int) -> DecodeError:
    return DecodeError(f"{_describe(where)}: {extra} trailing bytes")


def decode_body(
    api_key: int, api_version: int, kind: str, buf: Buffer, offset: int = 0
) -> tuple[dict[str, Any], int]:
    """Decode a request or response body at `offset`; returns (value, offset after it)."""
    reader = _catalog.reader_for(api_key, api_version, kind)
    return _read(reader, buf, offset, (api_key, api_version, kind))


def encode_body(api_key: int, api_version: int, kind: str, value: dict[str, Any]) -> bytes:
    """Encode a request or response body; fields missing from `value` take their default."""
    writer = _catalog.writer_for(api_key, api_version, kind)
    out = bytearray()
    _write(writer, out, value, (api_key, api_version, kind))
    return bytes(out)


def decode_struct(
    name: str, version: int, buf: Buffer, offset: int = 0
) -> tuple[dict[str, Any], int]:
    """Decode any schema by name, e.g. "ConsumerProtocolSubscription" (the int16 version
    prefix that consumer-protocol bytes carry is not part of the struct: read it first)."""
    return _read(_catalog.named_reader(name, version), buf, offset, (name, version))


def encode_struct(name: str, version: int, value: dict[str, Any]) -> bytes:
    out = bytearray()
    _write(_catalog.named_writer(name, version), out, value, (name, version))
    return bytes(out)


def decode_request(
    frame: Buffer, *, trailing: bool = False
) -> tuple[RequestHeader, dict[str, Any]]:
    """Decode a whole request frame WITHOUT its 4-byte size prefix (as framing yields it).

    Bytes after the body are an error unless `trailing`: Kafka's broker ignores them,
    and some clients send them (librdkafka 2.16 after a Metadata v13 request), so a
    proxy must accept what the broker accepts.
    """
    header, off = read_request_header(frame)
    body, end = decode_body(header.api_key, header.api_version, "request", frame, off)
    if end != len(frame) and not trailing:
        raise _trailing((header.api_key, header.api_version, "request"), len(frame) - end)
    return header, body


def decode_response(frame: Buffer, api_key: int, api_version: int) -> tuple[int, dict[str, Any]]:
    """Decode a whole response frame WITHOUT its size prefix; returns (correlation id, body).

    An ApiVersionsResponse answering an unsupported version is written at v0 by the
    broker whatever was asked: on DecodeError, callers retry with version 0 as Kafka does.
    """
    correlation_id, _tags, off = read_response_header(frame, api_key, api_version)
    body, end = decode_body(api_key, api_version, "response", frame, off)
    if end != len(frame):
        raise _trailing((api_key, api_version, "response"), len(frame) - end)
    return correlation_id, body


def encode_request(header: RequestHeader, body: dict[str, Any]) -> bytes:
    """The whole request frame WITH its 4-byte size prefix, ready for the wire."""
    writer = _catalog.writer_for(header.api_key, header.api_version, "request")
    out = bytearray(4)
    write_request_header_into(out, header)
    _write(writer, out, body, (header.api_key, header.api_version, "request"))
    _INT32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def encode_response(
    correlation_id: int,
    api_key: int,
    api_version: int,
    body: dict[str, Any],
    tagged: dict[int, bytes] | None = None,
) -> bytes:
    """The whole response frame WITH its 4-byte size prefix, ready for the wire."""
    writer = _catalog.writer_for(api_key, api_version, "response")
    out = bytearray(4)
    write_response_header_into(out, correlation_id, api_key, api_version, tagged)
    _write(writer, out, body, (api_key, api_version, "response"))
    _INT32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


__all__ = [
    "UNKNOWN_TAGS",
    "Buffer",
    "RequestHeader",
    "api_name",
    "decode_body",
    "decode_request",
    "decode_response",
    "decode_struct",
    "encode_body",
    "encode_request",
    "encode_response",
    "encode_struct",
    "known_api_keys",
    "read_request_header",
    "read_response_header",
    "request_header_version",
    "response_header_version",
    "supported_versions",
    "write_request_header",
    "write_response_header",
]

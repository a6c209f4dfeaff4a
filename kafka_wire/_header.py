"""Request and response headers, written by hand: they are read on every held frame.

RequestHeader v0:  int16 api_key | int16 api_version | int32 correlation_id
RequestHeader v1:  v0 | client_id (nullable string, int16 length, even when flexible)
RequestHeader v2:  v1 | tagged fields
ResponseHeader v0: int32 correlation_id
ResponseHeader v1: v0 | tagged fields
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from kafka_wire import _prims
from kafka_wire._catalog import request_header_version, response_header_version
from kafka_wire._prims import Buffer
from kafka_wire.errors import DecodeError, EncodeError

_REQUEST_FIXED = struct.Struct(">hhi")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    tagged: dict[int, bytes] = field(default_factory=dict)


def read_request_header(buf: Buffer, offset: int = 0) -> tuple[RequestHeader, int]:
    """Read the header of a request frame (without its size prefix); returns the body offset."""
    try:
        api_key, api_version, correlation_id = _REQUEST_FIXED.unpack_from(buf, offset)
        hv = request_header_version(api_key, api_version)
        off = offset + 8
        client_id = None
        tagged: dict[int, bytes] = {}
        if hv >= 1:
            (n,) = _INT16.unpack_from(buf, off)
            off += 2
            if n >= 0:
                client_id = str(buf[off : off + n], "utf-8")
                off += n
            elif n != -1:
                raise DecodeError(f"request header: client id length {n}")
        if hv >= 2:
            tagged, off = _prims.read_raw_tags(buf, off)
    except DecodeError:
        raise
    except (struct.error, IndexError, ValueError, OverflowError) as exc:
        raise DecodeError(f"request header: {exc}") from exc
    if off > len(buf):
        raise DecodeError("request header: truncated")
    return RequestHeader(api_key, api_version, correlation_id, client_id, tagged), off


def write_request_header(h: RequestHeader) -> bytes:
    out = bytearray()
    write_request_header_into(out, h)
    return bytes(out)


def write_request_header_into(out: bytearray, h: RequestHeader) -> None:
    hv = request_header_version(h.api_key, h.api_version)
    try:
        out += _REQUEST_FIXED.pack(h.api_key, h.api_version, h.correlation_id)
        if hv >= 1:
            if h.client_id is None:
                out += b"\xff\xff"
            else:
                raw = h.client_id.encode("utf-8")
                out += _INT16.pack(len(raw))
                out += raw
        if hv >= 2:
            _prims.write_tags(out, None, h.tagged)
        elif h.tagged:
            raise EncodeError(f"request header v{hv} has no tagged fields ({h.tagged!r})")
    except EncodeError:
        raise
    except (struct.error, TypeError, AttributeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"request header: {exc}") from exc


def read_response_header(
    buf: Buffer, api_key: int, api_version: int, offset: int = 0
) -> tuple[int, dict[int, bytes], int]:
    """(correlation_id, tagged fields, body offset) of a response frame without its size."""
    hv = response_header_version(api_key, api_version)
    try:
        (correlation_id,) = _INT32.unpack_from(buf, offset)
        off = offset + 4
        tagged: dict[int, bytes] = {}
        if hv >= 1:
            tagged, off = _prims.read_raw_tags(buf, off)
    except DecodeError:
        raise
    except (struct.error, IndexError, ValueError, OverflowError) as exc:
        raise DecodeError(f"response header: {exc}") from exc
    if off > len(buf):
        raise DecodeError("response header: truncated")
    return correlation_id, tagged, off


def write_response_header(
    correlation_id: int, api_key: int, api_version: int, tagged: dict[int, bytes] | None = None
) -> bytes:
    out = bytearray()
    write_response_header_into(out, correlation_id, api_key, api_version, tagged)
    return bytes(out)


def write_response_header_into(
    out: bytearray,
    correlation_id: int,
    api_key: int,
    api_version: int,
    tagged: dict[int, bytes] | None = None,
) -> None:
    hv = response_header_version(api_key, api_version)
    try:
        out += _INT32.pack(correlation_id)
        if hv >= 1:
            _prims.write_tags(out, None, tagged)
        elif tagged:
            raise EncodeError(f"response header v0 has no tagged fields ({tagged!r})")
    except EncodeError:
        raise
    except (struct.error, TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"response header: {exc}") from exc

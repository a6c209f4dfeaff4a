"""Runtime helpers the generated readers and writers call: varints, tag sections, arrays.

Buffers are bytes, bytearray or a byte-format memoryview. Readers do not check bounds
on every slice: a short slice only pushes the offset past the end, which the public
entry points turn into a DecodeError. Array counts are checked against the bytes left,
so a hostile count never allocates.
"""

from __future__ import annotations

import struct
import sys
import uuid
from array import array
from collections.abc import Callable, Mapping
from itertools import pairwise
from operator import itemgetter
from typing import Any

from kafka_wire.errors import DecodeError, EncodeError

Buffer = bytes | bytearray | memoryview
Reader = Callable[[Any, int], tuple[Any, int]]

# The key of a decoded struct's unknown tagged fields, {tag: raw bytes}.
UNKNOWN_TAGS = "_unknown_tags"

INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
ZERO_UUID = uuid.UUID(int=0)
_ZERO16 = bytes(16)

# Single-byte unsigned varints, the common case for lengths, counts and tags.
UV1: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(128))


def read_uvarint(buf: Any, off: int, first: int) -> tuple[int, int]:
    """Finish an unsigned varint whose first byte `first` (high bit set) was read."""
    result = first & 0x7F
    shift = 7
    while True:
        b = buf[off]
        off += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, off
        shift += 7
        if shift > 28:
            raise DecodeError("unsigned varint longer than 5 bytes")


def uvarint(n: int) -> bytes:
    if n < 0x80:
        if n < 0:
            raise EncodeError(f"unsigned varint cannot hold {n}")
        return UV1[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def to_uuid(raw: bytes) -> uuid.UUID:
    return ZERO_UUID if raw == _ZERO16 else uuid.UUID(bytes=raw)


def uuid_bytes(value: Any) -> bytes:
    if isinstance(value, uuid.UUID):
        return value.bytes
    raw = bytes(value)
    if len(raw) != 16:
        raise EncodeError(f"a uuid needs 16 bytes, got {len(raw)}")
    return raw


def records_slice(buf: Any, start: int, end: int) -> memoryview:
    """A view of the records bytes: zero-copy over immutable bytes, a copy otherwise.

    A view into a bytearray would pin it (it could no longer be resized by a framing
    buffer) for as long as the decoded message lives.
    """
    if type(buf) is bytes:
        return memoryview(buf)[start:end]
    if type(buf) is memoryview and type(buf.obj) is bytes:
        return buf[start:end]
    return memoryview(bytes(buf[start:end]))


# Fixed-size primitive arrays: a Struct for short ones (cached), array.array for long ones.
_SIZES = {"b": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "d": 8, "?": 1}
_SHORT = 64
_struct_cache: dict[tuple[str, int], struct.Struct] = {}
_SWAP = sys.byteorder == "little"
_ARRAY_CODES = {"b": "b", "h": "h", "H": "H", "i": "i", "I": "I", "q": "q", "d": "d"}


def _array_struct(code: str, n: int) -> struct.Struct:
    s = _struct_cache.get((code, n))
    if s is None:
        s = _struct_cache[(code, n)] = struct.Struct(f">{n}{code}")
    return s


SHORT_ARRAY = 16
_short_arrays: dict[str, tuple[struct.Struct, ...]] = {}


def short_array_structs(code: str) -> tuple[struct.Struct, ...]:
    """Struct(">{n}{code}") for n < SHORT_ARRAY, indexed by n."""
    table = _short_arrays.get(code)
    if table is None:
        table = _short_arrays[code] = tuple(
            struct.Struct(f">{n}{code}") for n in range(SHORT_ARRAY)
        )
    return table


def read_fixed_array(buf: Any, off: int, n: int, code: str) -> list[Any]:
    if n <= _SHORT or code not in _ARRAY_CODES:
        return list(_array_struct(code, n).unpack_from(buf, off))
    size = _SIZES[code]
    a = array(_ARRAY_CODES[code])
    if a.itemsize != size:  # pragma: no cover - C int sizes of exotic platforms
        return list(_array_struct(code, n).unpack_from(buf, off))
    a.frombytes(buf[off : off + n * size])
    if len(a) != n:
        raise DecodeError("array runs past the end of the message")
    if _SWAP:
        a.byteswap()
    return a.tolist()


def pack_fixed_array(code: str, values: Any) -> bytes:
    return _array_struct(code, len(values)).pack(*values)


def read_tags(
    buf: Any,
    off: int,
    count: int,
    d: dict[str, Any],
    known: Mapping[int, tuple[str, Reader]] | None,
) -> int:
    """Read `count` tagged fields into `d`; unknown ones land in d["_unknown_tags"]."""
    unknown: dict[int, bytes] | None = None
    for _ in range(count):
        tag = buf[off]
        off += 1
        if tag & 0x80:
            tag, off = read_uvarint(buf, off, tag)
        size = buf[off]
        off += 1
        if size & 0x80:
            size, off = read_uvarint(buf, off, size)
        end = off + size
        entry = None if known is None else known.get(tag)
        if entry is None:
            if unknown is None:
                unknown = d.setdefault(UNKNOWN_TAGS, {})
            unknown[tag] = bytes(buf[off:end])
        else:
            value, used = entry[1](buf, off)
            if used != end:
                raise DecodeError(f"tagged field {entry[0]} (tag {tag}) has a wrong size")
            d[entry[0]] = value
        off = end
    return off


def read_raw_tags(buf: Any, off: int) -> tuple[dict[int, bytes], int]:
    """A tag section kept as raw bytes (headers have no known tagged fields)."""
    count = buf[off]
    off += 1
    if count & 0x80:
        count, off = read_uvarint(buf, off, count)
    if not count:
        return {}, off
    d: dict[str, Any] = {}
    off = read_tags(buf, off, count, d, None)
    tags: dict[int, bytes] = d[UNKNOWN_TAGS]
    return tags, off


def write_tags(
    out: bytearray,
    known: list[tuple[int, bytes | bytearray]] | None,
    unknown: Mapping[int, Any] | None,
    reserved: frozenset[int] = frozenset(),
) -> None:
    """Write a tag section: known (already in tag order) merged with unknown, by tag.

    `reserved` are the tags the schema knows at this version: they cannot be unknown.
    """
    items: list[tuple[int, Any]] = list(known) if known else []
    if unknown:
        for tag in unknown:
            if type(tag) is not int or tag < 0:
                raise EncodeError(f"tag {tag!r} is not a non-negative int")
            if tag in reserved:
                raise EncodeError(f"tag {tag} of _unknown_tags is a known field of the schema")
        items.extend(unknown.items())
        items.sort(key=itemgetter(0))
        for a, b in pairwise(items):
            if a[0] == b[0]:  # pragma: no cover - reserved tags are refused above
                raise EncodeError(f"tag {a[0]} appears twice")
    out += uvarint(len(items))
    for tag, data in items:
        out += uvarint(tag)
        out += uvarint(len(data))
        out += data

"""Walk a flexible response as its bytes stream past, to find its top-level tagged fields.

Some answers carry what a proxy must change only in a top-level tagged field, after
everything else: KIP-951's `NodeEndpoints` (broker addresses) at the end of Produce
v10+ and Fetch v16+ responses, after all their records. Holding a whole Fetch response
to look there costs its latency and its size in memory. A `TagScanner` instead follows
the response's structure as its chunks pass, reading only lengths and counts (a
record set is skipped by its length, never read), and reports the position of each
top-level tag it was asked about. The caller changes that one byte before the chunk
goes on; the frame's size stays the same.

The walk is compiled once per (api key, version) from the schema: fixed-size fields,
compact strings and byte arrays, compact arrays of structs, and every struct's tagged
section (known or not). Sans-IO: `feed(chunk)` may be called with any split.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from kafka_wire._catalog import message_file, response_header_version
from kafka_wire._schema import FieldSpec, StructSpec, in_versions
from kafka_wire.errors import DecodeError

_FIXED: Final = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
                 "int64": 8, "float64": 8, "uuid": 16}
_BLOBS: Final = frozenset({"string", "bytes", "records"})

# A walk: ops in order. ("fixed", n) | ("blob",) | ("array", walk) | ("struct", walk,
# nullable) | ("tags",): a struct's tagged section.
Op = tuple[object, ...]
Walk = tuple[Op, ...]
# What the walk needs next: a byte to read, or bytes to skip.
_Step = Generator[None, None, None]


@lru_cache(maxsize=256)
def _walk_of(api_key: int, version: int) -> Walk:
    spec = message_file(api_key, version, "response").spec()
    if not in_versions(version, spec.flexible):
        raise DecodeError(f"api key {api_key} v{version} responses are not flexible")
    return _compile(spec.struct, version)


def _compile(struct: StructSpec, version: int) -> Walk:
    ops: list[Op] = []
    for f in struct.fields:
        if not f.present(version) or f.is_tagged(version):
            continue
        ops.append(_field(f, version))
    ops.append(("tags",))
    return tuple(ops)


def _field(f: FieldSpec, version: int) -> Op:
    elem = f.elem_type
    if f.is_array:
        if elem in _FIXED:
            return ("array", (("fixed", _FIXED[elem]),))
        if elem in _BLOBS:
            return ("array", (("blob",),))
        assert f.struct is not None
        return ("array", _compile(f.struct, version))
    if elem in _FIXED:
        return ("fixed", _FIXED[elem])
    if elem in _BLOBS:
        return ("blob",)
    assert f.struct is not None
    return ("struct", _compile(f.struct, version), in_versions(version, f.nullable))


def top_level_tag(api_key: int, version: int, field: str) -> int | None:
    """The tag of a top-level tagged field at this response version, None if absent."""
    spec = message_file(api_key, version, "response").spec()
    for f in spec.struct.fields:
        if f.name == field and f.present(version) and f.is_tagged(version):
            return f.tag
    return None


@dataclass(slots=True)
class _Cursor:
    """The chunk being walked: the walk reads `data[pos]` or moves `pos` on."""

    data: memoryview
    pos: int = 0
    base: int = 0  # the frame offset of data[0]


class TagScanner:
    """Finds the frame offsets of the top-level tags `wanted` in one response frame.

    Feed the frame's bytes after its size prefix, in order, in any pieces; `found` lists
    (frame offset of the tag's byte, tag, frame offset of its data, data size) as they are
    found. A frame that does not follow its schema stops the walk (`broken`): nothing
    more is reported.
    """

    def __init__(self, api_key: int, version: int, wanted: frozenset[int]) -> None:
        self._walk = _walk_of(api_key, version)
        self._header_tags = response_header_version(api_key, version) >= 1
        self._wanted = wanted
        self.found: list[tuple[int, int, int, int]] = []
        self.done = False
        self.broken = False
        self._cursor = _Cursor(memoryview(b""))
        self._steps = self._frame()
        next(self._steps)  # to its first need of bytes

    def feed(self, chunk: memoryview | bytes, base: int) -> None:
        """The next bytes of the frame; `base` is the frame offset of chunk[0]."""
        if self.done or self.broken:
            return
        self._cursor = _Cursor(memoryview(chunk), 0, base)
        try:
            self._steps.send(None)
        except StopIteration:
            self.done = True
        except (DecodeError, IndexError, ValueError):
            self.broken = True

    # -- the walk (a generator: it yields whenever it needs more bytes) ----------------

    def _frame(self) -> _Step:
        yield from self._skip(4)  # correlation id
        if self._header_tags:
            yield from self._tags(top=False)
        yield from self._struct(self._walk, top=True)

    def _struct(self, walk: Walk, top: bool = False) -> _Step:
        for op in walk:
            kind = op[0]
            if kind == "fixed":
                yield from self._skip(op[1])  # type: ignore[arg-type]
            elif kind == "blob":
                length = yield from self._uvarint()
                if length > 1:
                    yield from self._skip(length - 1)
            elif kind == "array":
                count = yield from self._uvarint()
                for _ in range(count - 1):
                    yield from self._struct(op[1])  # type: ignore[arg-type]
            elif kind == "struct":
                if op[2]:  # nullable: a presence byte first
                    present = yield from self._byte()
                    if present == 0xFF:  # -1: null
                        continue
                yield from self._struct(op[1])  # type: ignore[arg-type]
            else:
                yield from self._tags(top)

    def _tags(self, top: bool) -> _Step:
        count = yield from self._uvarint()
        for _ in range(count):
            at = self._cursor.base + self._cursor.pos
            tag = yield from self._uvarint()
            size = yield from self._uvarint()
            if top and tag in self._wanted:
                self.found.append((at, tag, self._cursor.base + self._cursor.pos, size))
            yield from self._skip(size)

    def _byte(self) -> Generator[None, None, int]:
        cursor = self._cursor
        while cursor.pos >= len(cursor.data):
            yield
            cursor = self._cursor
        value = cursor.data[cursor.pos]
        cursor.pos += 1
        return value

    def _uvarint(self) -> Generator[None, None, int]:
        value = shift = 0
        while True:
            byte = yield from self._byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 35:
                raise DecodeError("varint longer than 5 bytes")

    def _skip(self, n: int) -> _Step:
        while n:
            cursor = self._cursor
            left = len(cursor.data) - cursor.pos
            if not left:
                yield
                continue
            take = min(n, left)
            cursor.pos += take
            n -= take

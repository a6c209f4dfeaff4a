"""Read what metrics need from frames that pass through unread: client ids and the
topics of a Produce request, without decoding or copying record data.

A pass-through frame reaches the processor as pieces of the chunks Envoy read, and
may span several of them. `ProduceTopics` is fed those pieces in order and reports
each topic as soon as its last partition went by: the topic (name, or id from
Produce v13 on), how many partitions and how many record-batch bytes. Records are
skipped by their length, so a 1 MiB batch costs the same as an empty one. Only small
units (a header, a topic name, a partition's index and length) are ever buffered.

It never raises on bad input: metrics are no place to judge a frame (the broker
does). A malformed or truncated frame simply stops the skim; what was reported
stays.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from kafka_wire._prims import read_uvarint
from kafka_wire.enums import ApiKey
from kafka_wire.errors import DecodeError

_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
FIRST_FLEXIBLE_PRODUCE: Final = 9  # compact strings and arrays, tagged fields
FIRST_TOPIC_ID_PRODUCE: Final = 13  # TopicId (uuid) instead of Name (KIP-516)
UUID_SIZE: Final = 16

# (topic name or 16-byte id, is_id, partitions, record bytes)
TopicSink = Callable[[bytes, bool, int, int], None]


def client_id_of(body: memoryview | bytes) -> bytes | None:
    """The raw client id of a request header v1+ whose body (after api key, version and
    correlation id) starts `body`: b"" for a null one, None when it is not all in `body`."""
    if len(body) < 2:
        return None
    (n,) = _INT16.unpack_from(body, 0)
    if n < 0:
        return b""
    if len(body) < 2 + n:
        return None
    return bytes(body[2:2 + n])


class _Short(Exception):
    """The unit being read is not all there yet."""


class _Malformed(Exception):
    """The bytes cannot be a Produce request: stop skimming."""


# Stages: what the next unit is.
_HEAD, _TOPIC, _PARTITION, _PARTITION_END, _TOPIC_END, _DONE = range(6)


class ProduceTopics:
    """The topics of one Produce request, from its body pieces (see module docstring).

    The first piece starts right after the request head (size, api key, version,
    correlation id): at the client id of the request header."""

    __slots__ = (
        "_flexible",
        "_ids",
        "_partitions",
        "_parts_left",
        "_record_bytes",
        "_rest",
        "_sink",
        "_skip",
        "_stage",
        "_topic",
        "_topics_left",
        "_version",
    )

    def __init__(self, version: int, sink: TopicSink) -> None:
        self._version = version
        self._flexible = version >= FIRST_FLEXIBLE_PRODUCE
        self._ids = version >= FIRST_TOPIC_ID_PRODUCE
        self._sink = sink
        self._stage = _HEAD
        self._rest = b""  # the start of a unit that was cut off
        self._skip = 0  # record bytes still to go by
        self._topics_left = 0
        self._parts_left = 0
        self._topic = b""
        self._partitions = 0
        self._record_bytes = 0

    @property
    def done(self) -> bool:
        return self._stage == _DONE

    def feed(self, piece: memoryview | bytes) -> None:
        """The next piece of the request. One loop over small units with the state in
        local variables, written back when the piece is used up: this runs for every
        Produce request that passes, so it avoids a call per field."""
        stage = self._stage
        if stage == _DONE:
            return
        data: memoryview | bytes = piece
        skip = self._skip
        if skip:
            if len(data) < skip:
                self._skip = skip - len(data)
                return
            data = data[skip:]
            skip = 0
        if self._rest:
            data = self._rest + bytes(data)
            self._rest = b""
        flexible, end = self._flexible, len(data)
        topics_left, parts_left = self._topics_left, self._parts_left
        topic, partitions, record_bytes = self._topic, self._partitions, self._record_bytes
        p = start = 0
        try:
            while stage != _DONE:
                start = p  # a unit is read whole or not at all (see _Short below)
                if stage == _PARTITION:  # index, then the records' length: skip them
                    if flexible:
                        n = data[p + 4]  # a one-byte varint unless 127+ bytes follow
                        n, p = (n, p + 5) if n < 0x80 else _uvarint(data, p + 4)
                        size = n - 1  # compact nullable bytes: 0 is null
                    else:
                        (size,) = _INT32.unpack_from(data, p + 4)
                        p += 8
                    size = max(size, 0)
                    record_bytes += size
                    partitions += 1
                    stage = _PARTITION_END
                    if p + size > end:  # the records go on in later pieces
                        skip = p + size - end
                        p = end
                        break
                    p += size
                elif stage == _PARTITION_END:
                    if flexible:  # tagged fields: almost always none (one 0 byte)
                        p = p + 1 if data[p] == 0 else _skip_tags(data, p)
                    parts_left -= 1
                    stage = _PARTITION if parts_left else _TOPIC_END
                elif stage == _TOPIC_END:
                    if flexible:
                        p = p + 1 if data[p] == 0 else _skip_tags(data, p)
                    self._sink(topic, self._ids, partitions, record_bytes)
                    topics_left -= 1
                    stage = _TOPIC if topics_left else _DONE
                elif stage == _TOPIC:
                    if self._ids:
                        name, q = bytes(data[p:p + UUID_SIZE]), p + UUID_SIZE
                        if q > end:
                            raise _Short
                    else:
                        name, q = _string(data, p, flexible)
                    count, p = _array_length(data, q, flexible)
                    topic, partitions, record_bytes, parts_left = name, 0, 0, count
                    stage = _PARTITION if count else _TOPIC_END
                else:  # _HEAD: client id (+ tags), transactional id, acks, timeout, topics
                    (n,) = _INT16.unpack_from(data, p)
                    p += 2 + max(n, 0)
                    if flexible:
                        p = _skip_tags(data, p)
                    if self._version >= 3:
                        if flexible:
                            n, p = _uvarint(data, p)
                            p += max(n - 1, 0)
                        else:
                            (n,) = _INT16.unpack_from(data, p)
                            p += 2 + max(n, 0)
                    count, p = _array_length(data, p + 6, flexible)  # after acks, timeout
                    topics_left = count
                    stage = _TOPIC if count else _DONE
        except (_Short, IndexError, struct.error):
            # Not all there yet: keep the unit's start for the next piece.
            self._rest = bytes(data[start:])
        except (_Malformed, ValueError):
            stage = _DONE
        self._stage, self._skip = stage, skip
        self._topics_left, self._parts_left = topics_left, parts_left
        self._topic, self._partitions, self._record_bytes = topic, partitions, record_bytes


def _need(b: memoryview | bytes, p: int, n: int) -> int:
    if len(b) - p < n:
        raise _Short
    return p


def _int32(b: memoryview | bytes, p: int) -> tuple[int, int]:
    (value,) = _INT32.unpack_from(b, _need(b, p, 4))
    return value, p + 4


def _uvarint(b: memoryview | bytes, p: int) -> tuple[int, int]:
    if p >= len(b):
        raise _Short
    first = b[p]
    if not first & 0x80:
        return first, p + 1
    try:
        return read_uvarint(b, p + 1, first)
    except IndexError:
        raise _Short from None
    except DecodeError:
        raise _Malformed from None


def _string(b: memoryview | bytes, p: int, flexible: bool) -> tuple[bytes, int]:
    if flexible:
        n, p = _uvarint(b, p)
        n -= 1
    else:
        (n,) = _INT16.unpack_from(b, _need(b, p, 2))
        p += 2
    if n < 0:
        raise _Malformed  # a topic name is never null
    p = _need(b, p, n)
    return bytes(b[p:p + n]), p + n


def _array_length(b: memoryview | bytes, p: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        n, p = _uvarint(b, p)
        n -= 1
    else:
        n, p = _int32(b, p)
    if n < 0:
        raise _Malformed
    return n, p


def _skip_tags(b: memoryview | bytes, p: int) -> int:
    count, p = _uvarint(b, p)
    for _ in range(count):
        _, p = _uvarint(b, p)
        size, p = _uvarint(b, p)
        p = _need(b, p, size) + size
    return p


def wants_topics(api_key: int) -> bool:
    """Whether `ProduceTopics` reads this API's requests."""
    return api_key == ApiKey.PRODUCE


__all__ = ["ProduceTopics", "TopicSink", "client_id_of", "wants_topics"]

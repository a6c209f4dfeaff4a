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

from kafka_wire.api_keys import PRODUCE

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
        if self._stage == _DONE:
            return
        data: memoryview | bytes = piece
        if self._skip:
            if len(data) < self._skip:
                self._skip -= len(data)
                return
            data = data[self._skip:]
            self._skip = 0
        if self._rest:
            data = self._rest + bytes(data)
            self._rest = b""
        pos = 0
        try:
            while self._stage != _DONE:
                pos = self._unit(data, pos)
                if self._skip:
                    # Units of zero bytes (non-flexible versions have no tags) may follow
                    # the last records, so a piece that ends with them goes on.
                    left = len(data) - pos
                    if left < self._skip:
                        self._skip -= left
                        return
                    pos += self._skip
                    self._skip = 0
        except _Short:
            self._rest = bytes(data[pos:])
        except (_Malformed, struct.error, ValueError):
            self._stage = _DONE

    # -- units -------------------------------------------------------------------------

    def _unit(self, b: memoryview | bytes, p: int) -> int:
        """Read the next unit at `p`; the position after it. _Short: not all there."""
        stage = self._stage
        if stage == _PARTITION:
            p = _need(b, p, 4) + 4  # partition index
            if self._flexible:
                n, p = _uvarint(b, p)
                size = n - 1  # compact nullable bytes: 0 is null
            else:
                size, p = _int32(b, p)
            self._skip = max(size, 0)
            self._record_bytes += max(size, 0)
            self._partitions += 1
            self._stage = _PARTITION_END
            return p
        if stage == _PARTITION_END:
            if self._flexible:
                p = _skip_tags(b, p)
            self._parts_left -= 1
            self._stage = _PARTITION if self._parts_left else _TOPIC_END
            return p
        if stage == _TOPIC_END:
            if self._flexible:
                p = _skip_tags(b, p)
            self._sink(self._topic, self._ids, self._partitions, self._record_bytes)
            self._topics_left -= 1
            self._stage = _TOPIC if self._topics_left else _DONE
            return p
        if stage == _TOPIC:
            if self._ids:
                start = _need(b, p, UUID_SIZE)
                topic, p = bytes(b[start:start + UUID_SIZE]), start + UUID_SIZE
            else:
                topic, p = _string(b, p, self._flexible)
            count, p = _array_length(b, p, self._flexible)
            self._topic, self._partitions, self._record_bytes = topic, 0, 0
            self._parts_left = count
            self._stage = _PARTITION if count else _TOPIC_END
            return p
        # _HEAD: header (client id, tags), transactional id, acks, timeout, topic count.
        (n,) = _INT16.unpack_from(b, _need(b, p, 2))
        p = _need(b, p + 2, max(n, 0)) + max(n, 0)
        if self._flexible:
            p = _skip_tags(b, p)
        if self._version >= 3:
            if self._flexible:
                n, p = _uvarint(b, p)
                p = _need(b, p, max(n - 1, 0)) + max(n - 1, 0)
            else:
                (n,) = _INT16.unpack_from(b, _need(b, p, 2))
                p = _need(b, p + 2, max(n, 0)) + max(n, 0)
        p = _need(b, p, 6) + 6  # acks, timeout
        self._topics_left, p = _array_length(b, p, self._flexible)
        self._stage = _TOPIC if self._topics_left else _DONE
        return p


def _need(b: memoryview | bytes, p: int, n: int) -> int:
    if len(b) - p < n:
        raise _Short
    return p


def _int32(b: memoryview | bytes, p: int) -> tuple[int, int]:
    (value,) = _INT32.unpack_from(b, _need(b, p, 4))
    return value, p + 4


def _uvarint(b: memoryview | bytes, p: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if p >= len(b):
            raise _Short
        byte = b[p]
        p += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, p
        shift += 7
        if shift > 28:
            raise _Malformed


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
    return api_key == PRODUCE


__all__ = ["ProduceTopics", "TopicSink", "client_id_of", "wants_topics"]

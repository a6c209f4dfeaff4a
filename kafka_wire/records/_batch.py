"""The fixed part of v2 record batches: values, header, views, walking a records field, CRC.

The byte layout is described in the package docstring (``kafka_wire/records/__init__.py``).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import google_crc32c

from kafka_wire.compression import Compression, is_xerial
from kafka_wire.errors import DecodeError

Buffer = bytes | bytearray | memoryview

HEADER_SIZE = 61  # the fixed part of a v2 batch, up to the records
MAGIC_V2 = 2
_LOG_OVERHEAD = 12  # baseOffset + batchLength: what every entry of a records field starts with
_CRC_START = 21  # the CRC covers attributes..end
_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_SIZE = struct.Struct(">qi")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
_MIN_ENTRY = {0: 14, 1: 22, 2: HEADER_SIZE - _LOG_OVERHEAD}  # smallest size field per magic

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
_DELETE_HORIZON_BIT = 0x40


class TimestampType(enum.IntEnum):
    """Bit 3 of a batch's attributes."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlType(enum.IntEnum):
    """The type in a control record's key (transaction markers)."""

    ABORT = 0
    COMMIT = 1


# --------------------------------------------------------------------------- values


@dataclass(slots=True)
class Record:
    """One record of a v2 batch; offsets and timestamps are relative to the batch's."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    attributes: int = 0


class BatchHeader(NamedTuple):
    """The 61 fixed bytes of a v2 batch, field by field.

    The defaults describe a fresh, non-idempotent CreateTime batch: build one with
    ``BatchHeader(base_timestamp=now_ms)`` and let :func:`encode_batch` fill the rest.
    """

    base_offset: int = 0
    batch_length: int = 0
    partition_leader_epoch: int = -1
    magic: int = MAGIC_V2
    crc: int = 0
    attributes: int = 0
    last_offset_delta: int = -1
    base_timestamp: int = -1
    max_timestamp: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    records_count: int = 0

    @property
    def compression(self) -> Compression:
        return _compression(self.attributes)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & _TIMESTAMP_TYPE_BIT) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & _DELETE_HORIZON_BIT)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def _compression(attributes: int) -> Compression:
    bits = attributes & _COMPRESSION_MASK
    try:
        return Compression(bits)
    except ValueError:
        raise DecodeError(f"unknown compression codec {bits} in batch attributes") from None


class BatchView:
    """A v2 batch inside a records field: its header fields and its exact bytes.

    Creating one unpacks the 61-byte header, nothing more; records are decompressed and
    decoded only by :func:`decode_records`. ``raw`` is a zero-copy view of the original
    bytes (over an immutable ``bytes`` object).
    """

    __slots__ = ("header", "raw")

    def __init__(self, raw: memoryview) -> None:
        self.raw = raw
        self.header = BatchHeader._make(_HEADER.unpack_from(raw))

    @classmethod
    def from_bytes(cls, data: Buffer) -> BatchView:
        """The view of ``data`` holding exactly one v2 batch; DecodeError otherwise."""
        entries = list(iter_batches(data))
        if len(entries) != 1 or not isinstance(entries[0], BatchView):
            raise DecodeError("not exactly one magic v2 record batch")
        return entries[0]

    def __repr__(self) -> str:
        h = self.header
        bits = h.attributes & _COMPRESSION_MASK
        codec = Compression(bits).name if bits <= max(Compression) else bits
        return (
            f"BatchView(base_offset={h.base_offset}, last_offset_delta={h.last_offset_delta}, "
            f"records_count={h.records_count}, compression={codec}, size={len(self.raw)})"
        )

    # The header's fields, as attributes of the view.
    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def batch_length(self) -> int:
        return self.header.batch_length

    @property
    def partition_leader_epoch(self) -> int:
        return self.header.partition_leader_epoch

    @property
    def magic(self) -> int:
        return self.header.magic

    @property
    def crc(self) -> int:
        return self.header.crc

    @property
    def attributes(self) -> int:
        return self.header.attributes

    @property
    def last_offset_delta(self) -> int:
        return self.header.last_offset_delta

    @property
    def base_timestamp(self) -> int:
        return self.header.base_timestamp

    @property
    def max_timestamp(self) -> int:
        return self.header.max_timestamp

    @property
    def producer_id(self) -> int:
        return self.header.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.header.producer_epoch

    @property
    def base_sequence(self) -> int:
        return self.header.base_sequence

    @property
    def records_count(self) -> int:
        return self.header.records_count

    @property
    def compression(self) -> Compression:
        return self.header.compression

    @property
    def timestamp_type(self) -> TimestampType:
        return self.header.timestamp_type

    @property
    def is_transactional(self) -> bool:
        return self.header.is_transactional

    @property
    def is_control(self) -> bool:
        return self.header.is_control

    @property
    def has_delete_horizon(self) -> bool:
        return self.header.has_delete_horizon

    @property
    def last_offset(self) -> int:
        return self.header.last_offset

    @property
    def payload(self) -> memoryview:
        """The records as stored: compressed when the batch is."""
        return self.raw[HEADER_SIZE:]

    @property
    def is_xerial(self) -> bool:
        """True for a snappy batch in xerial's framing (as the Java producer writes)."""
        return self.header.compression == Compression.SNAPPY and is_xerial(self.payload)


@dataclass(frozen=True, slots=True)
class OpaqueEntry:
    """Bytes of a records field that are not a complete v2 batch, kept as they are.

    ``kind`` "legacy": a magic 0/1 message set entry (``magic`` says which);
    "truncated": the partial last batch a Fetch response may end with.
    """

    raw: memoryview
    kind: Literal["legacy", "truncated"]
    magic: int | None = None


Entry = BatchView | OpaqueEntry


# --------------------------------------------------------------------------- walking


def iter_batches(records: Buffer | None) -> Iterator[Entry]:
    """The entries of a records field (a Produce or Fetch partition's ``Records``), in order.

    v2 batches come as :class:`BatchView`; legacy message set entries and a truncated
    last batch as :class:`OpaqueEntry`. Joining every entry's ``raw`` gives back the
    input. None (a null records field) has no entries. DecodeError for a corrupt size
    or an unknown magic.
    """
    if records is None:
        return
    view = _immutable_view(records)
    end = len(view)
    pos = 0
    while pos < end:
        if end - pos < _LOG_OVERHEAD:
            yield OpaqueEntry(view[pos:], "truncated")
            return
        _offset, size = _OFFSET_SIZE.unpack_from(view, pos)
        if size < 0:
            raise DecodeError(f"record batch at byte {pos} has a negative size {size}")
        stop = pos + _LOG_OVERHEAD + size
        if stop > end:
            yield OpaqueEntry(view[pos:], "truncated")
            return
        magic = view[pos + 16] if size > 4 else -1
        minimum = _MIN_ENTRY.get(magic)
        if minimum is None:
            raise DecodeError(f"record batch at byte {pos} has unknown magic {magic}")
        if size < minimum:
            raise DecodeError(f"magic {magic} entry at byte {pos} too short ({size} bytes)")
        if magic == MAGIC_V2:
            yield BatchView(view[pos:stop])
        else:
            yield OpaqueEntry(view[pos:stop], "legacy", magic)
        pos = stop


def _immutable_view(records: Buffer) -> memoryview:
    """A byte view over immutable bytes (a view of a bytearray would pin it)."""
    if type(records) is bytes:
        return memoryview(records)
    if (
        type(records) is memoryview
        and type(records.obj) is bytes
        and records.format == "B"
        and records.c_contiguous
    ):
        return records
    return memoryview(bytes(records))


def verify_crc(batch: BatchView) -> bool:
    """True when the batch's CRC32C matches its bytes from the attributes onward."""
    crc: int = google_crc32c.value(bytes(batch.raw[_CRC_START:]))
    return crc == batch.header.crc


# --------------------------------------------------------------------------- helpers


def record_offset(batch: BatchHeader | BatchView, record: Record) -> int:
    """The record's absolute offset."""
    return batch.base_offset + record.offset_delta


def record_timestamp(batch: BatchHeader | BatchView, record: Record) -> int:
    """The record's timestamp: the batch's maxTimestamp under LogAppendTime."""
    if batch.timestamp_type == TimestampType.LOG_APPEND_TIME:
        return batch.max_timestamp
    return batch.base_timestamp + record.timestamp_delta


def control_type(record: Record) -> int:
    """The type of a control record (a :class:`ControlType` for transaction markers)."""
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise DecodeError("a control record's key holds version int16 + type int16")
    _version, kind = _CONTROL_KEY.unpack_from(record.key)
    return ControlType(kind) if kind in (0, 1) else int(kind)


def control_record(
    kind: ControlType | int, coordinator_epoch: int = 0, offset_delta: int = 0
) -> Record:
    """A transaction marker record, as the coordinator writes it."""
    return Record(
        offset_delta=offset_delta,
        timestamp_delta=0,
        key=_CONTROL_KEY.pack(0, int(kind)),
        value=_CONTROL_VALUE.pack(0, coordinator_epoch),
    )

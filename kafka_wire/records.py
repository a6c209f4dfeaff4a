"""Kafka record batches (magic v2): walk a records field, decode, re-encode, rewrite. No I/O.

The byte layout, all integers big-endian (Kafka's DefaultRecordBatch / DefaultRecord):

    RecordBatch
      offset size  field
           0    8  baseOffset            int64
           8    4  batchLength           int32   bytes after this field (batch size - 12)
          12    4  partitionLeaderEpoch  int32
          16    1  magic                 int8    2 (0 and 1: legacy message sets, below)
          17    4  crc                   uint32  CRC32C (Castagnoli) of bytes 21..end
          21    2  attributes            int16   bits 0-2 compression (0 none, 1 gzip,
                                                 2 snappy, 3 lz4, 4 zstd), bit 3 timestamp
                                                 type (0 CreateTime, 1 LogAppendTime), bit 4
                                                 transactional, bit 5 control, bit 6 delete
                                                 horizon (baseTimestamp holds it)
          23    4  lastOffsetDelta       int32   last offset - baseOffset (may exceed
                                                 recordsCount - 1: compaction leaves gaps)
          27    8  baseTimestamp         int64
          35    8  maxTimestamp          int64   with LogAppendTime: the broker's append time
          43    8  producerId            int64   -1 unless idempotent/transactional
          51    2  producerEpoch         int16
          53    4  baseSequence          int32   sequence of the first record (-1 if none)
          57    4  recordsCount          int32
          61    -  records               compressed as one payload per bits 0-2

    Record (varint: zigzag LEB128 of an int32; varlong: of an int64)
      length          varint   bytes after this field
      attributes      int8     unused (0)
      timestampDelta  varlong  from baseTimestamp
      offsetDelta     varint   from baseOffset
      keyLength       varint   -1: null key
      key             bytes
      valueLength     varint   -1: null value
      value           bytes
      headersCount    varint
      headers         headersCount x (headerKeyLength varint, headerKey utf-8,
                                      headerValueLength varint (-1: null), headerValue)

    Control record (a batch with the control bit, written by the broker or the
    transaction coordinator): key = version int16 (0) + type int16 (0 abort, 1 commit;
    KRaft's own logs use more); value = version int16 + coordinatorEpoch int32.

    Legacy message set entry (magic 0/1), never decoded here, passed through as is:
      offset int64, messageSize int32, crc uint32 (CRC32), magic int8, attributes int8,
      [timestamp int64 if magic 1], key (int32 length, -1 null), value (int32 length).

Every entry of a records field starts with offset int64 + size int32 and has its magic
at byte 16, so a records field can be walked without knowing the entries' formats.
A Fetch response may end with a partial batch (the broker cuts at the byte limit): it
is kept as trailing bytes, as consumers ignore it and fetch it again.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, TypeVar, overload

import google_crc32c

from kafka_wire.compression import Compression, compress, decompress, is_xerial
from kafka_wire.errors import DecodeError, EncodeError

Buffer = bytes | bytearray | memoryview
B = TypeVar("B", bytes, bytearray, memoryview)

HEADER_SIZE = 61  # the fixed part of a v2 batch, up to the records
MAGIC_V2 = 2
_LOG_OVERHEAD = 12  # baseOffset + batchLength: what every entry of a records field starts with
_CRC_START = 21  # the CRC covers attributes..end
_HEADER = struct.Struct(">qiibIhiqqqhii")
_PREFIX = struct.Struct(">qiibI")  # baseOffset .. crc
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount
_OFFSET_SIZE = struct.Struct(">qi")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
_MIN_ENTRY = {0: 14, 1: 22, 2: HEADER_SIZE - _LOG_OVERHEAD}  # smallest size field per magic
_MIN_RECORD = 7  # length, attributes, timestampDelta, offsetDelta, key, value, headers

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
_DELETE_HORIZON_BIT = 0x40

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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
        return (
            f"BatchView(base_offset={h.base_offset}, last_offset_delta={h.last_offset_delta}, "
            f"records_count={h.records_count}, compression={h.compression.name}, "
            f"size={len(self.raw)})"
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
    if type(records) is memoryview and type(records.obj) is bytes and records.format == "B":
        return records
    return memoryview(bytes(records))


def verify_crc(batch: BatchView) -> bool:
    """True when the batch's CRC32C matches its bytes from the attributes onward."""
    return google_crc32c.value(bytes(batch.raw[_CRC_START:])) == batch.header.crc


# --------------------------------------------------------------------------- decoding


def decode_records(batch: BatchView, *, verify: bool = False) -> list[Record]:
    """The records of a v2 batch, decompressed; DecodeError for a corrupt batch.

    ``verify`` checks the CRC first (brokers have checked it on the way in, so it is
    off by default). Control batches decode like any other: see :func:`control_type`.
    """
    if verify and not verify_crc(batch):
        raise DecodeError(f"CRC mismatch in the record batch at offset {batch.base_offset}")
    count = batch.header.records_count
    if count < 0:
        raise DecodeError(f"negative record count {count}")
    if count == 0:
        return []  # as Kafka: an empty batch's payload is not read
    data = decompress(batch.compression, batch.payload)
    if count > len(data) // _MIN_RECORD:
        raise DecodeError(f"{count} records cannot fit in {len(data)} bytes")
    try:
        records, pos = _read_records(data, count)
    except IndexError:
        raise DecodeError("a record runs past the end of the batch") from None
    if pos != len(data):
        raise DecodeError(f"{len(data) - pos} bytes after the last record of the batch")
    return records


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint or varlong at ``pos``; returns (value, next position)."""
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    result = b & 0x7F
    shift = 7
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def _read_records(buf: bytes, count: int) -> tuple[list[Record], int]:
    records: list[Record] = []
    append = records.append
    varint = _varint
    pos = 0
    for _ in range(count):
        # Single-byte varints (the usual case for all but lengths) are read inline.
        b = buf[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            length, pos = varint(buf, pos)
        stop = pos + length
        attributes = buf[pos]
        b = buf[pos + 1]
        if b < 0x80:
            ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            ts_delta, pos = varint(buf, pos + 1)
        b = buf[pos]
        if b < 0x80:
            offset_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            offset_delta, pos = varint(buf, pos)
        n, pos = varint(buf, pos)
        if n >= 0:
            key: bytes | None = buf[pos : pos + n]
            pos += n
        elif n == -1:
            key = None
        else:
            raise DecodeError(f"record key length {n}")
        n, pos = varint(buf, pos)
        if n >= 0:
            value: bytes | None = buf[pos : pos + n]
            pos += n
        elif n == -1:
            value = None
        else:
            raise DecodeError(f"record value length {n}")
        b = buf[pos]
        if b < 0x80:
            header_count, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            header_count, pos = varint(buf, pos)
        headers: list[tuple[str, bytes | None]] = []
        if header_count:
            if header_count < 0 or header_count * 2 > stop - pos:
                raise DecodeError(f"record header count {header_count}")
            for _h in range(header_count):
                n, pos = varint(buf, pos)
                if n < 0:
                    raise DecodeError(f"record header key length {n}")
                name = buf[pos : pos + n].decode("utf-8", "surrogateescape")
                pos += n
                n, pos = varint(buf, pos)
                if n >= 0:
                    headers.append((name, buf[pos : pos + n]))
                    pos += n
                elif n == -1:
                    headers.append((name, None))
                else:
                    raise DecodeError(f"record header value length {n}")
        if pos != stop:
            raise DecodeError(f"record length {length} does not match its fields")
        if attributes > 127:
            attributes -= 256
        append(Record(offset_delta, ts_delta, key, value, headers, attributes))
    return records, pos


# --------------------------------------------------------------------------- encoding

# Zigzag varints of small values, the usual lengths, deltas and counts.
_ZZ_SMALL: tuple[bytes, ...] = tuple(bytes(((i << 1) ^ (i >> 63),)) for i in range(-64, 64))


def _zigzag(n: int, lo: int = _INT32_MIN, hi: int = _INT32_MAX) -> bytes:
    if -64 <= n < 64:
        return _ZZ_SMALL[n + 64]
    if not lo <= n <= hi:
        raise EncodeError(f"{n} does not fit in a {'varint' if hi == _INT32_MAX else 'varlong'}")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _write_records(records: Sequence[Record], renumber: bool) -> bytes:
    """The records section; offset deltas must be strictly increasing (unless renumbered)."""
    out = bytearray()
    zigzag = _zigzag
    previous = -1
    for i, r in enumerate(records):
        delta = i if renumber else r.offset_delta
        if delta <= previous:
            raise EncodeError(
                f"record offset deltas must increase: {delta} after {previous}"
                if previous >= 0
                else f"negative record offset delta {delta}"
            )
        previous = delta
        attributes = r.attributes
        if not -128 <= attributes <= 255:
            raise EncodeError(f"record attributes {attributes} do not fit in an int8")
        body = bytearray((attributes & 0xFF,))
        body += zigzag(r.timestamp_delta, _INT64_MIN, _INT64_MAX)
        body += zigzag(delta)
        key = r.key
        if key is None:
            body += b"\x01"
        else:
            body += zigzag(len(key))
            body += key
        value = r.value
        if value is None:
            body += b"\x01"
        else:
            body += zigzag(len(value))
            body += value
        headers = r.headers
        body += zigzag(len(headers))
        for name, hvalue in headers:
            raw_name = name.encode("utf-8", "surrogateescape")
            body += zigzag(len(raw_name))
            body += raw_name
            if hvalue is None:
                body += b"\x01"
            else:
                body += zigzag(len(hvalue))
                body += hvalue
        out += zigzag(len(body))
        out += body
    return bytes(out)


def encode_batch(
    header: BatchHeader | BatchView,
    records: Sequence[Record],
    *,
    compression: Compression | int | None = None,
    level: int | None = None,
    xerial: bool | None = None,
    renumber: bool = False,
    max_timestamp: int | None = None,
) -> bytes:
    """A v2 batch holding ``records``, with the header fields of ``header``.

    Kept from ``header``: base offset, partition leader epoch, attributes (timestamp
    type, transactional, control, delete horizon), base timestamp, producer id, epoch and
    base sequence, and lastOffsetDelta: each record keeps its own ``offset_delta``, so
    dropped records leave offset gaps (as compaction does) and the batch still spans the
    offsets it was given. That matters because lastOffsetDelta is also the batch's
    sequence range: an idempotent producer's next batch starts at
    ``baseSequence + lastOffsetDelta + 1``, and consumers resume after ``last_offset``.
    lastOffsetDelta grows if a record's delta is beyond it.

    Recomputed: batchLength, recordsCount, CRC32C, and maxTimestamp for CreateTime
    batches (baseTimestamp + the largest timestampDelta, what producers write; with
    LogAppendTime or a delete horizon the header's is kept; ``max_timestamp`` forces it).

    ``compression`` defaults to the header's, ``level`` to
    :data:`kafka_wire.compression.DEFAULT_LEVELS`, snappy framing (``xerial``) to the
    original batch's when ``header`` is a :class:`BatchView`, else raw.

    ``renumber`` gives the records offset deltas 0..n-1 and lastOffsetDelta n-1: what a
    broker demands of a *produced* batch (it refuses ``recordsCount != lastOffsetDelta +
    1`` with INVALID_RECORD). Renumbering a batch that lost records is refused for
    idempotent producers (producer id >= 0): the broker would then expect the next batch
    one sequence number early and fail it with OUT_OF_ORDER_SEQUENCE_NUMBER.
    """
    h = header.header if isinstance(header, BatchView) else header
    codec = h.compression if compression is None else _codec(compression)
    if renumber:
        if not records:
            raise EncodeError("an empty batch cannot be renumbered: a produced batch needs records")
        if h.producer_id >= 0 and len(records) != h.last_offset_delta + 1:
            raise EncodeError(
                f"renumbering {len(records)} of {h.last_offset_delta + 1} records would break "
                f"producer {h.producer_id}'s sequence numbers"
            )
        last_offset_delta = len(records) - 1
    else:
        last_offset_delta = h.last_offset_delta
        if records and records[-1].offset_delta > last_offset_delta:
            last_offset_delta = records[-1].offset_delta
    body = _write_records(records, renumber)
    if xerial is None:
        xerial = codec == Compression.SNAPPY and isinstance(header, BatchView) and header.is_xerial
    payload = compress(codec, body, level, xerial=xerial) if codec else body
    if max_timestamp is None:
        max_timestamp = h.max_timestamp
        if records and not h.attributes & (_TIMESTAMP_TYPE_BIT | _DELETE_HORIZON_BIT):
            max_timestamp = h.base_timestamp + max(r.timestamp_delta for r in records)
    attributes = (h.attributes & ~_COMPRESSION_MASK) | codec
    try:
        tail = _TAIL.pack(
            attributes,
            last_offset_delta,
            h.base_timestamp,
            max_timestamp,
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            len(records),
        )
        prefix = _PREFIX.pack(
            h.base_offset,
            HEADER_SIZE - _LOG_OVERHEAD + len(payload),
            h.partition_leader_epoch,
            MAGIC_V2,
            google_crc32c.extend(google_crc32c.value(tail), payload),
        )
    except struct.error as exc:
        raise EncodeError(f"record batch header field out of range: {exc}") from None
    return b"".join((prefix, tail, payload))


def _codec(compression: Compression | int) -> Compression:
    try:
        return Compression(compression)
    except ValueError:
        raise EncodeError(f"unknown compression codec {compression}") from None


# --------------------------------------------------------------------------- rewriting

RewriteFn = Callable[[BatchView], list[Record] | None]


@overload
def rewrite_records(
    records: None,
    fn: RewriteFn,
    *,
    level: int | None = ...,
    renumber: bool = ...,
    include_control: bool = ...,
) -> None: ...


@overload
def rewrite_records(
    records: B,
    fn: RewriteFn,
    *,
    level: int | None = ...,
    renumber: bool = ...,
    include_control: bool = ...,
) -> B | bytes: ...


def rewrite_records(
    records: Buffer | None,
    fn: RewriteFn,
    *,
    level: int | None = None,
    renumber: bool = False,
    include_control: bool = False,
) -> Buffer | None:
    """Apply ``fn`` to each v2 batch of a records field; return the new field's bytes.

    ``fn(batch)`` returns the batch's new records (see :func:`encode_batch`: header
    fields kept, same compression, offset gaps where records were dropped, an empty
    list gives an empty batch that still advances consumers past its offsets), or None
    to leave the batch untouched. Untouched batches, legacy entries and a truncated
    tail are copied byte for byte; if nothing changed, ``records`` itself is returned.
    Control batches (transaction markers) are not given to ``fn`` unless
    ``include_control``. ``renumber`` is for produced batches (see :func:`encode_batch`).
    """
    if records is None:
        return None
    pieces: list[bytes | memoryview] = []
    changed = False
    for entry in iter_batches(records):
        if isinstance(entry, BatchView) and (include_control or not entry.is_control):
            new = fn(entry)
            if new is not None:
                pieces.append(encode_batch(entry, new, level=level, renumber=renumber))
                changed = True
                continue
        pieces.append(entry.raw)
    if not changed:
        return records
    return b"".join(pieces)


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
    """A transaction marker record, as the coordinator writes it (for tests and tools)."""
    return Record(
        offset_delta=offset_delta,
        timestamp_delta=0,
        key=_CONTROL_KEY.pack(0, int(kind)),
        value=_CONTROL_VALUE.pack(0, coordinator_epoch),
    )


__all__ = [
    "HEADER_SIZE",
    "BatchHeader",
    "BatchView",
    "Compression",
    "ControlType",
    "Entry",
    "OpaqueEntry",
    "Record",
    "TimestampType",
    "control_record",
    "control_type",
    "decode_records",
    "encode_batch",
    "iter_batches",
    "record_offset",
    "record_timestamp",
    "rewrite_records",
    "verify_crc",
]

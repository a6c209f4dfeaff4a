"""Decoding and encoding the records of v2 batches, and rewriting records fields."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TypeVar, overload

import google_crc32c

from kafka_wire._prims import uvarint
from kafka_wire.compression import MAX_DECOMPRESSED, Compression, compress, decompress
from kafka_wire.errors import DecodeError, EncodeError
from kafka_wire.records._batch import (
    _COMPRESSION_MASK,
    _CONTROL_BIT,
    _DELETE_HORIZON_BIT,
    _LOG_OVERHEAD,
    _TIMESTAMP_TYPE_BIT,
    HEADER_SIZE,
    MAGIC_V2,
    BatchHeader,
    BatchView,
    Buffer,
    ControlType,
    OpaqueEntry,
    Record,
    control_record,
    iter_batches,
    verify_crc,
)

B = TypeVar("B", bytes, bytearray, memoryview)

_PREFIX = struct.Struct(">qiibI")  # baseOffset .. crc
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount
_MIN_RECORD = 7  # length, attributes, timestampDelta, offsetDelta, key, value, headers
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# --------------------------------------------------------------------------- decoding


def decode_records(batch: BatchView, *, verify: bool = False,
                   max_decompressed: int = MAX_DECOMPRESSED) -> list[Record]:
    """The records of a v2 batch, decompressed; DecodeError for a corrupt batch, or one
    decompressing to more than `max_decompressed` bytes (checked while decompressing).

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
    data = decompress(batch.compression, batch.payload, max_decompressed)
    if count > len(data) // _MIN_RECORD:
        raise DecodeError(f"{count} records cannot fit in {len(data)} bytes")
    try:
        records, pos = _read_records(data, count)
    except IndexError:
        raise DecodeError("a record runs past the end of the batch") from None
    if pos != len(data):
        raise DecodeError(f"{len(data) - pos} bytes after the last record of the batch")
    return records


def decode_field(batch: BatchView, field: str = "value", *,
                 max_decompressed: int = MAX_DECOMPRESSED) -> list[memoryview | None]:
    """Every record's value (or key, `field="key"`) of a v2 batch, decompressed, in order,
    as views into the decompressed bytes: what read-only checks need, read without
    building records or copying values (each record's length says where the next
    begins). DecodeError for a batch whose records or lengths do not fit together; a
    record's headers are not looked at."""
    count = batch.header.records_count
    if count < 0:
        raise DecodeError(f"negative record count {count}")
    if count == 0:
        return []
    data = decompress(batch.compression, batch.payload, max_decompressed)
    end = len(data)
    if count > end // _MIN_RECORD:
        raise DecodeError(f"{count} records cannot fit in {end} bytes")
    want_value = field == "value"
    view = memoryview(data)
    out: list[memoryview | None] = []
    append = out.append
    pos = 0
    try:
        for _ in range(count):
            b = data[pos]  # length (hot loop: one- and two-byte varints inline)
            if b < 0x80:
                z = b
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                z, pos = _uvarint(data, pos)
            stop = pos + ((z >> 1) ^ -(z & 1))
            if stop > end or stop <= pos:
                raise DecodeError(f"record length does not fit the batch (at byte {pos})")
            pos += 1  # attributes; then timestampDelta and offsetDelta, skipped
            while data[pos] >= 0x80:
                pos += 1
            pos += 1
            while data[pos] >= 0x80:
                pos += 1
            pos += 1
            for wanted in (False, True):  # keyLength + key, then valueLength + value
                b = data[pos]
                if b < 0x80:
                    z = b
                    pos += 1
                elif data[pos + 1] < 0x80:
                    z = (b & 0x7F) | (data[pos + 1] << 7)
                    pos += 2
                else:
                    z, pos = _uvarint(data, pos)
                if z & 1:
                    if z != 1:
                        raise DecodeError(f"record field length {(z >> 1) ^ -1}")
                    if wanted is want_value:
                        append(None)
                        break
                else:
                    if wanted is want_value:
                        append(view[pos : pos + (z >> 1)])
                        pos += z >> 1
                        break
                    pos += z >> 1
            if pos > stop:
                raise DecodeError(f"record length does not match its fields (at byte {pos})")
            pos = stop
    except IndexError:
        raise DecodeError("a record runs past the end of the batch") from None
    if pos != end:
        raise DecodeError(f"{end - pos} bytes after the last record of the batch")
    return out


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """The unsigned LEB128 at ``pos`` (still zigzag-encoded); returns (value, next position)."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def _read_records(buf: bytes, count: int) -> tuple[list[Record], int]:
    """``count`` records from ``buf``; IndexError when they run past its end.

    Hot loop, so written out by hand: every varint is read as its zigzag-encoded
    unsigned value ``z`` (value ``(z >> 1) ^ -(z & 1)``), one- and two-byte varints
    inline, longer ones by :func:`_uvarint`. A length ``z`` that is odd is negative:
    1 is -1 (null), anything else is invalid.
    """
    records: list[Record] = []
    append = records.append
    uvarint = _uvarint
    new = Record
    pos = 0
    for _ in range(count):
        b = buf[pos]  # length
        if b < 0x80:
            z = b
            pos += 1
        elif buf[pos + 1] < 0x80:
            z = (b & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        else:
            z, pos = uvarint(buf, pos)
        stop = pos + ((z >> 1) ^ -(z & 1))
        attributes = buf[pos]
        b = buf[pos + 1]  # timestampDelta
        if b < 0x80:
            z = b
            pos += 2
        else:
            z, pos = uvarint(buf, pos + 1)
        timestamp_delta = (z >> 1) ^ -(z & 1)
        b = buf[pos]  # offsetDelta
        if b < 0x80:
            z = b
            pos += 1
        elif buf[pos + 1] < 0x80:
            z = (b & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        else:
            z, pos = uvarint(buf, pos)
        offset_delta = (z >> 1) ^ -(z & 1)
        b = buf[pos]  # keyLength
        if b < 0x80:
            z = b
            pos += 1
        elif buf[pos + 1] < 0x80:
            z = (b & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        else:
            z, pos = uvarint(buf, pos)
        if z & 1:
            if z != 1:
                raise DecodeError(f"record key length {(z >> 1) ^ -1}")
            key = None
        else:
            key = buf[pos : pos + (z >> 1)]
            pos += z >> 1
        b = buf[pos]  # valueLength
        if b < 0x80:
            z = b
            pos += 1
        elif buf[pos + 1] < 0x80:
            z = (b & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        else:
            z, pos = uvarint(buf, pos)
        if z & 1:
            if z != 1:
                raise DecodeError(f"record value length {(z >> 1) ^ -1}")
            value = None
        else:
            value = buf[pos : pos + (z >> 1)]
            pos += z >> 1
        b = buf[pos]  # headersCount
        if b < 0x80:
            z = b
            pos += 1
        else:
            z, pos = uvarint(buf, pos)
        headers: list[tuple[str, bytes | None]] = []
        if z:
            if z & 1 or z > stop - pos:  # negative, or more than 2 bytes per header left
                raise DecodeError(f"record header count {(z >> 1) ^ -(z & 1)}")
            for _h in range(z >> 1):
                b = buf[pos]
                if b < 0x80:
                    z = b
                    pos += 1
                else:
                    z, pos = uvarint(buf, pos)
                if z & 1:
                    raise DecodeError(f"record header key length {(z >> 1) ^ -1}")
                name = buf[pos : pos + (z >> 1)].decode("utf-8", "surrogateescape")
                pos += z >> 1
                b = buf[pos]
                if b < 0x80:
                    z = b
                    pos += 1
                else:
                    z, pos = uvarint(buf, pos)
                if z & 1:
                    if z != 1:
                        raise DecodeError(f"record header value length {(z >> 1) ^ -1}")
                    headers.append((name, None))
                else:
                    headers.append((name, buf[pos : pos + (z >> 1)]))
                    pos += z >> 1
        if pos != stop:
            raise DecodeError(f"record length does not match its fields (at byte {pos})")
        append(
            new(
                offset_delta,
                timestamp_delta,
                key,
                value,
                headers,
                attributes - 256 if attributes > 127 else attributes,
            )
        )
    return records, pos


# --------------------------------------------------------------------------- encoding

# Zigzag varints of -64..63: the usual deltas, counts and short lengths.
_ZZ_SMALL: tuple[bytes, ...] = tuple(bytes(((i << 1) ^ (i >> 63),)) for i in range(-64, 64))


def _zigzag(n: int, lo: int = _INT32_MIN, hi: int = _INT32_MAX) -> bytes:
    """The zigzag varint (``lo``/``hi`` of an int32) or varlong (of an int64) of ``n``."""
    if -64 <= n < 64:
        return _ZZ_SMALL[n + 64]
    z = (n << 1) ^ (n >> 63)
    if z < 0x4000:
        return bytes(((z & 0x7F) | 0x80, z >> 7))
    if not lo <= n <= hi:
        raise EncodeError(f"{n} does not fit in a {'varint' if hi == _INT32_MAX else 'varlong'}")
    return uvarint(z)  # three bytes and more: rare enough for the general loop


_NULL = b"\x01"  # zigzag -1: a null key, value or header value


def _write_records(records: Sequence[Record], renumber: bool) -> bytes:
    """The records section; offset deltas must be strictly increasing (unless renumbered)."""
    out = bytearray()
    zigzag = _zigzag
    small = _ZZ_SMALL
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
        if attributes == 0:
            first = small[64]
        elif -128 <= attributes <= 255:
            first = bytes((attributes & 0xFF,))
        else:
            raise EncodeError(f"record attributes {attributes} do not fit in an int8")
        parts = [first, zigzag(r.timestamp_delta, _INT64_MIN, _INT64_MAX), zigzag(delta)]
        key = r.key
        if key is None:
            parts.append(_NULL)
        else:
            parts.append(zigzag(len(key)))
            parts.append(key)
        value = r.value
        if value is None:
            parts.append(_NULL)
        else:
            parts.append(zigzag(len(value)))
            parts.append(value)
        headers = r.headers
        parts.append(zigzag(len(headers)))
        for name, header_value in headers:
            raw_name = name.encode("utf-8", "surrogateescape")
            parts.append(zigzag(len(raw_name)))
            parts.append(raw_name)
            if header_value is None:
                parts.append(_NULL)
            else:
                parts.append(zigzag(len(header_value)))
                parts.append(header_value)
        body = b"".join(parts)
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
    empty_as_control: bool = False,
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
    original batch's when ``header`` is a :class:`BatchView`, else raw. An empty batch
    is written as Kafka's log cleaner writes one: no payload, compression none.

    ``empty_as_control`` writes an empty batch as a control batch instead, for a Fetch
    answer: no producer, one COMMIT marker at the batch's last offset. Consumers step over
    both alike, but librdkafka takes a partition's answer of plain empty batches for a
    message too large to fetch (it doubles its fetch size up to 1 GiB, then reports
    MSG_SIZE_TOO_LARGE at every such answer), and commits one short of a plain empty
    batch at a partition's end; a control record is progress to it. Without a producer
    id no client relates the marker to a transaction (read_committed consumers match
    markers to producers; COMMIT markers they ignore).

    ``renumber`` gives the records offset deltas 0..n-1 and lastOffsetDelta n-1: what a
    broker demands of a *produced* batch (it refuses ``recordsCount != lastOffsetDelta +
    1`` with INVALID_RECORD). Renumbering a batch that lost records is refused for
    idempotent producers (producer id >= 0): the broker would then expect the next batch
    one sequence number early and fail it with OUT_OF_ORDER_SEQUENCE_NUMBER.
    """
    h = header.header if isinstance(header, BatchView) else header
    if empty_as_control and not records:
        h = h._replace(attributes=(h.attributes & (_TIMESTAMP_TYPE_BIT | _DELETE_HORIZON_BIT))
                       | _CONTROL_BIT, producer_id=-1, producer_epoch=-1, base_sequence=-1)
        records = [control_record(ControlType.COMMIT, offset_delta=h.last_offset_delta)]
        max_timestamp = h.max_timestamp if max_timestamp is None else max_timestamp
    codec = h.compression if compression is None else _codec(compression)
    if not records:
        codec = Compression.NONE
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


_CRC_AT = 17
_CRC_FROM = 21  # the CRC covers attributes .. the end
_BASE_SEQUENCE_AT = 53


def with_base_sequence(batch: BatchView, base_sequence: int) -> bytes:
    """The batch's bytes with another baseSequence (and its CRC), payload untouched.

    For a produced batch whose producer's earlier records the gateway dropped: the
    broker must see sequence numbers without holes.
    """
    data = bytearray(batch.raw)
    struct.pack_into(">i", data, _BASE_SEQUENCE_AT, base_sequence)
    struct.pack_into(">I", data, _CRC_AT, google_crc32c.value(bytes(data[_CRC_FROM:])))
    return bytes(data)


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
    empty_as_control: bool = ...,
    drop_truncated: bool = ...,
) -> None: ...


@overload
def rewrite_records(
    records: B,
    fn: RewriteFn,
    *,
    level: int | None = ...,
    renumber: bool = ...,
    include_control: bool = ...,
    empty_as_control: bool = ...,
    drop_truncated: bool = ...,
) -> B | bytes: ...


def rewrite_records(
    records: Buffer | None,
    fn: RewriteFn,
    *,
    level: int | None = None,
    renumber: bool = False,
    include_control: bool = False,
    empty_as_control: bool = False,
    drop_truncated: bool = False,
) -> Buffer | None:
    """Apply ``fn`` to each v2 batch of a records field; return the new field's bytes.

    ``fn(batch)`` returns the batch's new records (see :func:`encode_batch`: header
    fields kept, same compression, offset gaps where records were dropped, an empty
    list gives an empty batch that still advances consumers past its offsets), or None
    to leave the batch untouched. Untouched batches, legacy entries and a truncated
    tail are copied byte for byte; if nothing changed, ``records`` itself is returned.
    Control batches (transaction markers) are not given to ``fn`` unless
    ``include_control``. ``renumber`` is for produced batches, ``empty_as_control`` for
    fetched ones (see :func:`encode_batch`). ``drop_truncated`` leaves out a truncated
    tail (the partial last batch of a Fetch answer): its complete records are readable,
    and ``fn`` never saw them.
    """
    if records is None:
        return None
    pieces: list[bytes | memoryview] = []
    changed = False
    for entry in iter_batches(records):
        if drop_truncated and isinstance(entry, OpaqueEntry) and entry.kind == "truncated":
            changed = True
            continue
        if isinstance(entry, BatchView) and (include_control or not entry.is_control):
            new = fn(entry)
            if new is not None:
                pieces.append(encode_batch(entry, new, level=level, renumber=renumber,
                                           empty_as_control=empty_as_control))
                changed = True
                continue
        pieces.append(entry.raw)
    if not changed:
        return records
    return b"".join(pieces)

"""Record batches (magic v2): walking, decoding, re-encoding, rewriting, every codec.

Vectors written by other libraries (kafka-python's batch builders, zstandard's streaming
compressor, kafka-python's xerial snappy framing) are assembled here independently of
the encoder under test, and everything we write is read back by kafka-python too.
"""

from __future__ import annotations

import dataclasses
import gzip
import struct
from collections.abc import Callable

import google_crc32c
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.codec import snappy_encode
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

import kafka_wire
from kafka_wire.compression import DEFAULT_LEVELS, XERIAL_MAGIC, compress, decompress
from kafka_wire.errors import DecodeError, EncodeError
from kafka_wire.records import (
    HEADER_SIZE,
    BatchHeader,
    BatchView,
    Compression,
    ControlType,
    OpaqueEntry,
    Record,
    TimestampType,
    control_record,
    control_type,
    decode_field,
    decode_records,
    encode_batch,
    iter_batches,
    record_offset,
    record_timestamp,
    rewrite_records,
    verify_crc,
)
from kafka_wire.records._codec import _write_records

CODECS = list(Compression)
COMPRESSED = [c for c in Compression if c != Compression.NONE]
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20

# --------------------------------------------------------------------------- strategies

small_bytes = st.binary(max_size=40)
maybe_bytes = st.none() | small_bytes
header_names = st.text(max_size=12)


@st.composite
def record_lists(draw: st.DrawFn, max_records: int = 12) -> list[Record]:
    n = draw(st.integers(0, max_records))
    gaps = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    out: list[Record] = []
    offset = -1
    for gap in gaps:
        offset += 1 + gap
        out.append(
            Record(
                offset_delta=offset,
                timestamp_delta=draw(st.integers(-(2**40), 2**40)),
                key=draw(maybe_bytes),
                value=draw(st.none() | st.binary(max_size=300)),
                headers=draw(st.lists(st.tuples(header_names, maybe_bytes), max_size=3)),
                attributes=draw(st.sampled_from([0, 0, 0, 1, -1, 127, -128])),
            )
        )
    return out


@st.composite
def batches(draw: st.DrawFn, max_records: int = 12) -> tuple[BatchHeader, list[Record]]:
    records = draw(record_lists(max_records).filter(bool))
    flags = draw(st.sampled_from([0, LOG_APPEND_TIME, TRANSACTIONAL, TRANSACTIONAL | 0x08]))
    base_timestamp = draw(st.integers(-1, 2**50))
    last = records[-1].offset_delta + draw(st.sampled_from([0, 0, 1, 5]))
    idempotent = draw(st.booleans())
    max_ts = base_timestamp + max(r.timestamp_delta for r in records)
    if flags & LOG_APPEND_TIME:
        max_ts = draw(st.integers(0, 2**50))
    header = BatchHeader(
        base_offset=draw(st.integers(0, 2**62)),
        partition_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
        attributes=flags,
        last_offset_delta=last,
        base_timestamp=base_timestamp,
        max_timestamp=max_ts,
        producer_id=draw(st.integers(0, 2**62)) if idempotent else -1,
        producer_epoch=draw(st.integers(0, 2**15 - 1)) if idempotent else -1,
        base_sequence=draw(st.integers(0, 2**31 - 1)) if idempotent else -1,
    )
    return header, records


def assemble(header: BatchHeader, payload: bytes, codec: int, count: int) -> bytes:
    """A batch put together by hand around a payload some other library compressed."""
    tail = struct.pack(
        ">hiqqqhii",
        (header.attributes & ~7) | codec,
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    ) + payload
    crc = google_crc32c.value(tail)
    return struct.pack(">qiibI", header.base_offset, 49 + len(payload),
                       header.partition_leader_epoch, 2, crc) + tail


def same_header(a: BatchHeader, b: BatchHeader, *, ignore: tuple[str, ...] = ()) -> None:
    skip = {"crc", "batch_length", *ignore}
    for name in BatchHeader._fields:
        if name not in skip:
            assert getattr(a, name) == getattr(b, name), name


def simple_records(n: int = 5, size: int = 20) -> list[Record]:
    return [
        Record(i, i * 10, f"k{i}".encode(), bytes([65 + i % 26]) * size, [("h", b"%d" % i)])
        for i in range(n)
    ]


def read_with_kafka_python(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None,
                                                      list[tuple[str, bytes | None]]]]:
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


# --------------------------------------------------------------------------- round trips


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_uncompressed_round_trip_is_byte_exact(batch: tuple[BatchHeader, list[Record]]) -> None:
    header, records = batch
    data = encode_batch(header, records, compression=Compression.NONE)
    view = BatchView.from_bytes(data)
    assert verify_crc(view)
    same_header(view.header, header._replace(records_count=len(records)))
    assert view.batch_length == len(data) - 12
    decoded = decode_records(view, verify=True)
    assert decoded == records
    assert encode_batch(view, decoded) == data
    assert bytes(view.raw) == data


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.name.lower())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches())
def test_compressed_round_trip(codec: Compression, batch: tuple[BatchHeader, list[Record]]) -> None:
    header, records = batch
    data = encode_batch(header, records, compression=codec)
    view = BatchView.from_bytes(data)
    assert view.compression == codec
    expected = header._replace(records_count=len(records), attributes=header.attributes | codec)
    same_header(view.header, expected)
    decoded = decode_records(view, verify=True)
    assert decoded == records
    again = BatchView.from_bytes(encode_batch(view, decoded))
    assert again.compression == codec
    assert decode_records(again) == records


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_kafka_python_reads_what_we_write(codec: Compression) -> None:
    records = [
        Record(0, 0, None, b"v0", []),
        Record(1, 5, b"k1", None, [("a", None), ("b", b"")]),
        Record(2, 9, b"", b"x" * 5000, [("\u00e9t\u00e9", b"\x00\xff")]),
    ]
    header = BatchHeader(base_offset=100, base_timestamp=1_700_000_000_000)
    data = encode_batch(header, records, compression=codec)
    assert read_with_kafka_python(data) == [
        (100 + r.offset_delta, header.base_timestamp + r.timestamp_delta, r.key, r.value,
         r.headers)
        for r in records
    ]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_we_read_what_kafka_python_writes(codec: int) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=0, producer_id=7,
        producer_epoch=1, base_sequence=40, batch_size=1 << 20,
    )
    for i in range(50):
        builder.append(i, timestamp=1_000 + i, key=None if i % 4 == 0 else b"k%d" % i,
                       value=b"value %d " % i * 10, headers=[("i", b"%d" % i)])
    data = bytes(builder.build())
    view = BatchView.from_bytes(data)
    assert verify_crc(view)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (7, 1, 40)
    records = decode_records(view)
    assert [(view.base_offset + r.offset_delta, view.base_timestamp + r.timestamp_delta,
             r.key, r.value, r.headers) for r in records] == read_with_kafka_python(data)
    if codec == 0:
        assert encode_batch(view, records) == data
    if codec == 2:
        assert view.is_xerial  # kafka-python frames snappy as the Java producer does


# --------------------------------------------------------------------------- codecs


def test_xerial_snappy_vector() -> None:
    records = simple_records(400, size=200)  # > 32 KiB: several xerial blocks
    body = _write_records(records, renumber=False)
    payload = snappy_encode(body, xerial_compatible=True, xerial_blocksize=32 * 1024)
    assert payload.startswith(XERIAL_MAGIC)
    header = BatchHeader(base_timestamp=5, last_offset_delta=399, max_timestamp=5 + 3990)
    view = BatchView.from_bytes(assemble(header, payload, Compression.SNAPPY, len(records)))
    assert view.is_xerial
    assert decode_records(view, verify=True) == records
    # Re-encoding keeps the framing of the original batch; raw snappy when asked.
    again = BatchView.from_bytes(encode_batch(view, records))
    assert again.is_xerial and decode_records(again) == records
    raw = BatchView.from_bytes(encode_batch(view, records, xerial=False))
    assert not raw.is_xerial and decode_records(raw) == records
    assert bytes(raw.payload) == compress(Compression.SNAPPY, body)
    # Our xerial framing is readable by kafka-python (and snappy-java's reader shape).
    assert read_with_kafka_python(bytes(again.raw))[0][3] == records[0].value


def test_zstd_frame_without_content_size() -> None:
    records = simple_records(300, size=100)
    body = _write_records(records, renumber=False)
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    payload = compressor.compress(body) + compressor.flush()
    assert zstandard.get_frame_parameters(payload).content_size == zstandard.CONTENTSIZE_UNKNOWN
    with pytest.raises(zstandard.ZstdError):
        zstandard.ZstdDecompressor().decompress(payload)  # why streaming decompression
    header = BatchHeader(last_offset_delta=299, max_timestamp=2990)
    view = BatchView.from_bytes(assemble(header, payload, Compression.ZSTD, len(records)))
    assert decode_records(view, verify=True) == records


def test_other_libraries_payloads() -> None:
    import lz4.frame

    records = simple_records(50)
    body = _write_records(records, renumber=False)
    header = BatchHeader(last_offset_delta=49, max_timestamp=490)
    payloads = {
        Compression.GZIP: gzip.compress(body[:100]) + gzip.compress(body[100:]),  # 2 members
        Compression.LZ4: lz4.frame.compress(body, content_checksum=True, block_linked=True),
        Compression.SNAPPY: snappy_encode(body, xerial_compatible=False),
        Compression.ZSTD: zstandard.ZstdCompressor(level=19).compress(body),
    }
    for codec, payload in payloads.items():
        view = BatchView.from_bytes(assemble(header, payload, codec, len(records)))
        assert decode_records(view) == records, codec


def test_lz4_frames_as_kafka_java_writes_them() -> None:
    payload = compress(Compression.LZ4, b"x" * 200_000)
    flg = payload[4]
    assert payload[:4] == b"\x04\x22\x4d\x18"
    assert flg & 0x20  # independent blocks
    assert not flg & 0x04  # no content checksum (Kafka's Java reader never needed one)


def test_compression_levels() -> None:
    assert DEFAULT_LEVELS[Compression.ZSTD] == 3
    data = b"abcdefgh" * 10_000
    for codec in COMPRESSED:
        for level in (None, 1, 9):
            assert decompress(codec, compress(codec, data, level)) == data
    fast = compress(Compression.GZIP, data, 1)
    assert gzip.decompress(fast) == data


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.name.lower())
def test_bad_payloads_raise_decode_error(codec: Compression) -> None:
    header = BatchHeader(last_offset_delta=0, max_timestamp=0)
    for payload in (b"", b"\x00" * 10, b"garbage payload!" * 3, XERIAL_MAGIC + b"\0\0\0\1"):
        view = BatchView.from_bytes(assemble(header, payload, codec, 1))
        with pytest.raises(DecodeError):
            decode_records(view)
    good = compress(codec, _write_records(simple_records(3), renumber=False))
    view = BatchView.from_bytes(assemble(header, good[: len(good) // 2], codec, 3))
    with pytest.raises(DecodeError):
        decode_records(view)


def test_xerial_bad_blocks() -> None:
    header = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    for payload in (header[:10], header + b"\0\0", header + struct.pack(">i", 99) + b"ab"):
        with pytest.raises(DecodeError):
            decompress(Compression.SNAPPY, payload)
    assert decompress(Compression.SNAPPY, header) == b""


def test_unknown_codecs() -> None:
    with pytest.raises(DecodeError):
        decompress(6, b"")
    with pytest.raises(EncodeError):
        compress(6, b"")
    view = BatchView.from_bytes(encode_batch(BatchHeader(), simple_records(1)))
    bad = bytearray(view.raw)
    bad[22] |= 0x07  # attributes: codec 7
    broken = BatchView.from_bytes(bytes(bad))
    assert "compression=7" in repr(broken)
    with pytest.raises(DecodeError):
        decode_records(broken)
    with pytest.raises(EncodeError):
        encode_batch(BatchHeader(), simple_records(1), compression=5)


# --------------------------------------------------------------------------- header semantics


def test_offset_gaps_survive_dropping_records() -> None:
    header = BatchHeader(base_offset=1000, base_timestamp=10, partition_leader_epoch=4,
                         producer_id=77, producer_epoch=2, base_sequence=500)
    field = encode_batch(header, simple_records(6))
    new = rewrite_records(field, lambda b: [r for r in decode_records(b) if r.offset_delta % 2])
    (view,) = iter_batches(new)
    assert isinstance(view, BatchView)
    records = decode_records(view, verify=True)
    assert [record_offset(view, r) for r in records] == [1001, 1003, 1005]
    assert view.last_offset_delta == 5 and view.last_offset == 1005
    assert view.records_count == 3
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (77, 2, 500)
    assert view.partition_leader_epoch == 4
    # Drop the last record: lastOffsetDelta still covers it (the next batch starts after).
    new = rewrite_records(field, lambda b: decode_records(b)[:2])
    (view,) = iter_batches(new)
    assert isinstance(view, BatchView)
    assert view.last_offset_delta == 5 and view.records_count == 2


def test_renumber_for_produce() -> None:
    field = encode_batch(BatchHeader(base_timestamp=1), simple_records(5))
    new = rewrite_records(field, lambda b: decode_records(b)[1:], renumber=True)
    (view,) = iter_batches(new)
    assert isinstance(view, BatchView)
    assert [r.offset_delta for r in decode_records(view)] == [0, 1, 2, 3]
    assert view.last_offset_delta == 3
    assert [r.value for r in decode_records(view)] == [r.value for r in simple_records(5)[1:]]
    idempotent = BatchHeader(producer_id=9, producer_epoch=0, base_sequence=0,
                             last_offset_delta=4)
    with pytest.raises(EncodeError, match="sequence"):
        encode_batch(idempotent, simple_records(5)[1:], renumber=True)
    encode_batch(idempotent, simple_records(5), renumber=True)  # nothing dropped: fine
    with pytest.raises(EncodeError):
        encode_batch(BatchHeader(), [], renumber=True)


def test_offset_deltas_must_increase() -> None:
    records = simple_records(3)
    for bad in ([records[1], records[0]], [records[0], records[0]],
                [dataclasses.replace(records[0], offset_delta=-1)]):
        with pytest.raises(EncodeError):
            encode_batch(BatchHeader(), bad)


def test_last_offset_delta_grows_for_appended_records() -> None:
    view = BatchView.from_bytes(encode_batch(BatchHeader(last_offset_delta=2), simple_records(3)))
    more = [*decode_records(view), Record(7, 0, None, b"new")]
    again = BatchView.from_bytes(encode_batch(view, more))
    assert again.last_offset_delta == 7 and again.records_count == 4


def test_log_append_time_keeps_the_brokers_max_timestamp() -> None:
    header = BatchHeader(attributes=LOG_APPEND_TIME, base_timestamp=100, max_timestamp=999_999)
    view = BatchView.from_bytes(encode_batch(header, simple_records(3), compression=1))
    assert view.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert view.max_timestamp == 999_999
    records = decode_records(view)
    assert {record_timestamp(view, r) for r in records} == {999_999}
    again = BatchView.from_bytes(encode_batch(view, records[:1]))
    assert again.max_timestamp == 999_999 and again.timestamp_type == TimestampType.LOG_APPEND_TIME


def test_create_time_max_timestamp() -> None:
    header = BatchHeader(base_timestamp=100, max_timestamp=123)
    view = BatchView.from_bytes(encode_batch(header, simple_records(3)))
    assert view.max_timestamp == 120  # recomputed from the records: 100 + 20
    assert [record_timestamp(view, r) for r in decode_records(view)] == [100, 110, 120]
    forced = BatchView.from_bytes(encode_batch(header, simple_records(3), max_timestamp=5))
    assert forced.max_timestamp == 5
    horizon = BatchHeader(attributes=0x40, base_timestamp=100, max_timestamp=123)
    view = BatchView.from_bytes(encode_batch(horizon, simple_records(3)))
    assert view.has_delete_horizon and view.max_timestamp == 123


@pytest.mark.parametrize("kind", [ControlType.COMMIT, ControlType.ABORT])
def test_control_batches(kind: ControlType) -> None:
    header = BatchHeader(base_offset=50, attributes=TRANSACTIONAL | CONTROL, producer_id=3,
                         producer_epoch=1, base_timestamp=7)
    marker = encode_batch(header, [control_record(kind, coordinator_epoch=12)])
    data = encode_batch(BatchHeader(base_offset=40, attributes=TRANSACTIONAL, producer_id=3,
                                    producer_epoch=1, base_sequence=0), simple_records(3))
    field = data + marker
    batches = list(iter_batches(field))
    assert [b.is_control for b in batches if isinstance(b, BatchView)] == [False, True]
    view = batches[1]
    assert isinstance(view, BatchView)
    assert view.is_transactional
    (record,) = decode_records(view, verify=True)
    assert control_type(record) == kind
    assert record.key == struct.pack(">hh", 0, kind)
    assert record.value == struct.pack(">hi", 0, 12)
    assert encode_batch(view, [record]) == marker
    seen: list[bool] = []

    def upper(b: BatchView) -> list[Record]:
        seen.append(b.is_control)
        return [dataclasses.replace(r, value=(r.value or b"").upper()) for r in decode_records(b)]

    out = rewrite_records(field, upper)
    assert seen == [False]  # markers are not given to the function
    assert bytes(out)[len(data):] == marker
    seen.clear()
    rewrite_records(field, lambda b: None, include_control=True)
    with pytest.raises(DecodeError):
        control_type(Record(0, 0, None, None))


def test_control_type_unknown_kind() -> None:
    assert control_type(Record(0, 0, struct.pack(">hh", 0, 5), None)) == 5


def test_crc_is_recomputed_and_checked() -> None:
    data = encode_batch(BatchHeader(), simple_records(3))
    view = BatchView.from_bytes(data)
    records = decode_records(view)
    records[1].value = b"changed"
    changed = BatchView.from_bytes(encode_batch(view, records))
    assert changed.crc != view.crc and verify_crc(changed)
    assert google_crc32c.value(bytes(changed.raw[21:])) == changed.crc
    for pos in (21, 40, HEADER_SIZE + 3, len(data) - 1):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        broken = BatchView.from_bytes(bytes(bad))
        assert not verify_crc(broken)
        with pytest.raises(DecodeError, match="CRC"):
            decode_records(broken, verify=True)


def test_empty_batch_keeps_its_offsets() -> None:
    field = encode_batch(BatchHeader(base_offset=10, base_timestamp=3), simple_records(4),
                         compression=Compression.ZSTD)
    new = rewrite_records(field, lambda b: [])
    (view,) = iter_batches(new)
    assert isinstance(view, BatchView)
    assert view.records_count == 0 and view.last_offset == 13 and view.max_timestamp == 33
    assert decode_records(view) == []
    assert view.compression == Compression.NONE and len(view.raw) == HEADER_SIZE  # as Kafka


def test_an_empty_fetched_batch_can_be_a_control_batch_without_a_producer() -> None:
    """What librdkafka counts as progress (a control record), that no consumer relates to
    a transaction (no producer) and that still ends where the batch ended."""
    header = BatchHeader(base_offset=10, base_timestamp=3, producer_id=7, producer_epoch=1,
                         base_sequence=0, max_timestamp=99,
                         attributes=0x10 | TimestampType.LOG_APPEND_TIME << 3)
    field = encode_batch(header, simple_records(4), compression=Compression.ZSTD)
    untouched = encode_batch(BatchHeader(base_offset=14), simple_records(1))
    new = rewrite_records(field + untouched, lambda b: [] if b.base_offset == 10 else None,
                          empty_as_control=True)
    view, kept = iter_batches(new)
    assert isinstance(view, BatchView) and verify_crc(view)
    assert bytes(kept.raw) == untouched
    assert (view.is_control, view.is_transactional, view.producer_id, view.producer_epoch,
            view.base_sequence) == (True, False, -1, -1, -1)
    assert view.timestamp_type == TimestampType.LOG_APPEND_TIME and view.max_timestamp == 99
    assert view.last_offset == 13 and view.compression == Compression.NONE
    (marker,) = decode_records(view)
    assert control_type(marker) == ControlType.COMMIT and record_offset(view, marker) == 13
    # kafka-python's own decoder reads it so.
    theirs = DefaultRecordBatch(bytes(view.raw))
    assert theirs.is_control_batch and not theirs.has_producer_id()
    assert theirs.next_offset == 14 and theirs.validate_crc()
    # Without the option: as the log cleaner writes an empty batch.
    plain = BatchView.from_bytes(bytes(rewrite_records(field, lambda b: [])))
    assert (plain.is_control, plain.producer_id, plain.records_count) == (False, 7, 0)


# --------------------------------------------------------------------------- records fields


def three_batches() -> bytes:
    return b"".join(
        encode_batch(BatchHeader(base_offset=i * 10, base_timestamp=i), simple_records(3),
                     compression=codec)
        for i, codec in enumerate([Compression.NONE, Compression.LZ4, Compression.GZIP])
    )


def test_walk_several_batches() -> None:
    field = three_batches()
    entries = list(iter_batches(field))
    assert [e.base_offset for e in entries if isinstance(e, BatchView)] == [0, 10, 20]
    assert b"".join(bytes(e.raw) for e in entries) == field
    assert all(e.raw.obj is field for e in entries)  # zero-copy
    assert list(iter_batches(None)) == [] and list(iter_batches(b"")) == []
    assert "compression=LZ4" in repr(entries[1])


def test_mutable_inputs_are_copied_not_pinned() -> None:
    buf = bytearray(three_batches())
    entries = list(iter_batches(buf))
    buf.extend(b"more")  # would raise BufferError if a view pinned it
    assert isinstance(entries[0], BatchView) and entries[0].base_offset == 0
    view = memoryview(bytearray(three_batches()))
    assert len(list(iter_batches(view))) == 3
    field = three_batches()
    doubled = bytes(b for pair in zip(field, field, strict=True) for b in pair)
    for odd in (memoryview(doubled)[::2], memoryview(field).cast("b")):  # copied
        assert b"".join(bytes(e.raw) for e in iter_batches(odd)) == field


def test_truncated_trailing_batch_at_every_cut() -> None:
    field = three_batches()
    sizes = [len(e.raw) for e in iter_batches(field)]
    first_two = sizes[0] + sizes[1]
    for cut in range(first_two, len(field) + 1):
        data = field[:cut]
        entries = list(iter_batches(data))
        assert b"".join(bytes(e.raw) for e in entries) == data
        complete = [e for e in entries if isinstance(e, BatchView)]
        if cut == len(field):
            assert len(complete) == 3 and len(entries) == 3
        elif cut == first_two:
            assert len(entries) == 2
        else:
            assert len(complete) == 2
            tail = entries[-1]
            assert isinstance(tail, OpaqueEntry) and tail.kind == "truncated"
            # Rewriting keeps the partial batch as it is, after the rewritten ones.
            out = rewrite_records(data, lambda b: decode_records(b)[:1])
            assert bytes(out).endswith(bytes(tail.raw))


def legacy_message_set(magic: int, codec: int = 0) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=1000 + i if magic else None, key=b"k", value=b"legacy %d" % i)
    return bytes(builder.build())


@pytest.mark.parametrize(("magic", "codec"), [(0, 0), (1, 0), (1, 1), (0, 2)])
def test_legacy_message_sets_pass_untouched(magic: int, codec: int) -> None:
    legacy = legacy_message_set(magic, codec)
    v2 = encode_batch(BatchHeader(base_offset=3), simple_records(2))
    field = legacy + v2 + legacy
    entries = list(iter_batches(field))
    kinds = [(type(e).__name__, getattr(e, "kind", None), e.magic) for e in entries]
    n_legacy = len(entries) - 1
    assert kinds.count(("BatchView", None, 2)) == 1
    assert all(k == ("OpaqueEntry", "legacy", magic) for k in kinds if k[0] == "OpaqueEntry")
    assert n_legacy == (2 if codec else 6)  # compressed: one wrapper message per set
    out = rewrite_records(field, lambda b: [dataclasses.replace(r, value=b"new")
                                            for r in decode_records(b)])
    assert bytes(out).startswith(legacy) and bytes(out).endswith(legacy)
    (view,) = [e for e in iter_batches(out) if isinstance(e, BatchView)]
    assert {r.value for r in decode_records(view)} == {b"new"}


def test_rewrite_returns_the_input_when_nothing_changed() -> None:
    field = three_batches()
    assert rewrite_records(field, lambda b: None) is field
    view = memoryview(field)
    assert rewrite_records(view, lambda b: None) is view
    assert rewrite_records(None, lambda b: None) is None
    calls: list[int] = []

    def change_second(b: BatchView) -> list[Record] | None:
        calls.append(b.base_offset)
        return decode_records(b)[:1] if b.base_offset == 10 else None

    out = rewrite_records(field, change_second)
    assert calls == [0, 10, 20]
    old = list(iter_batches(field))
    new = list(iter_batches(out))
    assert bytes(new[0].raw) == bytes(old[0].raw) and bytes(new[2].raw) == bytes(old[2].raw)
    assert bytes(new[1].raw) != bytes(old[1].raw)


def test_public_exports() -> None:
    assert kafka_wire.iter_batches is iter_batches
    assert kafka_wire.Compression is Compression
    assert kafka_wire.rewrite_records is rewrite_records


# --------------------------------------------------------------------------- bad input


def test_bad_entries() -> None:
    good = encode_batch(BatchHeader(), simple_records(2))
    cases: dict[str, bytes] = {
        "negative size": struct.pack(">qi", 0, -5) + b"\0" * 60,
        "unknown magic": good[:16] + b"\x03" + good[17:],
        "too short v2": struct.pack(">qi", 0, 20) + b"\0\0\0\0\x02" + b"\0" * 15,
        "too short legacy": struct.pack(">qi", 0, 6) + b"\0\0\0\0\x00\0",
        "tiny entry": struct.pack(">qi", 0, 2) + b"\0\0",
    }
    for name, data in cases.items():
        with pytest.raises(DecodeError):
            list(iter_batches(data))
        assert name


def test_bad_records() -> None:
    body = _write_records(simple_records(3), renumber=False)
    header = BatchHeader(last_offset_delta=2, max_timestamp=20)

    def decode(payload: bytes, count: int = 3) -> list[Record]:
        return decode_records(BatchView.from_bytes(assemble(header, payload, 0, count)))

    assert decode(body) == simple_records(3)
    for payload, count in [
        (body, 4),  # one record too many
        (body, 2),  # bytes left over
        (body, -1),
        (body, 10_000),  # cannot fit
        (body[:-1], 3),
        (body + b"\0", 3),
        (b"\x0c\x00\x00\x00\x03\x00\x00" + b"\0" * 30, 1),  # key length -2
        (b"\x0c\x00\x00\x00\x00\x03\x00" + b"\0" * 30, 1),  # value length -2
        (b"\x0c\x00\x00\x00\x00\x00\x03" + b"\0" * 30, 1),  # header count -2
        (b"\x0e\x00\x00\x00\x00\x00\x02\x03\x00" + b"\0" * 30, 1),  # header key length -2
        (b"\x10\x00\x00\x00\x00\x00\x02\x00\x03" + b"\0" * 30, 1),  # header value length -2
        (b"\x20\x00" + b"\xff" * 12 + b"\0" * 30, 1),  # endless varint
    ]:
        with pytest.raises(DecodeError):
            decode(payload, count)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_garbage_raises_only_decode_error(data: st.DataObject) -> None:
    codec = data.draw(st.sampled_from(CODECS))
    field = encode_batch(BatchHeader(), simple_records(4), compression=codec)
    field += encode_batch(BatchHeader(base_offset=4), simple_records(2))
    mutated = bytearray(field)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(mutated) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(mutated)))
    try:
        for entry in iter_batches(bytes(mutated[:cut])):
            if isinstance(entry, BatchView):
                verify_crc(entry)
                decode_records(entry)
    except DecodeError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    try:
        for entry in iter_batches(data):
            if isinstance(entry, BatchView):
                decode_records(entry)
    except DecodeError:
        pass


def test_encode_errors() -> None:
    cases: list[Callable[[], object]] = [
        lambda: encode_batch(BatchHeader(), [Record(0, 2**63, None, None)]),
        lambda: encode_batch(BatchHeader(), [Record(2**31, 0, None, None)]),
        lambda: encode_batch(BatchHeader(), [Record(0, 0, None, None, [], 300)]),
        lambda: encode_batch(BatchHeader(base_offset=2**63), [Record(0, 0, None, None)]),
        lambda: encode_batch(BatchHeader(producer_epoch=2**15), [Record(0, 0, None, None)]),
    ]
    for case in cases:
        with pytest.raises(EncodeError):
            case()


@settings(max_examples=60, deadline=None)
@given(batch=batches(), codec=st.sampled_from([Compression.NONE, Compression.LZ4]))
def test_decode_field_reads_what_decode_records_reads(
        batch: tuple[BatchHeader, list[Record]], codec: Compression) -> None:
    header, records = batch
    view = BatchView.from_bytes(encode_batch(header, records, compression=codec))
    values = decode_field(view)
    keys = decode_field(view, "key")
    assert [None if v is None else bytes(v) for v in values] == [r.value for r in records]
    assert [None if k is None else bytes(k) for k in keys] == [r.key for r in records]


@given(st.binary(max_size=200), st.integers(1, 6))
def test_decode_field_refuses_what_does_not_fit(payload: bytes, count: int) -> None:
    header = BatchHeader(records_count=count)
    data = assemble(header, payload, Compression.NONE, count)
    try:
        values = decode_field(BatchView.from_bytes(data))
    except DecodeError:
        return
    assert len(values) == count  # whatever parses is one value per record, nothing else


def test_a_truncated_tail_is_kept_as_it_is_or_left_out_when_asked() -> None:
    whole = encode_batch(BatchHeader(base_timestamp=1), simple_records(3))
    second = encode_batch(BatchHeader(base_offset=3, base_timestamp=1), simple_records(3))
    field = whole + second[:-5]  # a Fetch answer cut inside its second batch
    assert rewrite_records(field, lambda b: None) is field
    assert rewrite_records(field, lambda b: None, drop_truncated=True) == whole
    assert rewrite_records(whole, lambda b: None, drop_truncated=True) is whole

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

Modules: ``_batch`` (values, the header, views, walking a records field, CRC),
``_codec`` (records decoding and encoding, whole batches, rewriting a records field);
compression lives in :mod:`kafka_wire.compression`. Semantics, choices and numbers:
docs/records.md.
"""

from kafka_wire.compression import Compression
from kafka_wire.records._batch import (
    HEADER_SIZE,
    MAGIC_V2,
    BatchHeader,
    BatchView,
    ControlType,
    Entry,
    OpaqueEntry,
    Record,
    TimestampType,
    control_record,
    control_type,
    iter_batches,
    record_offset,
    record_timestamp,
    verify_crc,
)
from kafka_wire.records._codec import (
    decode_field,
    decode_records,
    encode_batch,
    rewrite_records,
    with_base_sequence,
)

__all__ = [
    "HEADER_SIZE",
    "MAGIC_V2",
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
    "decode_field",
    "decode_records",
    "encode_batch",
    "iter_batches",
    "record_offset",
    "record_timestamp",
    "rewrite_records",
    "verify_crc",
    "with_base_sequence",
]

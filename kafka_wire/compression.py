"""The compression codecs of Kafka record batches: gzip, snappy, lz4, zstd (all via cramjam).

No I/O. ``decompress`` raises only :class:`DecodeError`, ``compress`` only
:class:`EncodeError`. See docs/records.md for the choices:

- snappy comes in two framings: raw snappy (librdkafka, Sarama, kafka-python by default)
  and xerial's block framing (the Java producer, through snappy-java's
  SnappyOutputStream): ``b"\\x82SNAPPY\\x00"``, int32 version, int32 compatible version,
  then ``int32 length + raw snappy block`` repeated. Both are read; ``compress`` writes
  raw unless ``xerial=True`` (every Kafka reader accepts both).
- lz4 is the LZ4 *frame* format (magic v2 batches; magic 0/1 had a broken header
  checksum, which is not ours to handle: legacy message sets are never decompressed).
  Written with independent blocks and no content checksum, as Kafka's Java writer does.
- zstd frames need not declare their content size (Java's zstd-jni streaming writer
  does not): cramjam decompresses them in streaming mode, unlike zstandard's one-shot
  ``decompress``.
- gzip may hold several members; all are read.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import cramjam

from kafka_wire.errors import DecodeError, EncodeError

Buffer = bytes | bytearray | memoryview


class Compression(enum.IntEnum):
    """Bits 0-2 of a record batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


# Levels for re-compressing a batch the gateway changed. A proxy pays the compression
# cost on the request path, so these lean towards speed where the size cost is small
# (numbers in docs/records.md): gzip 3 is ~3x faster than zlib's default 6 for ~4% more
# bytes; lz4 1 is LZ4's fast mode (what librdkafka writes by default; level 9, LZ4-HC, is
# ~15x slower); zstd 3 is zstd's, Kafka's and librdkafka's default. Snappy has no levels.
DEFAULT_LEVELS: Mapping[Compression, int | None] = MappingProxyType(
    {
        Compression.NONE: None,
        Compression.GZIP: 3,
        Compression.SNAPPY: None,
        Compression.LZ4: 1,
        Compression.ZSTD: 3,
    }
)

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, compatible with 1
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block size
_INT32 = struct.Struct(">i")


def is_xerial(payload: Buffer) -> bool:
    """True when a snappy payload uses xerial's block framing (the Java producer's)."""
    return bytes(payload[:8]) == XERIAL_MAGIC


#: The most a batch payload may decompress to. A few KiB of zstd or gzip can expand to
#: gigabytes ("zip bomb"); past this, decompress() stops and raises DecodeError.
MAX_DECOMPRESSED = 64 * 1024 * 1024
_FIRST_GUESS = 8  # a first output buffer of 8x the payload fits typical Kafka batches


def decompress(codec: Compression | int, payload: Buffer,
               max_size: int = MAX_DECOMPRESSED) -> bytes:
    """The uncompressed bytes of a batch payload; DecodeError if it is not valid or
    would exceed `max_size` bytes (checked while decompressing, never after)."""
    try:
        if codec == Compression.NONE:
            return bytes(payload)
        if codec == Compression.GZIP:
            return _bounded(cramjam.gzip, payload, max_size, _gzip_size(payload))
        if codec == Compression.SNAPPY:
            if is_xerial(payload):
                return _xerial_decompress(payload, max_size)
            _check_snappy_length(payload, max_size)
            return bytes(cramjam.snappy.decompress_raw(payload))
        if codec == Compression.LZ4:
            return _bounded(cramjam.lz4, payload, max_size, _lz4_size(payload))
        if codec == Compression.ZSTD:
            return _bounded(cramjam.zstd, payload, max_size, _zstd_size(payload))
    except cramjam.DecompressionError as exc:
        raise DecodeError(f"bad {_name(codec)} payload: {exc}") from None
    raise DecodeError(f"unknown compression codec {int(codec)}")


def declared_size(codec: Compression | int, payload: Buffer) -> int | None:
    """What a payload says it decompresses to, read from its first (or last) bytes
    without decompressing: gzip's ISIZE, lz4's and zstd's frame content size, raw
    snappy's length, the payload itself uncompressed; None when it does not say. A
    bomb may lie low, never high enough to matter: decompress() caps while it works."""
    if codec == Compression.NONE:
        return len(payload)
    if codec == Compression.GZIP:
        return _gzip_size(payload)
    if codec == Compression.LZ4:
        return _lz4_size(payload)
    if codec == Compression.ZSTD:
        return _zstd_size(payload)
    if codec == Compression.SNAPPY and not is_xerial(payload):
        length = shift = 0
        for byte in bytes(payload[:5]):
            length |= (byte & 0x7F) << shift
            if byte < 0x80:
                return length
            shift += 7
    return None


def _bounded(codec: Any, payload: Buffer, max_size: int, declared: int | None) -> bytes:
    """Decompress into buffers that grow 4x up to `max_size`: cramjam stops as soon as
    one is full, so a bomb costs at most about 2x `max_size` of work and memory.

    The first buffer is the size the payload declares (a hint only: a bomb may lie),
    else a guess from the payload's size.
    """
    if declared is not None and len(payload) <= declared:
        size = min(max_size, declared)
    else:
        size = min(max_size, max(64 * 1024, _FIRST_GUESS * len(payload)))
    while True:
        out = bytearray(size)
        try:
            written = codec.decompress_into(payload, out)
        except cramjam.DecompressionError as exc:
            if "failed to write whole buffer" not in str(exc):
                raise
            if size >= max_size:
                raise DecodeError(f"payload decompresses to more than {max_size} bytes") \
                    from None
            size = min(max_size, size * 4)
            continue
        del out[written:]
        return bytes(out)


def _gzip_size(payload: Buffer) -> int | None:
    """ISIZE, the last member's uncompressed size mod 2**32 (RFC 1952)."""
    return int.from_bytes(payload[-4:], "little") if len(payload) >= 18 else None


def _lz4_size(payload: Buffer) -> int | None:
    """The LZ4 frame's content size, when its FLG byte says one is there."""
    head = bytes(payload[:14])
    if len(head) < 14 or head[:4] != b"\x04\x22\x4d\x18" or not head[4] & 0x08:
        return None
    return int.from_bytes(head[6:14], "little")


def _zstd_size(payload: Buffer) -> int | None:
    """The zstd frame's Frame_Content_Size, when its header has one (RFC 8878 3.1.1.1)."""
    head = bytes(payload[:18])
    if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
        return None
    descriptor = head[4]
    single_segment = bool(descriptor & 0x20)
    field = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    if not field:
        return None
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 0x03]
    if len(head) < start + field:
        return None
    size = int.from_bytes(head[start : start + field], "little")
    return size + 256 if field == 2 else size


def _check_snappy_length(block: Buffer, max_size: int, before: int = 0) -> None:
    """Raw snappy starts with the uncompressed length (a varint): check it first
    (`before`: bytes earlier blocks of the payload already gave)."""
    length = shift = 0
    for byte in bytes(block[:5]):
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    if before + length > max_size:
        raise DecodeError(f"payload decompresses to more than {max_size} bytes")


def compress(
    codec: Compression | int,
    data: Buffer,
    level: int | None = None,
    *,
    xerial: bool = False,
) -> bytes:
    """Compress a batch payload; ``level`` None means :data:`DEFAULT_LEVELS`."""
    if codec not in _CODECS:
        raise EncodeError(f"unknown compression codec {int(codec)}")
    codec = Compression(codec)
    if level is None:
        level = DEFAULT_LEVELS[codec]
    try:
        if codec == Compression.NONE:
            return bytes(data)
        if codec == Compression.GZIP:
            return bytes(cramjam.gzip.compress(data, level=level))
        if codec == Compression.SNAPPY:
            if xerial:
                return _xerial_compress(data)
            return bytes(cramjam.snappy.compress_raw(data))
        if codec == Compression.LZ4:
            compressor = cramjam.lz4.Compressor(level, content_checksum=False, block_linked=False)
            compressor.compress(data)
            return bytes(compressor.finish())
        return bytes(cramjam.zstd.compress(data, level=level))
    except (cramjam.CompressionError, OverflowError, TypeError) as exc:
        raise EncodeError(f"cannot {_name(codec)}-compress: {exc}") from None


_CODECS = frozenset(int(c) for c in Compression)


def _name(codec: Compression | int) -> str:
    return Compression(codec).name.lower() if codec in _CODECS else str(int(codec))


def _xerial_decompress(payload: Buffer, max_size: int = MAX_DECOMPRESSED) -> bytes:
    view = memoryview(payload)
    if len(view) < len(_XERIAL_HEADER):
        raise DecodeError("xerial snappy payload shorter than its header")
    out = bytearray()
    pos = len(_XERIAL_HEADER)
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise DecodeError("xerial snappy block length cut short")
        (size,) = _INT32.unpack_from(view, pos)
        pos += 4
        if size < 0 or pos + size > end:
            raise DecodeError(f"xerial snappy block of {size} bytes runs past the payload")
        block = view[pos : pos + size]
        _check_snappy_length(block, max_size, len(out))
        out += cramjam.snappy.decompress_raw(block)
        pos += size
    return bytes(out)


def _xerial_compress(data: Buffer) -> bytes:
    view = memoryview(data)
    out = bytearray(_XERIAL_HEADER)
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK])
        out += _INT32.pack(len(block))
        out += block
    return bytes(out)


__all__ = [
    "DEFAULT_LEVELS",
    "XERIAL_MAGIC",
    "Compression",
    "compress",
    "decompress",
    "is_xerial",
]

"""decompress() refuses payloads that would expand past a limit, while expanding."""

from __future__ import annotations

import os

import cramjam
import pytest

from kafka_wire.compression import Compression, compress, decompress
from kafka_wire.errors import DecodeError

CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


@pytest.mark.parametrize(("codec", "xerial"),
                         [*((c, False) for c in CODECS), (Compression.SNAPPY, True)])
def test_payloads_up_to_the_limit_decompress_exactly(codec: Compression, xerial: bool) -> None:
    data = os.urandom(50_000) + b"z" * 150_000  # 200,000 bytes, far more than 8x the payload
    payload = compress(codec, data, xerial=xerial)
    assert decompress(codec, payload, max_size=len(data)) == data
    with pytest.raises(DecodeError, match="more than 199999 bytes"):
        decompress(codec, payload, max_size=len(data) - 1)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_a_bomb_is_stopped_without_expanding_it(codec: Compression) -> None:
    module = {Compression.GZIP: cramjam.gzip, Compression.LZ4: cramjam.lz4,
              Compression.ZSTD: cramjam.zstd}[codec]
    bomb = bytes(module.compress(b"\0" * (200 * 1024 * 1024)))  # 200 MiB of zeros
    assert len(bomb) < 1024 * 1024
    with pytest.raises(DecodeError, match="more than 67108864 bytes"):
        decompress(codec, bomb)  # the default limit: 64 MiB


def test_snappy_declares_its_length_and_is_refused_before_decompressing() -> None:
    bomb = bytes(cramjam.snappy.compress_raw(b"\0" * (100 * 1024 * 1024)))
    with pytest.raises(DecodeError, match="more than"):
        decompress(Compression.SNAPPY, bomb)

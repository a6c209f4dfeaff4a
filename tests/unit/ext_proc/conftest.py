"""Helpers shared by the ext_proc unit tests: record batches of JSON documents."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from kafka_wire.records import (
    BatchHeader,
    BatchView,
    Record,
    decode_records,
    encode_batch,
    iter_batches,
)


def json_batch(docs: Iterable[dict[str, Any]], **header: Any) -> bytes:
    """One record batch whose record values are `docs` as JSON (header fields as given)."""
    records = [Record(i, 0, None, orjson.dumps(d), []) for i, d in enumerate(docs)]
    return encode_batch(BatchHeader(base_timestamp=1_700_000_000_000, **header), records)


def only_batch(records: bytes) -> BatchView:
    """The one batch `records` holds."""
    (view,) = iter_batches(records)
    assert isinstance(view, BatchView)
    return view


def json_values(records: bytes) -> list[Any]:
    """The record values of the one batch `records` holds, parsed as JSON."""
    return [orjson.loads(r.value or b"") for r in decode_records(only_batch(records))]

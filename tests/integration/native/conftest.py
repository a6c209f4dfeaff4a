"""Helpers the native data path's tests share."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition


def consume(conf: dict[str, Any], topic: str, expected: int | None = None) -> list[bytes]:
    """The values of partition 0 of `topic` read with `conf` from its start: `expected`
    of them (by default, up to the high watermark), or what came within 30 s."""
    consumer = Consumer({"auto.offset.reset": "earliest", "enable.auto.commit": False, **conf})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        want = high if expected is None else expected
        deadline = time.monotonic() + 30
        while len(values) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value() or b"")
    finally:
        consumer.close()
    return values

"""The copy action's Kafka sink against the real broker: the exact records it wrote."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from filter_rules.record_actions import CopySpec
from interceptors import BuildContext, InterceptedRecord
from interceptors.builtin import BUILDERS
from interceptors.side_effects import DataPathSideEffects, KafkaCopySink
from keg.embedded.kafka import EmbeddedKafka
from tests.integration.conftest import create_topic

pytestmark = pytest.mark.integration


def _read(bootstrap: str, topic: str, count: int) -> list[tuple[Any, ...]]:
    """(key, value, headers, timestamp) of the first `count` records of partition 0."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[Any, ...]] = []
    try:
        while len(out) < count:
            msg = consumer.poll(30)
            assert msg is not None, f"only {len(out)} of {count} copies arrived"
            assert msg.error() is None, msg.error()
            out.append((msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1]))
    finally:
        consumer.close()
    return out


def test_kafka_sink_writes_exact_copies(kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap)
    sink = KafkaCopySink(kafka.bootstrap)
    records = [
        InterceptedRecord(
            "orders", 0, b"k1", b'{"a":1}', [("h", b"1"), ("n", None)], 1_700_000_000_000
        ),
        InterceptedRecord("orders", 0, None, None, [], 1_700_000_000_001),
        InterceptedRecord("orders", 0, b"k3", b"\x00\xff", [("h", b"")], 1_700_000_000_002),
    ]
    assert all(sink.send(topic, r) for r in records)
    assert sink.close(timeout=30) == 0
    assert (sink.queued, sink.sent, sink.failed, sink.dropped) == (3, 3, 0, 0)
    assert _read(kafka.bootstrap, topic, 3) == [
        (b"k1", b'{"a":1}', [("h", b"1"), ("n", None)], 1_700_000_000_000),
        (None, None, [], 1_700_000_000_001),
        (b"k3", b"\x00\xff", [("h", b"")], 1_700_000_000_002),
    ]


def test_copy_action_through_data_path_side_effects(kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap)
    effects = DataPathSideEffects(kafka.bootstrap)
    ctx = BuildContext(side_effects=effects)
    copy = BUILDERS["copy"](
        CopySpec.model_validate({"topic": topic, "when": {"headers": {"copy": None}}}), ctx
    )
    kept = InterceptedRecord("orders", 0, b"a", b"copied", [("copy", b"yes")], 1_700_000_000_000)
    skipped = InterceptedRecord("orders", 0, b"b", b"not copied", [], 1_700_000_000_001)
    assert copy.intercept(kept) is kept
    assert copy.intercept(skipped) is skipped
    effects.close(timeout=30)
    assert effects.counters()["kafka"] == {"queued": 1, "sent": 1, "failed": 0, "dropped": 0}
    assert _read(kafka.bootstrap, topic, 1) == [
        (b"a", b"copied", [("copy", b"yes")], 1_700_000_000_000)
    ]

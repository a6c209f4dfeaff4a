"""Producing, reading and auditing as the record-rule tests do.

librdkafka (confluent_kafka) producers and consumers with the settings these tests
need, and the gateway's audit log (JSON Lines) read per topic.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

Headers = list[tuple[str, bytes | None]]


def produce(bootstrap: str, topic: str, values: list[bytes | None], retries: int = 0,
            headers: list[Headers] | None = None) -> list[str | None]:
    """The delivery error name of each value (None: stored), produced as one batch;
    `retries` 0: a retriable refusal is reported, not retried."""
    errors: list[str | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "retries": retries,
                         "message.timeout.ms": 20000})
    for index, value in enumerate(values):
        producer.produce(topic, value, headers=headers[index] if headers else None,  # type: ignore[arg-type]
                         on_delivery=lambda err, _m: errors.append(
                             None if err is None else err.name()))
    producer.flush(30)
    assert len(errors) == len(values)
    return errors


Rec = tuple[bytes | None, bytes | None, Headers]  # key, value, headers


def consume_records(conf: dict[str, Any], topic: str, timeout: float = 30) -> list[Rec]:
    """Every record of partition 0 from the start to its end, read by a librdkafka
    consumer with `conf` (its settings win over ours): key, value and headers."""
    consumer = Consumer({"group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         **conf})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[Rec] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return out
                raise KafkaException(error)
            out.append((msg.key(), msg.value(), list(msg.headers() or [])))  # type: ignore[arg-type]
    finally:
        consumer.close()
    raise AssertionError(f"no end of {topic} within {timeout} s; got {len(out)}")


def consume(bootstrap: str, topic: str, timeout: float = 30) -> list[tuple[bytes | None, Headers]]:
    """Every record of partition 0 from the start to its end: value and headers."""
    return [(value, headers) for _key, value, headers
            in consume_records({"bootstrap.servers": bootstrap}, topic, timeout)]


def values(records: list[tuple[bytes | None, Headers]]) -> list[bytes | None]:
    return [value for value, _headers in records]


class AuditLog:
    """The gateway's audit log, read per topic."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def events(self, topic: str) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        events = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [e for e in events if e.get("topic") == topic]

    def wait_for(self, topic: str, outcome: str, timeout: float = 30) -> dict[str, Any]:
        """The first event of `topic` with `outcome`, waiting for it to be written."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events(topic):
                if event["outcome"] == outcome:
                    return event
            time.sleep(0.1)
        raise AssertionError(f"no {outcome} audit event for {topic}: {self.events(topic)}")

    def withheld_at_fetch(self, bootstrap: str, topic: str, timeout: float = 30
                          ) -> tuple[list[bytes | None], dict[str, Any]]:
        """Consume `topic` through `bootstrap` until the gateway audits an `unavailable`
        refusal for it: what the consumer got meanwhile, and the event."""
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                             "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes | None] = []
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not self.events(topic):
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
            return got, self.wait_for(topic, "unavailable")
        finally:
            consumer.close()

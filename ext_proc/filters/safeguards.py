"""Safeguard checks and rate limits: the parts of request-level rules that need state
or a look inside record batches.

Safeguards read batch headers (61 bytes each, no decompression) for compression,
idempotence, transactions and batch size; records are decompressed only when a
check needs them (record size, headers). Rates are token buckets shared by every
connection of the process, keyed by rule and principal, client id or topic.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from filter_rules.errors import SAFEGUARD_ERRORS, error_code
from filter_rules.model import RateSpec, SafeguardSpec
from kafka_wire.errors import KafkaWireError
from kafka_wire.records import BatchView, decode_records, iter_batches
from kafka_wire.topic_ids import TopicIds, topic_name


@dataclass(frozen=True)
class Violation:
    check: str
    error_code: int
    reason: str


def _batches(body: dict[str, Any], topic: str | None,
             topic_ids: TopicIds) -> Iterator[BatchView]:
    for entry in body.get("TopicData") or ():
        if topic is not None and topic_name(entry, topic_ids) != topic:
            continue
        for partition in entry.get("PartitionData") or ():
            for batch in iter_batches(partition.get("Records")):
                if isinstance(batch, BatchView):
                    yield batch


def _error(spec: SafeguardSpec, check: str) -> int:
    return error_code(spec.error) if spec.error else SAFEGUARD_ERRORS[check]


def produce_violations(spec: SafeguardSpec, body: dict[str, Any], topic: str | None,
                       topic_ids: TopicIds) -> list[Violation]:
    """What a Produce request (or its part for `topic`) breaks of `spec`; v13+ names
    topics by id (`topic_ids`)."""
    found: list[Violation] = []

    def fail(check: str, reason: str) -> None:
        found.append(Violation(check, _error(spec, check), reason))

    if spec.read_only:
        fail("read_only", "the topic is read-only")
    if spec.forbid_acks_zero and body.get("Acks") == 0:
        fail("forbid_acks_zero", "acks=0 is not allowed")
    if spec.require_transactions and body.get("TransactionalId") is None:
        fail("require_transactions", "a transactional producer is required")
    needs_records = spec.max_record_bytes is not None or spec.max_headers is not None \
        or spec.require_headers is not None
    try:
        for batch in _batches(body, topic, topic_ids):
            if spec.require_idempotence and batch.producer_id < 0:
                fail("require_idempotence", "an idempotent producer is required")
            if spec.max_batch_bytes is not None and len(batch.raw) > spec.max_batch_bytes:
                fail("max_batch_bytes",
                     f"batch of {len(batch.raw)} bytes exceeds {spec.max_batch_bytes}")
            if spec.compression is not None:
                codec = batch.compression.name.lower()
                if (spec.compression.require is not None
                        and codec not in spec.compression.require) or (
                        spec.compression.forbid is not None and codec in spec.compression.forbid):
                    fail("compression", f"compression {codec} is not allowed")
            if needs_records:
                found += _record_violations(spec, batch)
    except KafkaWireError as err:
        found.append(Violation("records", _error(spec, "max_headers"), f"unreadable batch: {err}"))
    return found


def _record_violations(spec: SafeguardSpec, batch: BatchView) -> list[Violation]:
    found = []
    for record in decode_records(batch):
        size = len(record.key or b"") + len(record.value or b"") + sum(
            len(k) + len(v or b"") for k, v in record.headers)
        if spec.max_record_bytes is not None and size > spec.max_record_bytes:
            found.append(Violation("max_record_bytes", _error(spec, "max_record_bytes"),
                                   f"record of {size} bytes exceeds {spec.max_record_bytes}"))
        if spec.max_headers is not None and len(record.headers) > spec.max_headers:
            found.append(Violation("max_headers", _error(spec, "max_headers"),
                                   f"{len(record.headers)} headers exceed {spec.max_headers}"))
        if spec.require_headers is not None:
            names = {k for k, _ in record.headers}
            missing = [h for h in spec.require_headers if h not in names]
            if missing:
                found.append(Violation("require_headers", _error(spec, "require_headers"),
                                       f"record lacks header(s) {', '.join(missing)}"))
        if found:
            break  # one offending record is enough to refuse the batch
    return found


def clamp_fetch(spec: SafeguardSpec, body: dict[str, Any]) -> bool:
    """Lower a Fetch request's byte limits to `max_fetch_bytes`; True when changed."""
    limit = spec.max_fetch_bytes
    if limit is None:
        return False
    changed = False
    if body.get("MaxBytes", 0) > limit:
        body["MaxBytes"] = limit
        changed = True
    for topic in body.get("Topics") or ():
        for partition in topic.get("Partitions") or ():
            if partition.get("PartitionMaxBytes", 0) > limit:
                partition["PartitionMaxBytes"] = limit
                changed = True
    return changed



def produce_bytes(body: dict[str, Any]) -> int:
    return sum(len(p.get("Records") or b"") for t in body.get("TopicData") or ()
               for p in t.get("PartitionData") or ())


class TokenBucket:
    """Requests and bytes per second with a burst allowance; time in seconds."""

    def __init__(self, spec: RateSpec, now: float) -> None:
        self.spec = spec
        self.requests = (spec.requests_per_second or 0) * spec.burst_seconds
        self.bytes = float((spec.bytes_per_second or 0) * spec.burst_seconds)
        self.updated = now

    def take(self, nbytes: int, now: float) -> float:
        """Spend one request and `nbytes`; return seconds the caller is over its rate."""
        spec, elapsed = self.spec, max(0.0, now - self.updated)
        self.updated = now
        wait = 0.0
        if spec.requests_per_second:
            cap = spec.requests_per_second * spec.burst_seconds
            self.requests = min(cap, self.requests + elapsed * spec.requests_per_second) - 1
            if self.requests < 0:
                wait = max(wait, -self.requests / spec.requests_per_second)
        if spec.bytes_per_second:
            cap = spec.bytes_per_second * spec.burst_seconds
            self.bytes = min(cap, self.bytes + elapsed * spec.bytes_per_second) - nbytes
            if self.bytes < 0:
                wait = max(wait, -self.bytes / spec.bytes_per_second)
        return wait


class RateLimiter:
    """Buckets for every (rule, key) seen; shared by all connections of the process."""

    def __init__(self, clock: Any = time.monotonic, max_buckets: int = 100_000) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._max_buckets = max_buckets

    def take(self, rule_id: str, spec: RateSpec, key: str, nbytes: int) -> float:
        now = self._clock()
        bucket = self._buckets.get((rule_id, key))
        if bucket is None or bucket.spec is not spec:
            if len(self._buckets) >= self._max_buckets:
                self._buckets.clear()  # a flood of keys must not grow memory without bound
            bucket = self._buckets[(rule_id, key)] = TokenBucket(spec, now)
        return bucket.take(nbytes, now)

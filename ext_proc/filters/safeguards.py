"""Safeguard checks and rate limits: the parts of request-level rules that need state
or a look inside record batches.

Safeguards read batch headers (61 bytes each, no decompression) for compression,
idempotence, transactions and batch size; records are decompressed only when a
check needs them (record size, headers). Rates are in `ext_proc.filters.rates`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from filter_rules.errors import SAFEGUARD_ERRORS, error_code
from filter_rules.model import CompressionPolicy, SafeguardSpec
from kafka_wire.errors import KafkaWireError
from kafka_wire.records import BatchView, decode_records, iter_batches
from kafka_wire.topic_ids import TopicIds, topic_name


@dataclass(frozen=True)
class Violation:
    check: str
    error_code: int
    reason: str
    # Where, for a check of one record: its topic, partition and index in its batch
    # (what Produce v8+ answers in RecordErrors). None for request and batch checks.
    record: tuple[str, int, int] | None = None


def _batches(body: dict[str, Any], topic: str | None,
             topic_ids: TopicIds) -> Iterator[tuple[str, int, BatchView]]:
    for entry in body.get("TopicData") or ():
        name = topic_name(entry, topic_ids)
        if topic is not None and name != topic:
            continue
        for partition in entry.get("PartitionData") or ():
            for batch in iter_batches(partition.get("Records")):
                if isinstance(batch, BatchView):
                    yield name or "", partition.get("Index", 0), batch


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
        for name, partition, batch in _batches(body, topic, topic_ids):
            if spec.require_idempotence and batch.producer_id < 0:
                fail("require_idempotence", "an idempotent producer is required")
            if spec.max_batch_bytes is not None and len(batch.raw) > spec.max_batch_bytes:
                fail("max_batch_bytes",
                     f"batch of {len(batch.raw)} bytes exceeds {spec.max_batch_bytes}")
            if spec.compression is not None:
                codec = batch.compression.name.lower()
                if spec.compression.refuses(codec, len(batch.raw)):
                    fail("compression", _compression_reason(spec.compression, codec,
                                                            len(batch.raw)))
            if needs_records:
                found += _record_violations(spec, name, partition, batch)
    except KafkaWireError as err:
        found.append(Violation("records", _error(spec, "max_headers"), f"unreadable batch: {err}"))
    return found


# Kafka's codec ids, as record batch attributes carry them.
CODEC_IDS: Final = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@dataclass(frozen=True)
class CompressionCheck:
    """A compression policy as keg's module reads it: the codec ids it refuses, and the
    size below which an uncompressed batch passes anyway."""

    refused: frozenset[int]
    uncompressed_below: int

    @classmethod
    def of(cls, policy: CompressionPolicy) -> CompressionCheck:
        # A batch too large for the uncompressed allowance: what the codec alone decides.
        refused = frozenset(codec for name, codec in CODEC_IDS.items()
                            if policy.refuses(name, 2**31))
        return cls(refused, policy.allow_uncompressed_below_bytes)


@dataclass(frozen=True)
class ProduceChecks:
    """What a Produce request must keep for no safeguard of a set to act on it: the
    union of their checks, applied to every batch whatever its topic (keg's module
    passes such a request natively, envoy/kafka_filter/src/core/safeguard.rs)."""

    acks_not_zero: bool = False
    idempotent: bool = False
    transactional: bool = False
    max_batch_bytes: int | None = None
    compression: frozenset[CompressionCheck] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {"acks_not_zero": self.acks_not_zero, "idempotent": self.idempotent,
                "transactional": self.transactional, "max_batch_bytes": self.max_batch_bytes,
                "compression": sorted(({"refused": sorted(c.refused),
                                        "uncompressed_below": c.uncompressed_below}
                                       for c in self.compression),
                                      key=lambda c: (c["refused"], c["uncompressed_below"]))}


# Checks that read records, or refuse whatever a request holds: the module leaves them
# to the Python chain (every request they may act on is handed off).
_RECORD_CHECKS: Final = ("max_record_bytes", "max_headers", "require_headers", "read_only")


def produce_checks(specs: Iterable[SafeguardSpec]) -> ProduceChecks | None:
    """The checks of these safeguards a Produce request can be shown to keep from its
    head and batch headers; None when one of them needs more (records read, or a
    `read_only` topic: every request to it is refused)."""
    found: list[ProduceChecks | None] = []
    for spec in specs:
        if any(getattr(spec, name) not in (None, False) for name in _RECORD_CHECKS):
            return None
        compression = (frozenset({CompressionCheck.of(spec.compression)})
                       if spec.compression else frozenset[CompressionCheck]())
        found.append(ProduceChecks(spec.forbid_acks_zero, spec.require_idempotence,
                                   spec.require_transactions, spec.max_batch_bytes,
                                   compression))
    return union_checks(found)


def union_checks(found: Iterable[ProduceChecks | None]) -> ProduceChecks | None:
    """Every check of each (a request must keep them all); None when one is None, or
    there are none (nothing says what would let a request pass)."""
    union: ProduceChecks | None = None
    for checks in found:
        if checks is None:
            return None
        if union is None:
            union = checks
            continue
        limits = [b for b in (union.max_batch_bytes, checks.max_batch_bytes) if b is not None]
        union = ProduceChecks(union.acks_not_zero or checks.acks_not_zero,
                              union.idempotent or checks.idempotent,
                              union.transactional or checks.transactional,
                              min(limits) if limits else None,
                              union.compression | checks.compression)
    return union


def safeguard_checks(f: object, api_key: int, api_version: int,
                     direction: str) -> ProduceChecks | None:
    """`f`'s `safeguard_checks` for a frame it wants; None for a filter that does not
    say (it may act on any request)."""
    method = getattr(f, "safeguard_checks", None)
    if method is None:
        return None
    result = method(api_key, api_version, direction)
    return result if isinstance(result, ProduceChecks) else None


def _compression_reason(policy: CompressionPolicy, codec: str, size: int) -> str:
    if codec == "none" and policy.allow_uncompressed_below_bytes:
        return (f"compression none is not allowed for a batch of {size} bytes "
                f"(uncompressed only below {policy.allow_uncompressed_below_bytes})")
    return f"compression {codec} is not allowed"


def _record_violations(spec: SafeguardSpec, topic: str, partition: int,
                       batch: BatchView) -> list[Violation]:
    """What the batch's first offending record breaks (none: []).

    One offending record refuses the batch. Naming only it keeps the partition's error
    code for it in clients (KIP-467: with several record errors librdkafka and Java
    report INVALID_RECORD for each instead)."""
    for index, record in enumerate(decode_records(batch)):
        problems: list[tuple[str, str]] = []
        size = len(record.key or b"") + len(record.value or b"") + sum(
            len(k) + len(v or b"") for k, v in record.headers)
        if spec.max_record_bytes is not None and size > spec.max_record_bytes:
            problems.append(("max_record_bytes",
                             f"{size} bytes exceed {spec.max_record_bytes}"))
        if spec.max_headers is not None and len(record.headers) > spec.max_headers:
            problems.append(("max_headers",
                             f"{len(record.headers)} headers exceed {spec.max_headers}"))
        if spec.require_headers is not None:
            names = {k for k, _ in record.headers}
            missing = [h for h in spec.require_headers if h not in names]
            if missing:
                problems.append(("require_headers", f"lacks header(s) {', '.join(missing)}"))
        if problems:
            return [Violation(check, _error(spec, check), f"record {index}: {reason}",
                              (topic, partition, index)) for check, reason in problems]
    return []


def _fetch_limits(body: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """Every byte limit of a Fetch request: (the struct holding it, its field)."""
    yield body, "MaxBytes"
    for topic in body.get("Topics") or ():
        for partition in topic.get("Partitions") or ():
            yield partition, "PartitionMaxBytes"


def fetch_over_limit(spec: SafeguardSpec, body: dict[str, Any]) -> int | None:
    """The largest byte limit a Fetch asks for above `max_fetch_bytes`; None when it
    asks for no more. Reads only: what a dry-run rule reports."""
    limit = spec.max_fetch_bytes
    if limit is None:
        return None
    asked = max((holder.get(name, 0) for holder, name in _fetch_limits(body)), default=0)
    return asked if asked > limit else None


def clamp_fetch(spec: SafeguardSpec, body: dict[str, Any]) -> bool:
    """Lower a Fetch request's byte limits to `max_fetch_bytes`; True when changed."""
    limit = spec.max_fetch_bytes
    if limit is None:
        return False
    changed = False
    for holder, name in _fetch_limits(body):
        if holder.get(name, 0) > limit:
            holder[name] = limit
            changed = True
    return changed


def produce_bytes(body: dict[str, Any]) -> int:
    return sum(len(p.get("Records") or b"") for t in body.get("TopicData") or ()
               for p in t.get("PartitionData") or ())

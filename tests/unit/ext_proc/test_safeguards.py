"""Safeguard checks on real record batches."""

from __future__ import annotations

from typing import Any

import pytest

from ext_proc.filters.safeguards import (
    clamp_fetch,
    fetch_over_limit,
    produce_bytes,
    produce_violations,
)
from filter_rules.model import SafeguardSpec
from kafka_wire.compression import Compression
from kafka_wire.records import BatchHeader, Record, encode_batch
from kafka_wire.topic_ids import TopicIds


def batch(n: int = 3, *, idempotent: bool = False, compression: Compression = Compression.NONE,
          value: bytes = b"v" * 100, headers: list[tuple[str, bytes | None]] | None = None,
          ) -> bytes:
    header = BatchHeader(base_timestamp=1_700_000_000_000,
                         producer_id=7 if idempotent else -1,
                         producer_epoch=0 if idempotent else -1,
                         base_sequence=0 if idempotent else -1)
    records = [Record(i, i, b"k", value, list(headers or [])) for i in range(n)]
    return encode_batch(header, records, compression=compression)


def produce(*batches: bytes, topic: str = "t", acks: int = -1,
            transactional_id: str | None = None) -> dict[str, Any]:
    return {"TransactionalId": transactional_id, "Acks": acks, "TimeoutMs": 1000,
            "TopicData": [{"Name": topic, "PartitionData": [
                {"Index": i, "Records": b} for i, b in enumerate(batches)]}]}


def checks(spec: SafeguardSpec, body: dict[str, Any]) -> list[str]:
    return [v.check for v in produce_violations(spec, body, "t", TopicIds())]


def test_idempotence_and_transactions() -> None:
    spec = SafeguardSpec(require_idempotence=True)
    assert checks(spec, produce(batch())) == ["require_idempotence"]
    assert checks(spec, produce(batch(idempotent=True))) == []
    spec = SafeguardSpec(require_transactions=True)
    assert checks(spec, produce(batch(idempotent=True))) == ["require_transactions"]
    assert checks(spec, produce(batch(idempotent=True), transactional_id="tx")) == []


def test_acks_zero_read_only_and_error_override() -> None:
    assert checks(SafeguardSpec(forbid_acks_zero=True), produce(batch(), acks=0)) == \
        ["forbid_acks_zero"]
    assert checks(SafeguardSpec(forbid_acks_zero=True), produce(batch(), acks=1)) == []
    found = produce_violations(SafeguardSpec(read_only=True, error="POLICY_VIOLATION"),
                               produce(batch()), "t", TopicIds())
    assert [(v.check, v.error_code) for v in found] == [("read_only", 44)]


@pytest.mark.parametrize("codec", list(Compression))
def test_compression_policies(codec: Compression) -> None:
    body = produce(batch(compression=codec, value=b"x" * 500))
    name = codec.name.lower()
    other = "zstd" if name != "zstd" else "gzip"
    for policy, expected in [({"forbid": [name]}, ["compression"]), ({"require": [name]}, []),
                             ({"require": [other]}, ["compression"])]:
        spec = SafeguardSpec.model_validate({"compression": policy})
        assert checks(spec, body) == expected, policy


def test_sizes_and_headers_look_inside_compressed_batches() -> None:
    body = produce(batch(value=b"x" * 1000, compression=Compression.ZSTD,
                         headers=[("a", b"1"), ("b", None)]))
    assert checks(SafeguardSpec(max_record_bytes=500), body) == ["max_record_bytes"]
    assert checks(SafeguardSpec(max_record_bytes=5000), body) == []
    assert checks(SafeguardSpec(max_headers=1), body) == ["max_headers"]
    assert checks(SafeguardSpec(require_headers=["schema-id"]), body) == ["require_headers"]
    assert checks(SafeguardSpec(require_headers=["a", "b"]), body) == []
    raw = batch(n=50)
    assert checks(SafeguardSpec(max_batch_bytes=len(raw) - 1), produce(raw)) == \
        ["max_batch_bytes"]
    assert produce_bytes(produce(raw, raw)) == 2 * len(raw)


def test_other_topics_are_not_checked() -> None:
    body = produce(batch(), topic="elsewhere")
    assert produce_violations(SafeguardSpec(require_idempotence=True), body, "t", TopicIds()) == []


def test_garbage_records_are_a_violation_not_a_crash() -> None:
    body = produce(b"\x00" * 70)
    found = produce_violations(SafeguardSpec(max_headers=3), body, "t", TopicIds())
    assert found and found[0].check == "records"


def test_small_uncompressed_batches_pass_a_compression_policy() -> None:
    """librdkafka sends a batch uncompressed when compressing would not shrink it."""
    small = produce(batch(1, value=b"tiny"))
    large = produce(batch(20, value=b"x" * 100))
    for policy in ({"require": ["lz4", "zstd"]}, {"forbid": ["none"]}):
        spec = SafeguardSpec.model_validate({"compression": policy})
        assert spec.compression is not None and spec.compression.allow_uncompressed_below_bytes \
            == 1024
        assert checks(spec, small) == []
        (found,) = produce_violations(spec, large, "t", TopicIds())
        assert found.reason.startswith("compression none is not allowed for a batch of ")
        strict = SafeguardSpec.model_validate(
            {"compression": {**policy, "allow_uncompressed_below_bytes": 0}})
        assert checks(strict, small) == ["compression"]
    # A compressed batch of a forbidden codec is refused whatever its size.
    spec = SafeguardSpec.model_validate({"compression": {"forbid": ["gzip"]}})
    assert checks(spec, produce(batch(1, compression=Compression.GZIP))) == ["compression"]


def test_the_uncompressed_threshold_only_where_uncompressed_is_refused() -> None:
    for policy in ({"require": ["none", "lz4"]}, {"forbid": ["gzip"]}):
        with pytest.raises(ValueError, match="allow_uncompressed_below_bytes only applies"):
            SafeguardSpec.model_validate(
                {"compression": {**policy, "allow_uncompressed_below_bytes": 10}})


def test_record_checks_name_the_offending_record() -> None:
    spec = SafeguardSpec(require_headers=["schema-id"])
    body = produce(batch(1, headers=[("schema-id", b"1")]), batch(3))
    (found,) = produce_violations(spec, body, "t", TopicIds())
    assert (found.check, found.record, found.reason) == (
        "require_headers", ("t", 1, 0), "record 0: lacks header(s) schema-id")


def test_fetch_limits_are_clamped() -> None:
    body: dict[str, Any] = {"MaxBytes": 50_000_000, "Topics": [{"Topic": "t", "Partitions": [
        {"Partition": 0, "PartitionMaxBytes": 10_000_000},
        {"Partition": 1, "PartitionMaxBytes": 100}]}]}
    assert clamp_fetch(SafeguardSpec(max_fetch_bytes=1_000_000), body)
    assert body["MaxBytes"] == 1_000_000
    assert [p["PartitionMaxBytes"] for p in body["Topics"][0]["Partitions"]] == [1_000_000, 100]
    assert not clamp_fetch(SafeguardSpec(max_fetch_bytes=1_000_000), body)
    assert fetch_over_limit(SafeguardSpec(max_fetch_bytes=1_000_000), body) is None
    assert fetch_over_limit(SafeguardSpec(max_fetch_bytes=100), body) == 1_000_000
    assert body["MaxBytes"] == 1_000_000  # only read


def test_a_policy_that_allows_uncompressed_batches_reads_back_from_its_json() -> None:
    """`forbid: [gzip, snappy]` loaded, then its JSON (which carries every default, as
    the rule store and the xDS stream keep it) was refused: keg up died at start and a
    running gateway logged a traceback and never applied the rule."""
    for policy in ({"forbid": ["gzip", "snappy"]}, {"require": ["none", "lz4"]}):
        spec = SafeguardSpec.model_validate({"compression": policy})
        again = SafeguardSpec.model_validate(spec.model_dump(mode="json", by_alias=True))
        assert again == spec

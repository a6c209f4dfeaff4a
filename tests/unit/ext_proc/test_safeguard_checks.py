"""Safeguard checks keg's module applies itself (docs/native.md, safeguards): a Produce
range only safeguards act on carries what a request must keep for none of them to act;
the module passes such a request natively. The checks must be a sufficient condition:
a request that keeps them is one no safeguard of the set refuses."""

from __future__ import annotations

import itertools

from ext_proc.filters.rules import RuleEngine
from ext_proc.filters.safeguards import CODEC_IDS, CompressionCheck, ProduceChecks, produce_checks
from ext_proc.frames import InterestRange, interest_ranges
from filter_rules import CompiledRuleSet, load_rule_text
from filter_rules.model import CompressionPolicy, SafeguardSpec
from kafka_wire import ApiKey


def produce_ranges(rules: str) -> list[InterestRange]:
    engine = RuleEngine(CompiledRuleSet(load_rule_text(rules, "r.yaml")))
    try:
        return [r for r in interest_ranges(engine) if r.api_key == ApiKey.PRODUCE]
    finally:
        engine.records.close()


def test_a_compression_check_refuses_what_its_policy_refuses() -> None:
    policies = [CompressionPolicy(require=["lz4", "zstd"]),
                CompressionPolicy(require=["lz4"], allow_uncompressed_below_bytes=0),
                CompressionPolicy(require=["none", "gzip"]),
                CompressionPolicy(forbid=["gzip", "none"], allow_uncompressed_below_bytes=500),
                CompressionPolicy(forbid=["snappy"])]
    for policy, (name, codec), size in itertools.product(policies, CODEC_IDS.items(),
                                                         (0, 1, 499, 500, 1023, 1024, 10**7)):
        check = CompressionCheck.of(policy)
        module_refuses = codec in check.refused and not (
            codec == 0 and size < check.uncompressed_below)
        assert module_refuses == policy.refuses(name, size), (policy, name, size)


def test_checks_are_the_union_and_record_checks_leave_it_to_python() -> None:
    checks = produce_checks([
        SafeguardSpec(forbid_acks_zero=True, max_batch_bytes=5000),
        SafeguardSpec(require_idempotence=True, max_batch_bytes=3000,
                      compression=CompressionPolicy(require=["zstd"]))])
    assert checks == ProduceChecks(acks_not_zero=True, idempotent=True, max_batch_bytes=3000,
                                   compression=frozenset({CompressionCheck(
                                       frozenset({0, 1, 2, 3}), 1024)}))
    assert checks.to_json() == {"acks_not_zero": True, "idempotent": True,
                                "transactional": False, "max_batch_bytes": 3000,
                                "compression": [{"refused": [0, 1, 2, 3],
                                                 "uncompressed_below": 1024}]}
    for needs_records in ({"max_record_bytes": 10}, {"max_headers": 2},
                          {"require_headers": ["trace"]}, {"read_only": True}):
        assert produce_checks([SafeguardSpec(forbid_acks_zero=True),
                               SafeguardSpec(**needs_records)]) is None, needs_records
    assert produce_checks([]) is None


def test_a_produce_range_carries_checks_only_when_safeguards_alone_act_on_it() -> None:
    hygiene = """
rules:
  - id: hygiene
    match: {topics: {prefix: [orders.]}}
    action: {safeguard: {forbid_acks_zero: true, require_transactions: true}}
"""
    (walked, newer) = produce_ranges(hygiene)
    assert walked.checks == ProduceChecks(acks_not_zero=True, transactional=True)
    assert walked.selector is not None and walked.selector.prefix == frozenset({"orders."})
    assert newer.checks is None, "a version keg cannot read: handed off whole"
    with_deny = hygiene + """
  - id: no-x
    match: {apis: [Produce], topics: {prefix: [x.]}}
    action: {deny: {}}
"""
    assert all(r.checks is None for r in produce_ranges(with_deny)), "a deny acts on requests"
    with_mask = hygiene + """
  - id: mask
    match: {topics: {prefix: [orders.]}}
    action: {mask: {fields: [$.card]}}
"""
    assert all(r.checks is None for r in produce_ranges(with_mask)), "a record rule reads records"

"""Compiled rule sets: matching semantics and the per-frame index."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.rule_lookup import thousand_rules
from filter_rules import (
    CompiledRuleSet,
    MatchContext,
    RuleSet,
    StringMatch,
    compile_rules,
    load_rule_data,
    load_rule_dir,
    load_rule_text,
    parse_host,
)
from filter_rules.compiled import StringMatcher
from kafka_wire import ApiKey


def compiled(*rules: dict[str, Any]) -> CompiledRuleSet:
    return CompiledRuleSet(load_rule_data({"rules": list(rules)}))


def rule(rule_id: str, match: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": rule_id, "action": {"observe": {}}}
    if match is not None:
        body["match"] = match
    body.update(fields)
    return body


def ctx(api_key: int = ApiKey.PRODUCE, api_version: int = 9, **fields: Any) -> MatchContext:
    return MatchContext(api_key=api_key, api_version=api_version, **fields)


def ids(rules: tuple[Any, ...]) -> list[str]:
    return [r.id for r in rules]


# --- strings -----------------------------------------------------------------------


def test_topics_exact_prefix_regex() -> None:
    only = compiled(rule("t", {"topics": {
        "exact": ["audit"], "prefix": ["payments."], "regex": ["^orders-[0-9]+$", "(?i)logs"],
    }})).rules[0]
    c = ctx()
    for topic in ["audit", "payments.eu", "payments.", "orders-12", "LOGS", "logs"]:
        assert only.matches(c, topic=topic), topic
    for topic in ["audit2", "payments", "xpayments.eu", "orders-", "orders-1x", "mylogs", ""]:
        assert not only.matches(c, topic=topic), topic
    assert not only.matches(c), "a topic rule does not match a frame without a topic"
    assert only.uses_topics and not only.uses_groups


def test_regex_must_match_the_whole_name() -> None:
    matcher = StringMatcher(StringMatch.model_validate({"regex": ["pay"]}))
    assert matcher("pay") and not matcher("payments") and not matcher("prepay")


def test_regex_verdicts_are_remembered_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("filter_rules.compiled.MEMO_LIMIT", 3)
    matcher = StringMatcher(StringMatch.model_validate({"regex": ["a+"], "exact": ["b"]}))
    for value in ["a", "aa", "x", "a", "b", "y" * 600]:
        assert matcher(value) == (value in ("a", "aa", "b"))
    assert len(matcher._memo) <= 3
    assert "y" * 600 not in matcher._memo and "b" not in matcher._memo
    assert matcher("é") is False and matcher("\udc80") is False


def test_regexes_that_cannot_be_joined_are_tried_one_by_one() -> None:
    matcher = StringMatcher(StringMatch.model_validate({"regex": [r"\Qa.b", "c+"]}))
    assert matcher.regex is None and len(matcher.regexes) == 2
    assert matcher("a.b") and matcher("ccc") and not matcher("axb")
    joined = StringMatcher(StringMatch.model_validate({"regex": ["a+", "b+"]}))
    assert joined.regex is not None and joined("aa") and joined("bb") and not joined("ab")


def test_groups_and_client_ids() -> None:
    c = compiled(
        rule("g", {"groups": {"prefix": ["team-a."]}}),
        rule("c", {"client_ids": {"exact": ["legacy"], "regex": ["rdkafka-.*"]}}),
    )
    g, cl = c.rules
    commit = ctx(ApiKey.OFFSET_COMMIT, 8)
    assert g.matches(commit, group="team-a.etl") and not g.matches(commit, group="team-b.etl")
    assert not g.matches(commit, topic="team-a.etl")
    assert not g.matches(ctx(), group="team-a.etl"), "Produce names no group"
    assert g.uses_groups and not g.uses_topics
    assert cl.matches(ctx(client_id="legacy")) and cl.matches(ctx(client_id="rdkafka-1"))
    assert not cl.matches(ctx(client_id="java")) and not cl.matches(ctx())


def test_principals_accept_the_short_and_the_kafka_form() -> None:
    c = compiled(
        rule("short", {"principals": {"exact": ["alice"]}}),
        rule("long", {"principals": {"exact": ["User:alice"]}}),
        rule("prefix", {"principals": {"prefix": ["svc-"]}}),
        rule("regex", {"principals": {"regex": ["User:(alice|bob)"]}}),
        rule("other-type", {"principals": {"exact": ["Group:ops"]}}),
    )
    assert ids(c.matching(ctx(principal="alice"))) == ["short", "long", "regex"]
    assert ids(c.matching(ctx(principal="User:alice"))) == ["short", "long", "regex"]
    assert ids(c.matching(ctx(principal="svc-billing"))) == ["prefix"]
    assert ids(c.matching(ctx(principal="Group:ops"))) == ["other-type"]
    assert ids(c.matching(ctx())) == []
    assert ctx(principal="alice").principal == "User:alice"


def test_client_addresses_v4_v6_and_mapped() -> None:
    c = compiled(rule("net", {"client_addresses": ["10.0.0.0/8", "fd00::/8", "192.168.1.7"]}))
    net = c.rules[0]
    for host in ["10.1.2.3", "10.1.2.3:5555", "::ffff:10.0.0.1", "[fd00::1]:9092", "fd12::7",
                 "192.168.1.7"]:
        assert net.matches(ctx(client_host=host)), host
    for host in ["11.0.0.1", "192.168.1.8", "fe80::1", "not-an-ip", "[::1]:1"]:
        assert not net.matches(ctx(client_host=host)), host
    assert not net.matches(ctx())


def test_parse_host() -> None:
    assert str(parse_host("127.0.0.1:19092")) == "127.0.0.1"
    assert str(parse_host("[::1]:19092")) == "::1"
    assert str(parse_host("::ffff:127.0.0.1")) == "127.0.0.1"
    assert parse_host("example.com:9092") is None


def test_listeners_and_brokers() -> None:
    c = compiled(rule("l", {"listeners": ["127.0.0.1:19092"], "brokers": [1, 2]}))
    r = c.rules[0]
    assert r.matches(ctx(listener="127.0.0.1:19092", broker_id=2))
    assert not r.matches(ctx(listener="127.0.0.1:19093", broker_id=2))
    assert not r.matches(ctx(listener="127.0.0.1:19092", broker_id=3))
    assert not r.matches(ctx(listener="127.0.0.1:19092"))


def test_not_negates_a_nested_match() -> None:
    c = compiled(rule("n", {
        "apis": ["Produce"],
        "topics": {"prefix": ["payments."]},
        "not": {"principals": {"exact": ["alice"]}},
    }))
    r = c.rules[0]
    assert r.matches(ctx(principal="bob"), topic="payments.eu")
    assert r.matches(ctx(), topic="payments.eu"), "an unknown principal is not alice"
    assert not r.matches(ctx(principal="alice"), topic="payments.eu")
    assert not r.matches(ctx(principal="bob"), topic="orders")


def test_not_not_and_a_topic_absent_from_the_frame() -> None:
    c = compiled(
        rule("outside", {"not": {"topics": {"prefix": ["acme."]}}}),
        rule("double", {"not": {"not": {"brokers": [1]}}}),
    )
    outside, double = c.rules
    assert outside.matches(ctx(), topic="other") and not outside.matches(ctx(), topic="acme.x")
    assert outside.matches(ctx()), "without a topic the nested topic match fails, so not holds"
    assert outside.uses_topics
    assert double.matches(ctx(broker_id=1)) and not double.matches(ctx(broker_id=2))


def test_versions() -> None:
    c = compiled(
        rule("old", {"apis": ["Fetch"], "versions": {"max": 3}}),
        rule("new", {"apis": ["Fetch"], "versions": {"min": 12}}),
        rule("mid", {"apis": ["Fetch"], "versions": {"min": 4, "max": 11}}),
        rule("any", {"apis": ["Fetch"]}),
    )
    assert ids(c.candidates(ApiKey.FETCH, 0, "request")) == ["old", "any"]
    assert ids(c.candidates(ApiKey.FETCH, 3, "request")) == ["old", "any"]
    assert ids(c.candidates(ApiKey.FETCH, 4, "request")) == ["mid", "any"]
    assert ids(c.candidates(ApiKey.FETCH, 12, "request")) == ["new", "any"]
    assert ids(c.candidates(ApiKey.FETCH, 400, "request")) == ["new", "any"], "beyond the schemas"
    assert ids(c.matching(ctx(ApiKey.FETCH, 2))) == ["old", "any"]
    assert not c.get("old").matches(ctx(ApiKey.FETCH, 5))  # type: ignore[union-attr]


def test_direction() -> None:
    c = compiled(
        rule("default", {"apis": ["Fetch"]}),
        rule("resp", {"apis": ["Fetch"], "direction": "response"}),
        rule("both", {"apis": ["Fetch"], "direction": "both"}),
        rule("not-resp", {"apis": ["Fetch"], "direction": "both",
                          "not": {"direction": "response"}}),
    )
    assert ids(c.candidates(ApiKey.FETCH, 12, "request")) == ["default", "both", "not-resp"]
    assert ids(c.candidates(ApiKey.FETCH, 12, "response")) == ["resp", "both", "not-resp"]
    assert ids(c.matching(ctx(ApiKey.FETCH, 12, direction="response"))) == ["resp", "both"]
    assert ids(c.matching(ctx(ApiKey.FETCH, 12))) == ["default", "both", "not-resp"]
    assert not c.get("resp").matches(ctx(ApiKey.FETCH, 12))  # type: ignore[union-attr]


def test_order_then_file_then_position(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "- {id: a-late, order: 20, action: {observe: {}}}\n"
        "- {id: a-tie-1, order: 10, action: {observe: {}}}\n"
        "- {id: a-tie-2, order: 10, action: {observe: {}}}\n"
    )
    (tmp_path / "b.yaml").write_text(
        "- {id: b-first, order: -5, action: {observe: {}}}\n"
        "- {id: b-tie, order: 10, action: {observe: {}}}\n"
        "- {id: b-default, action: {observe: {}}}\n"
    )
    c = CompiledRuleSet(load_rule_dir(tmp_path))
    expected = ["b-first", "b-default", "a-tie-1", "a-tie-2", "b-tie", "a-late"]
    assert ids(c.rules) == expected
    assert ids(c.candidates(ApiKey.PRODUCE, 9, "request")) == expected
    assert [r.position for r in c.rules] == list(range(6))


def test_disabled_rules_are_left_out_and_dry_run_is_flagged() -> None:
    c = compiled(
        rule("off", mode="disabled"),
        rule("try", mode="dry-run"),
        rule("on"),
    )
    assert ids(c.rules) == ["try", "on"]
    assert c.get("off") is None
    assert [r.dry_run for r in c.rules] == [True, False]
    assert ids(c.candidates(ApiKey.PRODUCE, 9, "request")) == ["try", "on"]
    assert len(c.ruleset.rules) == 3


def test_index_returns_only_relevant_rules() -> None:
    c = compiled(
        rule("produce", {"apis": ["Produce"]}),
        rule("fetch", {"apis": ["Fetch", 1]}),
        rule("everything"),
        rule("admin", {"apis": ["CreateTopics", "DeleteTopics"]}),
        rule("future", {"apis": [1000]}),
    )
    assert ids(c.candidates(ApiKey.PRODUCE, 9, "request")) == ["produce", "everything"]
    assert ids(c.candidates(ApiKey.FETCH, 12, "request")) == ["fetch", "everything"]
    assert ids(c.candidates(ApiKey.CREATE_TOPICS, 7, "request")) == ["everything", "admin"]
    assert ids(c.candidates(ApiKey.METADATA, 12, "request")) == ["everything"]
    assert ids(c.candidates(1000, 0, "request")) == ["everything", "future"]
    assert ids(c.candidates(999, 0, "request")) == ["everything"], "an unknown key"
    assert c.candidates(ApiKey.PRODUCE, 9, "response") == ()
    assert not c.interested(ApiKey.METADATA, 12, "response")
    assert c.interested(ApiKey.PRODUCE, 9, "request")


def test_a_rule_naming_topics_or_groups_is_a_candidate_only_for_apis_that_name_them() -> None:
    c = compiled(
        rule("topics", {"topics": {"prefix": ["secret."]}}, action={"deny": {}}),
        rule("groups", {"groups": {"exact": ["g"]}}, action={"deny": {}}),
        rule("not-topics", {"not": {"topics": {"prefix": ["open."]}}}, action={"deny": {}}),
    )
    for api in (ApiKey.HEARTBEAT, ApiKey.API_VERSIONS, ApiKey.SASL_AUTHENTICATE,
                ApiKey.INIT_PRODUCER_ID):
        assert ids(c.candidates(api, 0, "request")) == (
            ["groups", "not-topics"] if api == ApiKey.HEARTBEAT else ["not-topics"]), api
    assert ids(c.candidates(ApiKey.FIND_COORDINATOR, 4, "request")) == ["groups", "not-topics"]
    for api in (ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.DELETE_TOPICS, ApiKey.CREATE_ACLS):
        assert "topics" in ids(c.candidates(api, 0, "request")), api
    assert ids(c.candidates(ApiKey.OFFSET_COMMIT, 8, "request")) == ["topics", "groups",
                                                                     "not-topics"]
    assert ids(c.candidates(ApiKey.ENVELOPE, 0, "request")) == ["topics", "groups",
                                                                "not-topics"], \
        "an Envelope carries another request"
    assert ids(c.candidates(1000, 0, "request")) == ["topics", "groups", "not-topics"], \
        "an API keg does not know may name anything"


def test_a_safeguard_is_a_candidate_only_where_it_can_act() -> None:
    compress = {"safeguard": {"compression": {"require": ["lz4"]}}}
    cap = {"safeguard": {"max_fetch_bytes": 1024}}
    c = compiled(
        rule("hygiene", {"topics": {"prefix": ["orders."]}}, action=compress),
        rule("fetch-cap", None, action=cap),
        rule("metadata-only", {"apis": ["Metadata"]}, action=compress),
    )
    assert ids(c.candidates(ApiKey.PRODUCE, 9, "request")) == ["hygiene", "fetch-cap"]
    assert ids(c.candidates(ApiKey.FETCH, 12, "request")) == ["fetch-cap"]
    for api in (ApiKey.METADATA, ApiKey.OFFSET_COMMIT, ApiKey.HEARTBEAT, ApiKey.SHARE_FETCH):
        assert c.candidates(api, 0, "request") == (), api


def test_allow_apis_and_deny_apis_apply_where_they_refuse() -> None:
    c = compiled(
        {"id": "allow", "match": {"listeners": ["0.0.0.0:29092"]},
         "action": {"allow_apis": ["ApiVersions", "Metadata", "Produce"]}},
        {"id": "deny", "action": {"deny_apis": ["DeleteTopics", 1000]}},
        {"id": "deny-in-scope", "match": {"apis": ["DeleteTopics", "Produce"]},
         "action": {"deny_apis": ["DeleteTopics", "CreateTopics"]}},
    )
    assert ids(c.candidates(ApiKey.PRODUCE, 9, "request")) == []
    assert ids(c.candidates(ApiKey.FETCH, 12, "request")) == ["allow"]
    assert ids(c.candidates(ApiKey.DELETE_TOPICS, 6, "request")) == [
        "allow",
        "deny",
        "deny-in-scope",
    ]
    assert ids(c.candidates(ApiKey.CREATE_TOPICS, 7, "request")) == ["allow"]
    assert ids(c.candidates(1000, 0, "request")) == ["allow", "deny"]
    assert ids(c.candidates(4321, 0, "request")) == ["allow"], "unknown APIs are not allowed"
    public = {"listener": "0.0.0.0:29092"}
    allow, deny, scoped = c.rules
    assert allow.matches(ctx(ApiKey.FETCH, 12, **public))
    assert not allow.matches(ctx(ApiKey.PRODUCE, 9, **public))
    assert not allow.matches(ctx(ApiKey.FETCH, 12, listener="127.0.0.1:19092"))
    assert deny.matches(ctx(ApiKey.DELETE_TOPICS, 6)) and not deny.matches(ctx(ApiKey.PRODUCE, 9))
    assert scoped.matches(ctx(ApiKey.DELETE_TOPICS, 6)) and not scoped.matches(
        ctx(ApiKey.CREATE_TOPICS, 7)
    )


def test_rule_facts_for_the_engine() -> None:
    c = compiled(
        rule("quiet", {"apis": ["Fetch"], "versions": {"min": 4}, "direction": "both"},
             action={"observe": {"audit": False}}),
        rule("loud", audit={"enabled": True, "include_payload": True},
             action={"deny": {"error": "POLICY_VIOLATION"}}),
        rule("silent", audit={"enabled": False}),
    )
    quiet, loud, silent = c.rules
    assert quiet.applies_to(ApiKey.FETCH, 4, "response") and not quiet.applies_to(
        ApiKey.FETCH, 3, "request"
    )
    assert not quiet.applies_to(ApiKey.PRODUCE, 9, "request")
    assert (quiet.audited, loud.audited, silent.audited) == (False, True, False)
    assert loud.kind == "deny" and loud.action.deny.error == "POLICY_VIOLATION"
    assert loud.source is not None and loud.source.file == "<data>"


def test_lookups_are_precomputed_dict_hits() -> None:
    c = compiled(rule("p", {"apis": ["Produce"]}), rule("v", {"apis": ["Fetch"],
                                                             "versions": {"min": 4}}))
    assert c.candidates(ApiKey.PRODUCE, 9, "request") is c.candidates(ApiKey.PRODUCE, 3, "request")
    assert c.candidates(ApiKey.FETCH, 12, "request") is c.candidates(ApiKey.FETCH, 12, "request")
    assert c.candidates(ApiKey.FETCH, 12, "request") is c.candidates(ApiKey.FETCH, 5, "request"), (
        "shared"
    )


def test_a_thousand_rules_compile_and_lookup_stays_a_dict_hit() -> None:
    """Lookups are precomputed: every call returns the very tuple built at compile time
    (how fast that is: python -m benchmarks.rule_lookup)."""
    c = compiled(*thousand_rules())
    assert len(c) == 1000
    produce = c.candidates(ApiKey.PRODUCE, 9, "request")
    assert {r.id for r in produce} == {
        f"r{n:04d}" for n in range(1000)
        if (n % 5 == 0 or n % 4 == 0) and not (n % 10 == 0 and n % 11 > 9)
    }
    assert all(produce[i].order <= produce[i + 1].order for i in range(len(produce) - 1))
    fetch = c.candidates(ApiKey.FETCH, 12, "request")
    for _ in range(1000):  # nothing is computed per call: the same objects come back
        assert c.candidates(ApiKey.PRODUCE, 9, "request") is produce
        assert c.candidates(ApiKey.FETCH, 12, "request") is fetch
    assert ids(c.matching(ctx(ApiKey.PRODUCE, 9, principal="user-4"), topic="tenant-4.x")) == [
        "r0004"
    ]
    assert ids(c.matching(ctx(ApiKey.PRODUCE, 9), topic="t8-x")) == ["r0008"]
    assert ids(c.matching(ctx(ApiKey.PRODUCE, 9), topic="tenant-12.x")) == [], "r0012 needs user-12"
    assert ids(c.matching(ctx(ApiKey.FETCH, 9, principal="user-12"), topic="t12-")) == []
    assert ids(c.matching(ctx(ApiKey.PRODUCE, 9, principal="user-12"), topic="t12-")) == ["r0012"]


def test_version_is_a_content_hash() -> None:
    text = "- {id: a, action: {observe: {}}}\n- {id: b, mode: enforce, action: {deny: {}}}\n"
    first = load_rule_text(text, "one.yaml")
    same = load_rule_text(text.replace("mode: enforce, ", ""), "two.yaml")
    assert first.version == same.version, "defaults and file names do not count"
    assert CompiledRuleSet(first).version == first.version
    changed = load_rule_text(text.replace("observe: {}", "observe: {audit: false}"))
    assert changed.version != first.version
    swapped = load_rule_text("\n".join(reversed(text.strip().split("\n"))) + "\n")
    assert swapped.version != first.version, "position decides ties, so it counts"
    assert len(first.version) == 16
    assert RuleSet().version == RuleSet(rules=[]).version


def test_match_context_for_frame_copies_the_connection() -> None:
    base = ctx(principal="alice", client_host="10.0.0.1:5000", listener="l:1", broker_id=3,
               client_id="app")
    frame = base.for_frame(ApiKey.FETCH, 12, "response")
    assert (frame.api_key, frame.api_version, frame.direction) == (ApiKey.FETCH, 12, "response")
    assert (frame.principal, str(frame.client_ip), frame.listener, frame.broker_id,
            frame.client_id) == ("User:alice", "10.0.0.1", "l:1", 3, "app")
    assert (base.api_key, base.direction) == (ApiKey.PRODUCE, "request")
    for name in (f.name for f in dataclasses.fields(MatchContext)):
        if name not in ("api_key", "api_version", "direction"):
            assert getattr(frame, name) == getattr(base, name), name
    with pytest.raises(AttributeError):
        frame.api_key = ApiKey.METADATA  # type: ignore[misc]


def test_compile_rules_and_default_rules_block_nothing() -> None:
    c = compile_rules(load_rule_dir())
    assert c.rules
    for r in c.rules:
        assert r.kind == "observe" or r.dry_run, r


# --- compiled matching equals a plain reading of the rule -------------------------

NAMES = st.text(alphabet="ab.-", min_size=1, max_size=5)  # Kafka names: never empty
REGEXES = st.sampled_from(["a.*", "b+", "(a|b)\\.", "[ab]-[ab]", ".*-", "a?b?"])


def _string_match() -> st.SearchStrategy[dict[str, list[str]]]:
    return st.fixed_dictionaries(
        {}, optional={"exact": st.lists(NAMES, max_size=3), "prefix": st.lists(NAMES, max_size=2),
                      "regex": st.lists(REGEXES, max_size=2)},
    ).filter(lambda d: any(d.values()))


def _reference_string(spec: dict[str, list[str]], value: str | None) -> bool:
    if value is None:
        return False
    return (
        value in spec.get("exact", [])
        or any(value.startswith(p) for p in spec.get("prefix", []))
        or any(re.fullmatch(r, value) for r in spec.get("regex", []))
    )


def _reference(match: dict[str, Any], c: MatchContext, topic: str | None) -> bool:
    if "topics" in match and not _reference_string(match["topics"], topic):
        return False
    if "client_ids" in match and not _reference_string(match["client_ids"], c.client_id):
        return False
    if "brokers" in match and c.broker_id not in match["brokers"]:
        return False
    return not ("not" in match and _reference(match["not"], c, topic))


_MATCH = st.fixed_dictionaries({}, optional={
    "topics": _string_match(), "client_ids": _string_match(),
    "brokers": st.lists(st.integers(0, 3), min_size=1, max_size=2),
})


@settings(max_examples=200, deadline=None)
@given(
    match=st.recursive(_MATCH, lambda inner: _MATCH.flatmap(
        lambda m: inner.map(lambda n: {**m, "not": n})), max_leaves=3),
    topic=st.none() | NAMES,
    client_id=st.none() | NAMES,
    broker=st.none() | st.integers(0, 3),
)
def test_compiled_matching_agrees_with_the_plain_reading(
    match: dict[str, Any], topic: str | None, client_id: str | None, broker: int | None
) -> None:
    r = compiled(rule("p", match)).rules[0]
    c = ctx(client_id=client_id, broker_id=broker)
    assert r.matches(c, topic=topic) == _reference(match, c, topic)


def test_consume_time_record_rules_cover_share_fetch() -> None:
    """Share groups (KIP-932) read records with ShareFetch: a consume-time rule applies
    to its answers as to Fetch's, also when it names Fetch, and so does a deny of Fetch;
    a safeguard names Fetch's own fields, so it stays on Fetch."""
    from filter_rules import CompiledRuleSet, MatchContext, load_rule_text
    from kafka_wire import ApiKey

    compiled = CompiledRuleSet(load_rule_text("""
rules:
  - id: mask-any-read
    match: {direction: response, topics: {prefix: [pii.]}}
    action: {mask: {fields: [$.email]}}
  - id: mask-fetch
    match: {apis: [Fetch], direction: response, topics: {prefix: [hr.]}}
    action: {mask: {fields: [$.salary]}}
  - id: deny-fetch
    match: {apis: [Fetch], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: cap-fetch
    match: {apis: [Fetch]}
    action: {safeguard: {max_fetch_bytes: 1048576}}
""", "rules.yaml"))
    by_id = {r.id: r for r in compiled.rules}
    for rule_id in ("mask-any-read", "mask-fetch"):
        keys = by_id[rule_id].api_keys
        assert keys is not None and keys >= {ApiKey.FETCH, ApiKey.SHARE_FETCH}, rule_id
    assert [r.id for r in compiled.candidates(ApiKey.SHARE_FETCH, 1, "response")] == [
        "mask-any-read", "mask-fetch"]
    assert by_id["deny-fetch"].api_keys == {ApiKey.FETCH, ApiKey.SHARE_FETCH}
    assert by_id["cap-fetch"].api_keys == {ApiKey.FETCH}
    # ... and they match a ShareFetch (the `apis` check of the match itself too).
    share = MatchContext(api_key=ApiKey.SHARE_FETCH, api_version=1, direction="request")
    assert by_id["deny-fetch"].matches(share, "secret.x")
    answer = MatchContext(api_key=ApiKey.SHARE_FETCH, api_version=1, direction="response")
    assert by_id["mask-fetch"].matches(answer, "hr.people")
    assert not by_id["cap-fetch"].matches(share, None)

"""Who-selectors of the interest table: a request goes to the Python chain only when
its sender (principal, client network, listener, client id) may make a rule act
(docs/native.md, the interest table). A who-selector must be a necessary condition:
a rule without identity matchers, or a filter that does not say, leaves the range
without one (every such request is handed off)."""

from __future__ import annotations

from ext_proc.filters import Selection, TopicSelector, WhoClause, select
from ext_proc.filters.rules import RuleEngine
from ext_proc.frames import InterestRange, interest_ranges
from filter_rules import CompiledRuleSet, load_rule_text
from kafka_wire import ApiKey


def ranges_of(rules: str, api_key: int) -> list[InterestRange]:
    engine = RuleEngine(CompiledRuleSet(load_rule_text(rules, "r.yaml")))
    try:
        return [r for r in interest_ranges(engine) if r.api_key == api_key]
    finally:
        engine.records.close()


def first_who(rules: str, api_key: int) -> frozenset[WhoClause] | None:
    return ranges_of(rules, api_key)[0].who


def test_a_tenant_rule_hands_off_only_its_tenants_requests() -> None:
    rules = """
rules:
  - id: acme-groups
    match:
      apis: [OffsetCommit, OffsetFetch]
      principals: {exact: [acme-admin], prefix: [acme-], regex: ['User:ops-[a-z]+']}
      not: {groups: {prefix: [acme.]}}
    action: {deny: {error: GROUP_AUTHORIZATION_FAILED}}
"""
    who = first_who(rules, ApiKey.OFFSET_FETCH)
    # Exact names and prefixes as the rule's matcher reads them: "User:" when no type.
    assert who == frozenset({WhoClause(principals=TopicSelector(
        frozenset({"User:acme-admin"}), frozenset({"User:acme-"}),
        frozenset({"User:ops-[a-z]+"})))})
    assert first_who(rules, ApiKey.OFFSET_COMMIT) == who
    assert not ranges_of(rules, ApiKey.HEARTBEAT), "an API no rule names is not handed off"
    # JoinGroup is handed off to the group-protocol observer whoever sends it.
    assert not ranges_of(rules.replace("OffsetFetch", "JoinGroup"), ApiKey.OFFSET_FETCH)
    assert first_who(rules.replace("OffsetFetch", "JoinGroup"), ApiKey.JOIN_GROUP) is None


def test_networks_are_canonical_and_listeners_as_given() -> None:
    who = first_who("""
rules:
  - id: from-the-office
    match: {apis: [AlterConfigs], client_addresses: ["10.20.3.4/16", "fd00:20::1"],
            listeners: ["127.0.0.1:19092"]}
    action: {deny: {}}
""", ApiKey.ALTER_CONFIGS)
    assert who is not None
    (clause,) = who
    assert clause.client_addresses == frozenset({"10.20.0.0/16", "fd00:20::1/128"})
    assert clause.to_json() == {"client_addresses": ["10.20.0.0/16", "fd00:20::1/128"],
                                "listeners": ["127.0.0.1:19092"]}


def test_client_ids_are_matched_as_the_header_carries_them() -> None:
    who = first_who("""
rules:
  - id: legacy-apps
    match: {apis: [Produce], client_ids: {exact: [legacy], prefix: [old-], regex: ['etl-[0-9]+']},
            listeners: ["h:1"]}
    action: {deny: {}}
""", ApiKey.PRODUCE)
    assert who == frozenset({WhoClause(listeners=frozenset({"h:1"}), client_ids=TopicSelector(
        frozenset({"legacy"}), frozenset({"old-"}), frozenset({"etl-[0-9]+"})))})
    (clause,) = who
    assert clause.to_json() == {"listeners": ["h:1"], "client_ids": {
        "exact": ["legacy"], "prefix": ["old-"], "regex": ["etl-[0-9]+"]}}
    # A client-id pattern the module cannot read leaves the rule without a clause.
    assert first_who(r"""
rules:
  - id: spaced
    match: {apis: [Produce], client_ids: {regex: ['a\sb']}}
    action: {deny: {}}
""", ApiKey.PRODUCE) is None


def test_one_rule_for_anyone_opens_the_range_to_everyone() -> None:
    assert first_who("""
rules:
  - id: acme-only
    match: {apis: [DeleteTopics], principals: {prefix: [acme-]}}
    action: {deny: {}}
  - id: audit-deletes
    match: {apis: [DeleteTopics]}
    action: {observe: {}}
""", ApiKey.DELETE_TOPICS) is None


def test_a_negated_principal_names_no_one() -> None:
    assert first_who("""
rules:
  - id: only-admin-deletes
    match: {apis: [DeleteTopics], not: {principals: {exact: [admin]}}}
    action: {deny: {}}
""", ApiKey.DELETE_TOPICS) is None


def test_a_pattern_the_module_cannot_read_drops_that_matcher_only() -> None:
    who = first_who(r"""
rules:
  - id: spaced
    match: {apis: [AlterConfigs], principals: {regex: ['User:a\sb']}, listeners: ["h:1"]}
    action: {deny: {}}
""", ApiKey.ALTER_CONFIGS)
    assert who == frozenset({WhoClause(listeners=frozenset({"h:1"}))})


def test_record_rules_and_request_rules_of_one_api_share_their_union() -> None:
    rules = """
rules:
  - id: mask-for-partners
    match: {topics: {exact: [cards]}, principals: {prefix: [partner-]}}
    action: {mask: {fields: [$.card]}}
  - id: slow-partners
    match: {apis: [Produce], principals: {exact: [partner-x]}}
    action: {deny: {}}
"""
    produce = ranges_of(rules, ApiKey.PRODUCE)[0]
    assert produce.selector == TopicSelector(frozenset({"cards"}))
    assert produce.who == frozenset({
        WhoClause(principals=TopicSelector(frozenset(), frozenset({"User:partner-"})))})
    assert produce.whole == frozenset({
        WhoClause(principals=TopicSelector(frozenset({"User:partner-x"})))}), \
        "the deny rule names no topics: all of partner-x's requests"


def test_an_envelope_is_judged_as_the_client_inside_it() -> None:
    envelope = ranges_of("""
rules:
  - id: acme-only
    match: {principals: {prefix: [acme-]}}
    action: {deny: {}}
""", ApiKey.ENVELOPE)
    assert envelope and all(r.who is None for r in envelope)


def test_rules_naming_no_topics_select_by_who_beside_topic_rules() -> None:
    rules = """
rules:
  - id: no-secrets
    match: {apis: [Produce, Fetch], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: mallory-is-out
    match: {apis: [Produce], principals: {exact: [mallory]}}
    action: {deny: {}}
"""
    produce = ranges_of(rules, ApiKey.PRODUCE)[0]
    assert produce.selector == TopicSelector(frozenset(), frozenset({"secret."}))
    assert produce.who is None, "the topic rule names no one"
    assert produce.whole == frozenset({WhoClause(principals=TopicSelector(
        frozenset({"User:mallory"})))}), "mallory's requests whatever their topics"
    fetch = ranges_of(rules, ApiKey.FETCH)[0]
    assert fetch.selector is not None and fetch.whole is None
    # A rule naming neither topics nor anyone: every request.
    everyone = rules + """
  - id: audit-produce
    match: {apis: [Produce]}
    action: {observe: {}}
"""
    produce = ranges_of(everyone, ApiKey.PRODUCE)[0]
    assert (produce.selector, produce.who, produce.whole) == (None, None, None)


def test_select_keeps_a_necessary_condition() -> None:
    bob = frozenset({WhoClause(principals=TopicSelector(frozenset({"User:bob"})))})
    payments = TopicSelector(frozenset({"payments"}))
    assert select([(payments, bob)], True) == Selection(payments, bob)
    assert select([(payments, bob), (None, None)], True) == Selection(None, None)
    assert select([(payments, None), (None, bob)], True) == Selection(payments, None, bob)
    assert select([(payments, bob), (None, bob)], False) == Selection(None, bob), \
        "an API whose topics the module does not read: who alone"
    assert select([], True) == Selection(None, frozenset())

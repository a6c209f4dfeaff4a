"""Topic selectors of the interest table: a Produce or Fetch goes to the Python chain
only when it names a topic some filter may act on (docs/native.md, the interest table).

A selector must be a necessary condition: every filter that may act on the API whatever
the topics leaves the range without one (every such frame is handed off)."""

from __future__ import annotations

import pytest

from ext_proc.filters import TopicSelector, portable_regex
from ext_proc.filters.rules import RuleEngine
from ext_proc.frames import MAX_VERSION, interest_ranges, interest_table
from filter_rules import CompiledRuleSet, RuleSet, load_rule_text
from kafka_wire import ApiKey

PRODUCE_HIGH = 13  # the highest Produce version keg reads (kafka_wire)
FETCH_HIGH = 18


def ranges(rules: str) -> dict[int, list[tuple[int, int, TopicSelector | None]]]:
    engine = RuleEngine(CompiledRuleSet(load_rule_text(rules, "r.yaml")))
    try:
        found: dict[int, list[tuple[int, int, TopicSelector | None]]] = {}
        for r in interest_ranges(engine):
            found.setdefault(r.api_key, []).append((r.low, r.high, r.selector))
        return found
    finally:
        engine.records.close()


def produce_selector(rules: str) -> TopicSelector | None:
    produce = ranges(rules)[ApiKey.PRODUCE]
    if produce == [(0, MAX_VERSION, None)]:  # one range: every Produce is handed off
        return None
    assert produce[-1] == (PRODUCE_HIGH + 1, MAX_VERSION, None), "unread versions: every frame"
    assert len(produce) == 2, produce
    assert produce[0][:2] == (0, PRODUCE_HIGH)
    return produce[0][2]


def test_a_topic_scoped_mask_selects_its_topics() -> None:
    selector = produce_selector("""
rules:
  - id: mask-cards
    match: {topics: {exact: [payments], prefix: [cards.], regex: ['pii\\.[a-z]+']}}
    action: {mask: {fields: [$.card]}}
""")
    assert selector == TopicSelector(frozenset({"payments"}), frozenset({"cards."}),
                                     frozenset({r"pii\.[a-z]+"}))
    assert selector.to_json() == {"exact": ["payments"], "prefix": ["cards."],
                                  "regex": [r"pii\.[a-z]+"]}


def test_a_deny_rule_and_a_mask_select_the_union_of_their_topics() -> None:
    selector = produce_selector("""
rules:
  - id: no-secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: would-block-logs
    mode: dry-run
    match: {apis: [Produce], topics: {exact: [logs]}}
    action: {deny: {}}
  - id: mask-cards
    match: {topics: {exact: [payments]}}
    action: {mask: {fields: [$.card]}}
""")
    assert selector == TopicSelector(frozenset({"payments", "logs"}), frozenset({"secret."}))


@pytest.mark.parametrize("rules", [
    pytest.param("""
rules:
  - id: mask-everything
    match: {principals: {exact: [User:bob]}}
    action: {mask: {fields: [$.card]}}
""", id="a record rule without topics"),
    pytest.param("""
rules:
  - id: mask-cards
    match: {topics: {exact: [payments]}}
    action: {mask: {fields: [$.card]}}
  - id: big-batches
    match: {apis: [Produce]}
    action: {safeguard: {max_batch_bytes: 1048576}}
""", id="a safeguard on every topic"),
    pytest.param("""
rules:
  - id: mask-cards
    match: {topics: {exact: [payments]}}
    action: {mask: {fields: [$.card]}}
  - id: slow-down
    match: {apis: [Produce]}
    action: {rate: {bytes_per_second: 1000, per: client_id}}
""", id="a rate rule on every topic"),
    pytest.param("""
rules:
  - id: watch
    match: {apis: [Produce]}
    action: {observe: {}}
""", id="an observe rule on every topic"),
    pytest.param("""
rules:
  - id: not-public
    match: {apis: [Produce], not: {topics: {prefix: [public.]}}}
    action: {deny: {}}
""", id="topics only inside not"),
    pytest.param("""
rules:
  - id: tenant-a
    match: {principals: {exact: [User:alice]}}
    action: {virtual_topics: {prefix: "tenant-a."}}
  - id: mask-cards
    match: {topics: {exact: [tenant-a.payments]}}
    action: {mask: {fields: [$.card]}}
""", id="virtual topics rename what clients name"),
    pytest.param("""
rules:
  - id: no-produce
    match: {topics: {exact: [payments]}}
    action: {deny_apis: [Produce]}
  - id: no-fetch
    action: {deny_apis: [Produce, Fetch]}
""", id="an API denied whatever the topics"),
    pytest.param("""
rules:
  - id: odd-pattern
    match: {apis: [Produce], topics: {regex: ['pay\\s+x']}}
    action: {deny: {}}
""", id="a pattern the module might read otherwise"),
])
def test_rules_that_may_act_whatever_the_topics_leave_produce_unselected(rules: str) -> None:
    assert produce_selector(rules) is None


def test_a_rule_naming_no_topics_but_someone_selects_all_their_requests() -> None:
    engine = RuleEngine(CompiledRuleSet(load_rule_text("""
rules:
  - id: mask-cards
    match: {topics: {exact: [payments]}}
    action: {mask: {fields: [$.card]}}
  - id: slow-down
    match: {apis: [Produce], client_ids: {exact: [loud]}}
    action: {rate: {bytes_per_second: 1000, per: client_id}}
""", "r.yaml")))
    try:
        produce = next(r for r in interest_ranges(engine) if r.api_key == ApiKey.PRODUCE)
    finally:
        engine.records.close()
    assert produce.selector == TopicSelector(frozenset({"payments"}))
    assert produce.whole is not None and [c.to_json() for c in produce.whole] == [
        {"client_ids": {"exact": ["loud"], "prefix": [], "regex": []}}], \
        "every Produce of client loud, whatever its topics"


def test_response_record_rules_select_fetch_and_leave_produce_alone() -> None:
    found = ranges("""
rules:
  - id: mask-on-read
    match: {direction: response, topics: {exact: [pii]}}
    action: {mask: {fields: [$.email]}}
""")
    assert ApiKey.PRODUCE not in found
    fetch = found[ApiKey.FETCH]
    assert fetch[0][2] == TopicSelector(frozenset({"pii"}))
    assert fetch[0][1] == FETCH_HIGH and fetch[-1] == (FETCH_HIGH + 1, MAX_VERSION, None)
    # Share groups read with ShareFetch: selected the same way (the module reads v1).
    share = found[ApiKey.SHARE_FETCH]
    assert share[0] == (0, 1, TopicSelector(frozenset({"pii"})))
    assert share[-1] == (2, MAX_VERSION, None)


def test_without_rules_nothing_is_selected_and_learning_apis_stay_whole() -> None:
    found = ranges("rules: []\n")
    assert ApiKey.PRODUCE not in found and ApiKey.FETCH not in found
    assert all(selector is None for entries in found.values() for _, _, selector in entries)


def test_the_table_without_selectors_is_what_it_was() -> None:
    engine = RuleEngine(CompiledRuleSet(load_rule_text("""
rules:
  - id: mask-cards
    match: {topics: {exact: [payments]}}
    action: {mask: {fields: [$.card]}}
""", "r.yaml")))
    table = interest_table(engine)
    assert (ApiKey.PRODUCE, 0, MAX_VERSION) in table
    assert [(r.api_key, r.low, r.high) for r in interest_ranges(engine)] != table, \
        "Produce split where its selector ends"
    engine.records.close()
    assert interest_table(RuleEngine(CompiledRuleSet(RuleSet()))) == [
        (r.api_key, r.low, r.high) for r in interest_ranges(RuleEngine(CompiledRuleSet(RuleSet())))]


@pytest.mark.parametrize(("pattern", "portable"), [
    (r"payments\..*", True), (r"orders-[0-9]+", True), (r"(?i)pay.*", True),
    (r"\d+\w*", True), (r"x{2,10}", True), (r"[]a]+", True),
    (r"a\sb", False), (r"\bword", False), (r"\Qa.b\E", False), (r"\pL+", False),
    (r"[[:alpha:]]", False), (r"[a-z&&x]", False), (r"[[a]", False), (r"x{1000}", False),
    (r"(?P<n>a)", False), (r"(?s).*", False), ("café", False), (r"\101", False),
    # RE2 reads these, the module's engine refuses them (a refused table): not given.
    (r"x{,5}", False), (r"{", False), (r"a{1", False), (r"[\d-z]", False), (r"(?i)*", False),
    (r"(?i)a{2}", True),
])
def test_only_patterns_both_engines_read_alike_go_to_the_module(pattern: str,
                                                                portable: bool) -> None:
    assert portable_regex(pattern) is portable


def test_a_union_past_the_bound_selects_everything_and_stays_linear() -> None:
    from ext_proc.filters import MAX_SELECTOR_ENTRIES, TopicSelector, union_scope

    small = [TopicSelector(prefix=frozenset({f"t{i}."})) for i in range(MAX_SELECTOR_ENTRIES)]
    union = union_scope(small)
    assert union is not None and len(union.prefix) == MAX_SELECTOR_ENTRIES
    # 100,000 topic rules: no selector (hand off all), decided without a quadratic union.
    many = (TopicSelector(prefix=frozenset({f"t{i}."})) for i in range(100_000))
    assert union_scope(many) is None


# --- vouched schema ids: the fifth element ----------------------------------------------------


def unvouched(rules: str) -> dict[int, TopicSelector | None]:
    """Per API, the unvouched selector of the range of versions keg reads."""
    engine = RuleEngine(CompiledRuleSet(load_rule_text(rules, "r.yaml")))
    try:
        return {r.api_key: r.unvouched for r in interest_ranges(engine)
                if r.api_key in (ApiKey.PRODUCE, ApiKey.FETCH) and r.low == 0}
    finally:
        engine.records.close()


SCHEMA_IDS = """
rules:
  - id: ids
    match: {topics: {prefix: [s.]}}
    action: {schema: {registry: {url: "http://127.0.0.1:1"}}}
  - id: ids-fetched
    match: {direction: response, topics: {prefix: [f.]}}
    action: {schema: {registry: {url: "http://127.0.0.1:1"}}}
"""


def test_ids_only_schema_rules_are_vouchable_everywhere_they_select() -> None:
    empty = TopicSelector(frozenset(), frozenset(), frozenset())
    assert unvouched(SCHEMA_IDS) == {ApiKey.PRODUCE: empty, ApiKey.FETCH: empty}


def test_other_rules_on_the_range_name_their_topics_as_unvouched() -> None:
    got = unvouched(SCHEMA_IDS + """
  - id: mask
    match: {topics: {exact: [s.cards]}}
    action: {mask: {fields: [$.card]}}
  - id: deny
    match: {apis: [Produce], topics: {exact: [s.secret]}}
    action: {deny: {}}
""")
    assert got[ApiKey.PRODUCE] == TopicSelector(frozenset({"s.cards", "s.secret"}), frozenset(),
                                                frozenset())


@pytest.mark.parametrize("extra", [
    "validate_payload: true", "target: key", "subject: record_name"])
def test_rules_that_read_more_than_the_value_id(extra: str) -> None:
    rules = f"""
rules:
  - id: ids
    match: {{topics: {{prefix: [s.]}}}}
    action: {{schema: {{registry: {{url: "http://127.0.0.1:1"}}, {extra}}}}}
"""
    # record_name is vouchable too (Protobuf ids under it never are passing: per record),
    # and so is payload validation (ids of JSON Schemas the filter checks itself).
    vouchable = extra != "target: key"
    assert (unvouched(rules).get(ApiKey.PRODUCE) is not None) == vouchable


def test_dry_run_schema_rules_and_unscoped_filters_leave_no_vouching() -> None:
    dry = SCHEMA_IDS.replace("match: {topics: {prefix: [s.]}}\n",
                             "match: {topics: {prefix: [s.]}}\n    mode: dry-run\n", 1)
    assert "dry-run" in dry
    assert unvouched(dry).get(ApiKey.PRODUCE) is None
    everywhere = SCHEMA_IDS + """
  - id: observe-all
    match: {apis: [Produce]}
    action: {observe: {}}
"""
    assert unvouched(everywhere).get(ApiKey.PRODUCE) is None

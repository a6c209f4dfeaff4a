"""The rule index narrows candidates exactly as a scan of every rule would decide."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from filter_rules import CompiledRuleSet, MatchContext, load_rule_text
from kafka_wire import ApiKey


def rules_text(n: int) -> str:
    lines = ["rules:"]
    for i in range(n):
        kind = i % 4
        if kind == 0:
            match = f"topics: {{prefix: [team-{i}.]}}"
        elif kind == 1:
            match = f"topics: {{exact: [orders-{i}]}}"
        elif kind == 2:
            match = f"principals: {{exact: [user-{i}]}}"
        else:
            match = f"topics: {{regex: ['logs-{i}-[0-9]+']}}"
        lines.append(f"  - id: r{i}\n    match: {{apis: [Produce], {match}}}\n"
                     f"    action: {{deny: {{}}}}")
    return "\n".join(lines) + "\n"


COMPILED = CompiledRuleSet(load_rule_text(rules_text(1000), "generated.yaml"))


def scan(topic: str, principal: str) -> set[str]:
    ctx = MatchContext(api_key=ApiKey.PRODUCE, api_version=9, principal=principal)
    return {r.id for r in COMPILED.candidates(ApiKey.PRODUCE, 9, "request")
            if r.matches(ctx, topic)}


def indexed(topic: str, principal: str) -> set[str]:
    ctx = MatchContext(api_key=ApiKey.PRODUCE, api_version=9, principal=principal)
    rules = COMPILED.relevant(ApiKey.PRODUCE, 9, "request", [topic], ctx.principal)
    return {r.id for r in rules if r.matches(ctx, topic)}


names = st.one_of(
    st.builds(lambda i, s: f"team-{i}.{s}", st.integers(0, 1100), st.text("abc", max_size=3)),
    st.builds(lambda i: f"orders-{i}", st.integers(0, 1100)),
    st.builds(lambda i, j: f"logs-{i}-{j}", st.integers(0, 1100), st.integers(0, 99)),
    st.text("team-.0123456789", max_size=12),
)
principals = st.builds(lambda i: f"user-{i}", st.integers(0, 1100))


@settings(max_examples=300, deadline=None)
@given(names, principals)
def test_index_agrees_with_a_scan(topic: str, principal: str) -> None:
    assert indexed(topic, principal) == scan(topic, principal)


def test_index_returns_few_candidates_in_order() -> None:
    ctx = MatchContext(api_key=ApiKey.PRODUCE, api_version=9, principal="user-2")
    rules = COMPILED.relevant(ApiKey.PRODUCE, 9, "request", ["team-4.x"], ctx.principal)
    assert [r.id for r in rules] == ["r2", "r4"]  # the principal rule, the prefix rule
    assert [r.position for r in rules] == sorted(r.position for r in rules)


def test_an_unrelated_frame_meets_no_rule() -> None:
    assert COMPILED.relevant(ApiKey.PRODUCE, 9, "request", ["unrelated"], "User:nobody") == ()
    regex_hit = COMPILED.relevant(ApiKey.PRODUCE, 9, "request", ["logs-7-42"], None)
    assert [r.id for r in regex_hit] == ["r7"]


def test_warm_builds_the_index_before_the_first_frame_and_versions_share_it() -> None:
    """The index was built by the first frame that needed it: over 100,000 rules that
    frame waited seconds, past Envoy's message timeout. `warm` builds it beforehand,
    once for every version with the same candidates."""
    compiled = CompiledRuleSet(load_rule_text(rules_text(100), "generated.yaml"))
    compiled.warm()
    # Produce requests, every version alike, and AddPartitionsToTxn (a deny of Produce
    # covers a transaction's writes).
    assert len(compiled._entry_indexes) == 2
    built = set(compiled._entry_indexes.values())
    for version in (3, 9, 11):
        relevant = compiled.relevant(ApiKey.PRODUCE, version, "request", ["team-4.x"], None)
        assert [r.id for r in relevant] == ["r4"]
        assert compiled._indexes[(ApiKey.PRODUCE, version, "request")] in built
    assert len({id(compiled._indexes[(ApiKey.PRODUCE, v, "request")]) for v in (3, 9, 11)}) == 1

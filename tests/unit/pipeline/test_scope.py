"""Which rules a backtest does not judge as the gateway would (pipeline.scope)."""

from __future__ import annotations

from pathlib import Path

from filter_rules import CompiledRuleSet, load_rule_dir
from pipeline.scope import unjudged

RULES = """\
rules:
  - id: no-payments
    match: {topics: {prefix: [payments.]}}
    action: {deny: {}}
  - id: mask-everywhere
    match: {topics: {prefix: [orders.]}}
    action: {mask: {fields: [$.card]}}
  - id: mask-for-analysts
    match: {not: {client_ids: {prefix: [analyst-]}}}
    action: {mask: {fields: [$.email]}}
  - id: mask-old-clients
    match: {versions: {max: 11}, listeners: ["0.0.0.0:9092"]}
    action: {mask: {fields: [$.name]}}
  - id: mask-share-consumers
    match: {apis: [ShareFetch], direction: response}
    action: {mask: {fields: [$.name]}}
  - id: switched-off
    mode: disabled
    action: {deny: {}}
"""


def test_request_rules_are_not_evaluated_and_connection_matches_are_approximate(
        tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    found = {u.rule_id: u for u in unjudged(CompiledRuleSet(load_rule_dir(tmp_path)))}
    assert set(found) == {"no-payments", "mask-for-analysts", "mask-old-clients",
                          "mask-share-consumers"}
    assert not found["no-payments"].approximate
    assert found["no-payments"].line().startswith(f"{tmp_path / 'rules.yaml'}:2:")
    assert "not evaluated: a backtest runs record rules only" in found["no-payments"].line()
    assert "client ids" in found["mask-for-analysts"].reason  # inside `not`
    old = found["mask-old-clients"].reason
    assert "API versions (judged at Produce v13 and Fetch v18)" in old and "listeners" in old
    assert "judged as Fetch answers" in found["mask-share-consumers"].reason
    assert all(u.approximate for k, u in found.items() if k != "no-payments")

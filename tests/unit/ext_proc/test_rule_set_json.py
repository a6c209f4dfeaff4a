"""Rule sets as JSON a rule at a time: the same bytes and the same values as the
whole-document calls they replace (which hold the GIL for seconds at 100,000 rules)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from ext_proc.rule_set_json import dumps_rule_set, loads_pieces, rule_set_from
from filter_rules import DEFAULT_RULES_DIR, RuleSet, load_rule_dir, load_rule_text


def whole(ruleset: RuleSet) -> bytes:
    return json.dumps(ruleset.model_dump(mode="json", by_alias=True), sort_keys=True,
                      separators=(",", ":")).encode()


@pytest.mark.parametrize("ruleset", [
    RuleSet(),
    load_rule_dir(DEFAULT_RULES_DIR),  # every kind of rule keg ships, with sources
    load_rule_text("rules:\n  - id: b\n    action: {deny: {}}\n  - id: a\n"
                   "    description: \"ünïcode \\\"quoted\\\" [brackets] {braces}\"\n"
                   "    action: {observe: {}}\n", "dir/ü.yaml"),
], ids=["empty", "shipped", "unicode"])
def test_dumps_writes_what_json_dumps_wrote(ruleset: RuleSet) -> None:
    text = dumps_rule_set(ruleset)
    assert text == whole(ruleset)
    assert rule_set_from(loads_pieces(text)) == ruleset


@pytest.mark.parametrize("text", [
    '{"rules":[],"sources":{}}',
    ' { "a" : [ 1 , {"b": [2, 3]} , [ ] ] , "c" : { } , "d" : "x" , "e": null } ',
    '{"version":"7","ruleset":{"rules":[{"id":"a","deep":[[[[1]]]]}],"sources":{"a":{}}}}',
    '[1, "two", [3, [4]], {"five": 5}]',
    '"just a string"',
    "42",
    '{"dup": 1, "dup": 2}',
])
def test_loads_pieces_reads_what_json_loads_reads(text: str) -> None:
    assert loads_pieces(text) == json.loads(text)
    assert loads_pieces(text.encode()) == json.loads(text)


@pytest.mark.parametrize("text", [
    "", "{", '{"a" 1}', '{"a":1,}', "[1 2]", '{"a":1} x', "{1: 2}", '{"a":[1,]}', "[",
])
def test_loads_pieces_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        loads_pieces(text)


@pytest.mark.parametrize("data", [
    {"rules": [{"id": "x"}]},  # a rule without an action
    {"rules": [{"id": "a", "action": {"deny": {}}}] * 2},  # the same id twice
    {"rules": [], "sources": {}, "extra": 1},  # an unknown key
    {"rules": [], "sources": {"a": {"line": 1}}},  # a source without a file
    {"rules": "not a list"},
    [],
])
def test_rule_set_from_refuses_what_model_validate_refuses(data: Any) -> None:
    with pytest.raises(ValidationError):
        RuleSet.model_validate(data)
    with pytest.raises(ValidationError):
        rule_set_from(data)

"""The published JSON Schema and the shipped rule files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from filter_rules import DEFAULT_RULES_DIR, load_rule_dir, load_rule_file
from filter_rules.schema import SCHEMA_PATH, render_schema, rule_file_schema

PACKAGE = SCHEMA_PATH.parent
SHIPPED = sorted(PACKAGE.glob("rules/*.yaml")) + sorted(PACKAGE.glob("examples/*.yaml"))
MODELINE = "# yaml-language-server: $schema=../rules.schema.json"


def test_checked_in_schema_is_up_to_date() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == render_schema(), (
        "filter_rules/rules.schema.json is stale: run "
        "`python -m filter_rules.schema > filter_rules/rules.schema.json`"
    )


def test_schema_names_apis_and_errors() -> None:
    schema = rule_file_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    api_names = schema["$defs"]["ApiRef"]["anyOf"][0]["enum"]
    assert {"Produce", "Fetch", "CreateTopics", "ApiVersions"} <= set(api_names)
    assert "POLICY_VIOLATION" in schema["$defs"]["ErrorName"]["enum"]
    assert set(schema["$defs"]["Rule"]["required"]) == {"id", "action"}


def test_default_and_example_rule_files_are_shipped() -> None:
    assert DEFAULT_RULES_DIR == PACKAGE / "rules"
    names = {p.relative_to(PACKAGE).as_posix() for p in SHIPPED}
    assert {"rules/admin-audit.yaml", "rules/payments.yaml"} <= names
    assert len([n for n in names if n.startswith("examples/")]) >= 3


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_shipped_file_loads_and_carries_the_modeline(path: Path) -> None:
    ruleset = load_rule_file(path)
    assert ruleset.rules
    assert MODELINE in path.read_text(encoding="utf-8").splitlines()[:3]


def test_shipped_directories_load_as_sets() -> None:
    assert load_rule_dir(PACKAGE / "rules").rules
    assert load_rule_dir(PACKAGE / "examples").rules


def test_default_rules_never_block_traffic() -> None:
    for rule in load_rule_dir().rules:
        assert rule.action.kind == "observe" or rule.mode in ("dry-run", "disabled"), rule.id


# --- the schema agrees with the model ---------------------------------------------


def validator() -> Any:
    """A validator of the checked-in schema; skips the test without jsonschema (dev dep)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_shipped_file_validates_against_the_published_schema(path: Path) -> None:
    check = validator()
    for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        errors = [e.message for e in check.iter_errors(document)]
        assert errors == []


@pytest.mark.parametrize("document", [
    {"rules": [{"id": "x", "action": {"observe": {}}, "colour": "red"}]},
    {"rules": [{"id": "Upper", "action": {"observe": {}}}]},
    {"rules": [{"id": "x", "action": {"observe": {}, "deny": {}}}]},
    {"rules": [{"id": "x", "action": {"mask": {}}}]},
    {"rules": [{"id": "x", "match": {"apis": ["Produce", "Nope"]}, "action": {"deny": {}}}]},
    {"rules": [{"id": "x", "action": {"deny": {"error": "NOPE"}}}]},
    {"rules": [{"id": "x", "mode": "on", "action": {"deny": {}}}]},
    {"rules": [{"id": "x", "order": "1", "action": {"deny": {}}}]},
    {"apiVersion": "keg/v2", "rules": []},
    {"rules": [{"action": {"deny": {}}}]},
])
def test_schema_rejects_what_the_model_rejects(document: dict[str, Any]) -> None:
    assert list(validator().iter_errors(document))


@pytest.mark.parametrize("document", [
    None,
    [],
    [{"id": "x", "action": {"observe": {}}}],
    {"rules": [{"id": "x", "match": {"apis": ["Produce", 0], "not": {"brokers": [1]}},
                "action": {"rate": {"per": "topic", "bytes_per_second": 10}}}]},
])
def test_schema_accepts_what_the_model_accepts(document: Any) -> None:
    assert list(validator().iter_errors(document)) == []

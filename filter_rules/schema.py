"""The published JSON Schema of rule files, generated from the pydantic model.

`filter_rules/rules.schema.json` is checked in so editors can use it (rule files
carry a `# yaml-language-server: $schema=../rules.schema.json` modeline); a unit test
fails when it drifts from the model. Regenerate it with

    python -m filter_rules.schema > filter_rules/rules.schema.json

The schema checks shapes, names and enums; the loader also compiles regexes with
RE2, parses CIDRs and listener addresses, and rejects duplicate rule ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from pydantic import TypeAdapter

from filter_rules.model import API_REF_SCHEMA, ERROR_NAME_SCHEMA, Rule, RuleFile

SCHEMA_PATH: Final = Path(__file__).resolve().with_name("rules.schema.json")
JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"


def rule_file_schema() -> dict[str, Any]:
    """The JSON Schema of one rule-file document: a RuleSet mapping, a list of rules,
    or nothing (an empty file)."""
    adapter: TypeAdapter[RuleFile | list[Rule] | None] = TypeAdapter(RuleFile | list[Rule] | None)
    schema = adapter.json_schema(by_alias=True, mode="validation")
    # The API and error enums are long: define them once and refer to them.
    defs = schema["$defs"]
    defs["ApiRef"] = API_REF_SCHEMA
    defs["ErrorName"] = ERROR_NAME_SCHEMA
    schema = _hoist(schema, API_REF_SCHEMA, {"$ref": "#/$defs/ApiRef"})
    schema = _hoist(schema, ERROR_NAME_SCHEMA, {"$ref": "#/$defs/ErrorName"})
    schema["$defs"] = dict(sorted(schema["$defs"].items()))
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": "keg rule file",
        "description": (
            "Rules for keg, the Kafka Envoy Gateway (apiVersion keg/v1). "
            "See docs/rules.md."
        ),
        **schema,
    }


def _hoist(node: Any, definition: dict[str, Any], ref: dict[str, str]) -> Any:
    """`node` with every inline copy of `definition` (below $defs' own entry) -> `ref`."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if value == definition and key not in ("ApiRef", "ErrorName"):
                out[key] = ref
            else:
                out[key] = _hoist(value, definition, ref)
        return out
    if isinstance(node, list):
        return [ref if item == definition else _hoist(item, definition, ref) for item in node]
    return node


def render_schema() -> str:
    """The schema as the checked-in file holds it."""
    return json.dumps(rule_file_schema(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    sys.stdout.write(render_schema())


if __name__ == "__main__":
    main()

"""Which JSON Schemas keg's Kafka filter checks payloads against itself, and the corpus
that holds the two validators to the same verdicts.

`native_subset` admits a schema only when the Rust validator (the `jsonschema` crate)
and this service's (`JsonSchemaCheck`: fastjsonschema, then jsonschema) judge alike.
The corpus (`envoy/kafka_filter/tests/data/payload_verdicts.json`) lists schemas of the
subset, payloads (raw bytes as text) and this service's verdict on each; this test
checks the verdicts are still this service's, and the Rust test
`tests/payload_verdicts.rs` that the module gives the same ones. Regenerate after a
change here: `KEG_WRITE_CORPUS=1 pytest tests/unit/interceptors/test_native_subset.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from interceptors.json_schema import JsonSchemaCheck, native_subset

CORPUS = Path(__file__).parents[3] / "envoy/kafka_filter/tests/data/payload_verdicts.json"

ORDER = {"type": "object", "required": ["id", "amount"],
         "properties": {"id": {"type": "integer", "minimum": 1},
                        "amount": {"type": "number", "exclusiveMaximum": 1e9},
                        "note": {"type": ["string", "null"], "maxLength": 4},
                        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                        "kind": {"enum": ["a", "b", 1, None]},
                        "v": {"const": 2}},
         "additionalProperties": False}

SUBSET: list[Any] = [
    ORDER,
    {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order",
     "definitions": {"pos": {"type": "integer", "exclusiveMinimum": 0}},
     "type": "object", "properties": {"id": {"$ref": "#/definitions/pos"}},
     "required": ["id"]},
    {"$schema": "https://json-schema.org/draft/2020-12/schema",
     "$defs": {"pos": {"type": "integer", "minimum": 0}},
     "anyOf": [{"$ref": "#/$defs/pos"}, {"type": "string", "minLength": 2}]},
    {"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 3}]},
    {"not": {"type": "object", "minProperties": 2}},
    {"type": "object", "properties": {"email": {"type": "string", "format": "email"}},
     "maxProperties": 3},
    {"allOf": [{"type": "array", "minItems": 1}, {"items": False}]},
    True,
    False,
]

NOT_SUBSET: list[Any] = [
    {"type": "string", "pattern": "^a+$"},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"},
    {"$schema": "http://json-schema.org/draft-06/schema#", "type": "integer"},
    {"$ref": "https://example.com/order.json"},
    {"properties": {"a": {"$id": "inner", "type": "string"}}},
    {"type": "number", "multipleOf": 0.01},
    {"type": "array", "items": [{"type": "string"}]},
    {"type": "array", "uniqueItems": True},
    {"patternProperties": {"^x": {}}},
    {"type": "integer", "maximum": 2**60},
    {"enum": [2**60]},
    {"type": "number", "exclusiveMinimum": True},
    {"minLength": -1},
    {"prefixItems": [{}]},
    {"type": []},
    {"type": "decimal"},
    {"anyOf": []},
    {"description": "x" * 20_000},
    ["not", "an", "object"],
]


@pytest.mark.parametrize("schema", SUBSET[:-2])
def test_schemas_of_the_subset_are_admitted(schema: Any) -> None:
    assert native_subset(schema)


@pytest.mark.parametrize("schema", NOT_SUBSET)
def test_what_either_validator_might_read_otherwise_is_not(schema: Any) -> None:
    assert not native_subset(schema)


def test_deeply_nested_schemas_are_not_admitted() -> None:
    deep: Any = {"type": "object"}
    for _ in range(40):
        deep = {"properties": {"a": deep}}
    assert not native_subset(deep)


# Payloads as the raw bytes a record carries after its Confluent prefix (text here).
PAYLOADS = [
    '{"id": 1, "amount": 2.5}', '{"id": 1.0, "amount": 2}', '{"id": 0, "amount": 1}',
    '{"id": 1}', '{"id": 1, "amount": 1, "x": 1}', '{"id": 1, "amount": 1, "note": "12345"}',
    '{"id": 1, "amount": 1, "note": "\\u00e9t\\u00e9!"}', '{"id": 1, "amount": 1, "note": null}',
    '{"id": 1, "amount": "1"}', '{"id": true, "amount": 1}', '{"id": 1, "amount": 1e9}',
    '{"id": 1, "amount": 999999999.99}', '{"id": 1, "amount": 1, "tags": ["a", "b", "c"]}',
    '{"id": 1, "amount": 1, "tags": ["a", 1]}', '{"id": 1, "amount": 1, "kind": 1.0}',
    '{"id": 1, "amount": 1, "kind": true}', '{"id": 1, "amount": 1, "kind": null}',
    '{"id": 1, "amount": 1, "v": 2.0}', '{"id": 1, "amount": 1, "v": "2"}',
    '{"id": 1, "id": 0, "amount": 1}', '{"id": 0, "id": 1, "amount": 1}',
    '{"id": 123456789012345678901234567890, "amount": 1}', '{"id": 1, "amount": 1e400}',
    '{"id": 1, "amount": -0.0}', ' {"id": 1, "amount": 1} ', '{"id": 1, "amount": 1} x',
    '{"id": NaN, "amount": 1}', '{"id": 1, "amount": 1,}', "[]", "[1]", '["a", "b"]', "[[]]",
    "2", "3", "3.5", "4", "-1", '"ab"', '"a"', "null", "true", '{"a": 1}', '{"a": 1, "b": 2}',
    '{"email": "not an address"}', '{"email": 5}', '{"a": 1, "b": 2, "c": 3, "d": 4}', "",
    "{", '"\\ud800"', "\ufeff{}",
]


def _python_verdicts() -> list[dict[str, Any]]:
    cases = []
    for schema in SUBSET:
        check = JsonSchemaCheck(schema)
        for payload in PAYLOADS:
            cases.append({"schema": orjson.dumps(schema).decode(), "payload": payload,
                          "valid": _python_valid(check, payload.encode())})
    return cases


def _python_valid(check: JsonSchemaCheck, payload: bytes) -> bool:
    """As RegisteredSchema.check reads a payload (orjson, then the exact codec)."""
    from interceptors.registry import JSON_CODEC

    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        try:
            doc = JSON_CODEC.decode(payload)
        except ValueError:
            return False
    return check.reason(doc) is None


def test_the_corpus_holds_this_services_verdicts() -> None:
    cases = _python_verdicts()
    if os.environ.get("KEG_WRITE_CORPUS"):
        CORPUS.write_text(json.dumps(cases, indent=1, ensure_ascii=True) + "\n")
    written = json.loads(CORPUS.read_text())
    assert written == cases, "the corpus is stale: regenerate it (see the module's docstring)"
    assert {case["valid"] for case in cases} == {True, False}

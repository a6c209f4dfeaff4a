"""JSON Schema checks: one schema, compiled once, judging documents.

The validator class is the one the schema's `$schema` names (2020-12 when none);
`format` is an annotation, not checked, as the specification says by default. Valid
documents are recognised by fastjsonschema's compiled check first; a document it refuses
(or any document, for schemas using 2019-09/2020-12-only keywords or remote `$ref`s) is
judged by jsonschema, whose verdict and message count. Used by the `validate` rule and
by the `schema` rule for a registry's JSON Schemas; `native_subset` says which schemas
keg's Kafka filter may check itself (the `jsonschema` crate, same test suite).
"""

from __future__ import annotations

from typing import Any, Final

import fastjsonschema
import orjson
from jsonschema import exceptions as schema_errors
from jsonschema import validators

from filter_rules.json_schemas import RECURSIVE, remote_refs, schema_problem
from interceptors.contract import InterceptorConfigError

MAX_REASON: Final = 200  # reasons travel in ProduceResponse record_errors


# Keywords of drafts 2019-09 and 2020-12 that fastjsonschema (drafts 4 to 7) would
# silently ignore: a schema using one is checked by jsonschema alone.
_NEWER_KEYWORDS: Final = ("prefixItems", "unevaluatedProperties", "unevaluatedItems",
                          "dependentRequired", "dependentSchemas", "$dynamicRef",
                          "$recursiveRef", "minContains", "maxContains", "2019-09", "2020-12")


class JsonSchemaCheck:
    """One JSON Schema, checked (InterceptorConfigError when it is not a valid schema),
    judging documents: `reason(doc)` is None for a valid one, else where and why.

    `registry` (a `referencing.Registry`) holds the documents its `$ref`s may name."""

    __slots__ = ("_fast", "_json")

    def __init__(self, schema: Any, registry: Any = None) -> None:
        self._json = _json_validator(schema, registry)
        self._fast = _fast_validator(schema) if registry is None else None

    def reason(self, doc: Any) -> str | None:
        try:
            return self._reason(doc)
        except RecursionError:
            # A `$ref` cycle that reads nothing ({"$ref": "#"}: refused when built; one
            # only some documents reach, here): no such document is ever valid.
            return RECURSIVE

    def _reason(self, doc: Any) -> str | None:
        if self._fast is not None:
            try:
                self._fast(doc)
                return None  # valid: the common case, at compiled-code speed
            except fastjsonschema.JsonSchemaException:
                pass  # jsonschema has the final word and the precise message
        error = schema_errors.best_match(self._json.iter_errors(doc))
        if error is None:
            return None
        return short_reason(f"{error.json_path}: {error.message}")


def _json_validator(schema: Any, registry: Any = None) -> Any:
    problem = schema_problem(schema)
    if problem is not None:
        raise InterceptorConfigError(problem)
    cls = validators.validator_for(schema)
    return cls(schema) if registry is None else cls(schema, registry=registry)


def _fast_validator(schema: Any) -> Any:
    """fastjsonschema's compiled check (about 12x faster than jsonschema on a 1 KiB
    order, docs/dependencies.md), or None where it might judge differently."""
    text = orjson.dumps(schema).decode()
    if any(keyword in text for keyword in _NEWER_KEYWORDS) or remote_refs(schema):
        return None  # (fastjsonschema would fetch remote references)
    try:
        return fastjsonschema.compile(schema, use_default=False)
    except (fastjsonschema.JsonSchemaDefinitionException, ValueError, TypeError):
        return None


# --- the subset keg's Kafka filter checks itself ----------------------------------------

# Drafts whose semantics the Rust validator (the `jsonschema` crate) and this module's
# agree on for the keywords below (draft 7 on: integers with a zero fraction, boolean
# schemas); no `$schema` means 2020-12 for both.
_NATIVE_DRAFTS: Final = frozenset({
    None, "http://json-schema.org/draft-07/schema#", "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema", "https://json-schema.org/draft/2020-12/schema"})
_SUBSCHEMA: Final = frozenset({"additionalProperties", "items", "not"})
_SUBSCHEMA_MAPS: Final = frozenset({"properties", "definitions", "$defs"})
_SUBSCHEMA_LISTS: Final = frozenset({"allOf", "anyOf", "oneOf"})
_COUNTS: Final = frozenset({"minLength", "maxLength", "minItems", "maxItems",
                            "minProperties", "maxProperties"})
_BOUNDS: Final = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_ANNOTATIONS: Final = frozenset({"title", "description", "default", "examples", "$comment",
                                 "format", "readOnly", "writeOnly", "deprecated"})
_TYPES: Final = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
# Numbers both sides compare exactly (the Rust side reads JSON numbers as 64-bit values).
_EXACT: Final = 2**53
_MAX_DEPTH: Final = 32
NATIVE_SCHEMA_TEXT: Final = 16 << 10


def native_subset(schema: Any) -> bool:
    """Whether keg's Kafka filter may check payloads against `schema` itself
    (docs/native.md, vouched schema ids): only keywords whose meaning the
    JSON-Schema-Test-Suite pins for both validators, no `pattern` (two regex dialects),
    local `$ref`s only, numbers within 2^53, draft 7 or later. Anything else is checked
    here, by the Python service, as before."""
    if not isinstance(schema, dict) or schema.get("$schema") not in _NATIVE_DRAFTS:
        return False
    if "$id" in schema and not isinstance(schema["$id"], str):
        return False
    root = {k: v for k, v in schema.items() if k not in ("$schema", "$id")}
    return len(orjson.dumps(schema)) <= NATIVE_SCHEMA_TEXT and _native(root, 0)


def _native(node: Any, depth: int) -> bool:
    if isinstance(node, bool):
        return True
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return False
    for keyword, value in node.items():
        if keyword in _ANNOTATIONS:
            continue
        if keyword in _SUBSCHEMA:
            ok = _native(value, depth + 1)
        elif keyword in _SUBSCHEMA_MAPS:
            ok = isinstance(value, dict) and all(_native(v, depth + 1) for v in value.values())
        elif keyword in _SUBSCHEMA_LISTS:
            ok = isinstance(value, list) and bool(value) and all(
                _native(v, depth + 1) for v in value)
        elif keyword == "type":
            names = value if isinstance(value, list) else [value]
            ok = bool(names) and all(isinstance(n, str) and n in _TYPES for n in names)
        elif keyword == "required":
            ok = isinstance(value, list) and all(isinstance(n, str) for n in value)
        elif keyword in _COUNTS:
            ok = type(value) is int and 0 <= value < _EXACT
        elif keyword in _BOUNDS:
            ok = _exact_number(value)
        elif keyword == "enum":
            ok = isinstance(value, list) and all(_exact_value(v) for v in value)
        elif keyword == "const":
            ok = _exact_value(value)
        elif keyword == "$ref":
            ok = isinstance(value, str) and value.startswith("#")
        else:
            ok = False  # pattern, format-assertion vocabularies, anything newer: Python
        if not ok:
            return False
    return True


def _exact_number(value: Any) -> bool:
    return type(value) in (int, float) and abs(value) <= _EXACT


def _exact_value(value: Any) -> bool:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, (int, float)):
        return _exact_number(value)
    if isinstance(value, list):
        return all(_exact_value(v) for v in value)
    if isinstance(value, dict):
        return all(_exact_value(v) for v in value.values())
    return False


def short_reason(reason: str) -> str:
    """A reason cut to what record_errors carry."""
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."

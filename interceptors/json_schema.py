"""JSON Schema checks: one schema, compiled once, judging documents.

The validator class is the one the schema's `$schema` names (2020-12 when none);
`format` is an annotation, not checked, as the specification says by default. Valid
documents are recognised by fastjsonschema's compiled check first; a document it refuses
(or any document, for schemas using 2019-09/2020-12-only keywords or remote `$ref`s) is
judged by jsonschema, whose verdict and message count. Used by the `validate` rule and
by the `schema` rule for a registry's JSON Schemas.
"""

from __future__ import annotations

from typing import Any, Final

import fastjsonschema
import orjson
from jsonschema import exceptions as schema_errors
from jsonschema import validators

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
    if not isinstance(schema, (dict, bool)):
        raise InterceptorConfigError("a JSON Schema is an object (or true/false)")
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except schema_errors.SchemaError as exc:
        raise InterceptorConfigError(
            f"invalid JSON Schema at {exc.json_path}: {short_reason(exc.message)}"
        ) from None
    return cls(schema) if registry is None else cls(schema, registry=registry)


def _fast_validator(schema: Any) -> Any:
    """fastjsonschema's compiled check (about 12x faster than jsonschema on a 1 KiB
    order, docs/dependencies.md), or None where it might judge differently."""
    text = orjson.dumps(schema).decode()
    if any(keyword in text for keyword in _NEWER_KEYWORDS) or _remote_refs(schema):
        return None  # (fastjsonschema would fetch remote references)
    try:
        return fastjsonschema.compile(schema, use_default=False)
    except (fastjsonschema.JsonSchemaDefinitionException, ValueError, TypeError):
        return None


def _remote_refs(node: Any) -> bool:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return True
        return any(_remote_refs(value) for value in node.values())
    if isinstance(node, list):
        return any(_remote_refs(value) for value in node)
    return False


def short_reason(reason: str) -> str:
    """A reason cut to what record_errors carry."""
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."

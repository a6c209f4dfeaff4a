"""validate: every record's key or value must satisfy a JSON Schema or an Avro schema.

A record that does not raises RecordRejected with a short reason naming where and
why (`$.amount: -3 is less than the minimum of 0`, `not valid JSON: ...`); the engine
refuses its batch with INVALID_RECORD. A valid record is returned untouched.

JSON Schema: the validator class is the one the schema's `$schema` names (2020-12
when none); `format` is an annotation, not checked, as the specification says by
default. Valid records are recognised by fastjsonschema's compiled check first; a
record it refuses (or any record, for schemas using 2019-09/2020-12-only keywords)
is judged by jsonschema, whose verdict and message count. References to other
documents are not fetched. Avro: the bytes must be
exactly one datum of the schema (with `framing: confluent`, after the 5-byte prefix).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import fastjsonschema
import orjson
from jsonschema import exceptions as schema_errors
from jsonschema import validators

from filter_rules.record_actions import ValidateSpec
from interceptors.avro import AvroCodec
from interceptors.contract import (
    BuildContext,
    InterceptedRecord,
    InterceptorConfigError,
    RecordRejected,
)
from interceptors.jsonpath import JSON_CODEC

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
        return _short(f"{error.json_path}: {error.message}")


class ValidateInterceptor:
    __slots__ = ("_avro", "_json", "allow_null", "target")

    def __init__(self, spec: ValidateSpec, ctx: BuildContext) -> None:
        self.target = spec.target
        self.allow_null = spec.allow_null
        self._avro = AvroCodec(spec.avro_schema, ctx) if spec.avro_schema is not None else None
        self._json: JsonSchemaCheck | None = None
        if self._avro is None:
            self._json = JsonSchemaCheck(_json_schema(spec, ctx))

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built when the rule set is compiled; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        data = record.value if self.target == "value" else record.key
        if data is None:
            if self.allow_null:
                return record
            raise RecordRejected(f"{self.target} is null")
        if self._avro is not None:
            try:
                self._avro.decode(data)
            except ValueError as exc:
                raise RecordRejected(_short(str(exc))) from None
            return record
        assert self._json is not None
        try:
            doc = JSON_CODEC.decode(data)
        except ValueError as exc:
            raise RecordRejected(_short(f"not valid JSON: {exc}")) from None
        reason = self._json.reason(doc)
        if reason is not None:
            raise RecordRejected(reason)
        return record


def build_validate(spec: ValidateSpec, ctx: BuildContext) -> ValidateInterceptor:
    return ValidateInterceptor(spec, ctx)


def _json_schema(spec: ValidateSpec, ctx: BuildContext) -> Any:
    if spec.json_schema is not None:
        return spec.json_schema
    assert spec.json_schema_file is not None
    path = ctx.resolve(spec.json_schema_file)
    try:
        return orjson.loads(path.read_bytes())
    except OSError as exc:
        raise InterceptorConfigError(f"cannot read JSON Schema {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise InterceptorConfigError(f"JSON Schema {path} is not JSON: {exc}") from None


def _json_validator(schema: Any, registry: Any = None) -> Any:
    if not isinstance(schema, (dict, bool)):
        raise InterceptorConfigError("a JSON Schema is an object (or true/false)")
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except schema_errors.SchemaError as exc:
        raise InterceptorConfigError(
            f"invalid JSON Schema at {exc.json_path}: {_short(exc.message)}"
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
    return _short(reason)


def _short(reason: str) -> str:
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."

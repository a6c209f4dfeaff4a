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
from typing import Any

import orjson

from filter_rules.files import read_regular_file
from filter_rules.record_actions import ValidateSpec
from interceptors.avro import AvroCodec
from interceptors.contract import (
    BuildContext,
    InterceptedRecord,
    InterceptorConfigError,
    RecordRejected,
)
from interceptors.json_schema import JsonSchemaCheck, short_reason
from interceptors.jsonpath import JSON_CODEC


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
                raise RecordRejected(short_reason(str(exc))) from None
            return record
        assert self._json is not None
        try:
            doc = JSON_CODEC.decode(data)
        except ValueError as exc:
            raise RecordRejected(short_reason(f"not valid JSON: {exc}")) from None
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
        return orjson.loads(read_regular_file(path))
    except OSError as exc:
        raise InterceptorConfigError(f"cannot read JSON Schema {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise InterceptorConfigError(f"JSON Schema {path} is not JSON: {exc}") from None

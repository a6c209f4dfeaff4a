"""validate's fast path (fastjsonschema) never changes a verdict jsonschema gives."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from filter_rules.record_actions import ValidateSpec
from interceptors import BuildContext, InterceptedRecord, RecordRejected
from interceptors.builtin.validate import ValidateInterceptor

ORDER = {"type": "object", "required": ["id", "amount"],
         "properties": {"id": {"type": "integer"}, "amount": {"type": "number", "minimum": 0},
                        "email": {"type": "string", "format": "email"}}}
NEWER = {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}
REMOTE = {"$ref": "https://example.invalid/schema.json"}


def validator(schema: dict[str, Any]) -> ValidateInterceptor:
    return ValidateInterceptor(ValidateSpec(json_schema=schema), BuildContext())


def verdict(v: ValidateInterceptor, doc: Any) -> str | None:
    try:
        v.intercept(InterceptedRecord("t", 0, None, orjson.dumps(doc)))
    except RecordRejected as err:
        return err.reason
    return None


def test_order_schema_uses_the_fast_path_and_keeps_jsonschemas_messages() -> None:
    v = validator(ORDER)
    assert v._json is not None and v._json._fast is not None
    assert verdict(v, {"id": 1, "amount": 2}) is None
    assert verdict(v, {"id": 1, "amount": -3}) == "$.amount: -3 is less than the minimum of 0"
    assert verdict(v, {"amount": 1}) == "$: 'id' is a required property"
    # format is an annotation for jsonschema: a value fastjsonschema refuses still passes
    assert verdict(v, {"id": 1, "amount": 1, "email": "not-an-email"}) is None


@pytest.mark.parametrize("schema", [NEWER, REMOTE])
def test_schemas_the_fast_path_could_misjudge_skip_it(schema: dict[str, Any]) -> None:
    check = validator(schema)._json
    assert check is not None and check._fast is None


def test_newer_keywords_are_enforced() -> None:
    v = validator(NEWER)
    assert verdict(v, [1]) is None
    assert verdict(v, ["x"]) is not None
    assert verdict(v, [1, 2]) is not None  # items: false after the prefix


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
    {"allOf": [{"$ref": "#"}]},
])
def test_a_ref_cycle_that_reads_nothing_is_refused_when_built(schema: dict[str, Any]) -> None:
    """Before: every record recursed to Python's limit and failed its batch as an
    interceptor error (UNKNOWN_SERVER_ERROR), never as the invalid record it is."""
    from interceptors.contract import InterceptorConfigError
    from interceptors.json_schema import RECURSIVE, JsonSchemaCheck

    with pytest.raises(InterceptorConfigError, match=RECURSIVE.replace("$", r"\$")):
        JsonSchemaCheck(schema)


def test_a_ref_cycle_only_some_documents_reach_refuses_those() -> None:
    from interceptors.json_schema import RECURSIVE, JsonSchemaCheck

    check = JsonSchemaCheck({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                             "properties": {"x": {"$ref": "#/$defs/a"}}})
    assert check.reason({"y": 1}) is None
    assert check.reason({"x": 1}) == RECURSIVE

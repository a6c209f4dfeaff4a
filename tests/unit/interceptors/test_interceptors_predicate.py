"""RecordPredicate compiled: key, headers, JSON fields, tombstones."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from filter_rules.record_actions import RecordPredicate
from interceptors import InterceptedRecord, InterceptorConfigError
from interceptors.predicate import CompiledPredicate


def predicate(**spec: Any) -> CompiledPredicate:
    return CompiledPredicate(RecordPredicate.model_validate(spec))


def record(
    value: Any = None,
    key: bytes | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
) -> InterceptedRecord:
    raw = value if value is None or isinstance(value, bytes) else orjson.dumps(value)
    return InterceptedRecord("t", 0, key, raw, headers or [])


def test_empty_predicate_matches_everything() -> None:
    assert predicate()(record())


def test_key() -> None:
    p = predicate(key={"prefix": ["eu-"], "regex": ["us-[0-9]+"]})
    assert p(record(key=b"eu-1"))
    assert p(record(key=b"us-42"))
    assert not p(record(key=b"us-x"))
    assert not p(record(key=None))
    assert not p(record(key=b"\xff\xfe"))  # not UTF-8


def test_headers_presence_and_value() -> None:
    p = predicate(headers={"tenant": {"exact": ["a"]}, "trace": None})
    assert p(record(headers=[("trace", None), ("tenant", b"a")]))
    assert not p(record(headers=[("tenant", b"a")]))  # trace absent
    assert not p(record(headers=[("trace", b""), ("tenant", None)]))  # null value
    assert not p(record(headers=[("trace", b""), ("tenant", b"\xff")]))
    # Kafka's lastHeader: the last value counts.
    assert not p(record(headers=[("trace", b""), ("tenant", b"a"), ("tenant", b"b")]))
    assert p(record(headers=[("trace", b""), ("tenant", b"b"), ("tenant", b"a")]))


def test_fields_text_of_strings_numbers_and_booleans() -> None:
    p = predicate(fields={"$.country": {"exact": ["FR"]}})
    assert p(record({"country": "FR"}))
    assert not p(record({"country": "DE"}))
    assert not p(record({"other": "FR"}))
    n = predicate(fields={"$.amount": {"exact": ["1.5", "7"]}, "$.vip": {"exact": ["true"]}})
    assert n(record({"amount": 1.50, "vip": True}))
    assert n(record({"amount": 7, "vip": True}))
    assert not n(record({"amount": 7, "vip": "yes"}))


def test_fields_never_match_null_objects_or_arrays() -> None:
    p = predicate(fields={"$.a": {"regex": [".*"]}})
    assert p(record({"a": ""}))
    for value in (None, {"x": 1}, [1]):
        assert not p(record({"a": value}))


def test_fields_any_wildcard_value_matches() -> None:
    p = predicate(fields={"$.items[*].sku": {"prefix": ["X-"]}})
    assert p(record({"items": [{"sku": "A"}, {"sku": "X-1"}]}))
    assert not p(record({"items": [{"sku": "A"}]}))
    assert not p(record({"items": []}))


def test_fields_on_values_that_are_not_json() -> None:
    p = predicate(fields={"$.a": {"regex": [".*"]}})
    assert not p(record(b"not json"))
    assert not p(record(None))


def test_tombstone() -> None:
    assert predicate(tombstone=True)(record(None))
    assert not predicate(tombstone=True)(record({"a": 1}))
    assert predicate(tombstone=False)(record({"a": 1}))
    assert not predicate(tombstone=False)(record(None))


def test_all_conditions_must_hold() -> None:
    p = predicate(key={"exact": ["k"]}, fields={"$.a": {"exact": ["1"]}})
    assert p(record({"a": 1}, key=b"k"))
    assert not p(record({"a": 1}, key=b"other"))
    assert not p(record({"a": 2}, key=b"k"))


def test_a_decoded_value_is_used_as_given() -> None:
    p = predicate(fields={"$.a": {"exact": ["x"]}})
    assert p(record(b"garbage"), {"a": "x"})
    assert p.reads_value and not predicate(key={"exact": ["k"]}).reads_value


def test_the_value_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import interceptors.predicate as module

    calls: list[bytes] = []
    real = module.orjson.loads

    def counting(data: bytes) -> Any:
        calls.append(data)
        return real(data)

    monkeypatch.setattr(module.orjson, "loads", counting)
    p = predicate(
        fields={"$.a": {"exact": ["1"]}, "$.b": {"exact": ["2"]}, "$.c[*]": {"exact": ["3"]}}
    )
    assert p(record({"a": 1, "b": 2, "c": [3]}))
    assert len(calls) == 1


def test_bad_path_is_a_config_error() -> None:
    spec = RecordPredicate.model_construct(fields={"no-dollar": None})
    with pytest.raises(InterceptorConfigError, match="invalid field path 'no-dollar'"):
        CompiledPredicate(spec)


def test_fields_match_big_integers_exactly() -> None:
    p = predicate(fields={"$.id": {"exact": ["123456789012345678901234567890"]}})
    assert p(record(b'{"id": 123456789012345678901234567890}'))
    assert not p(record(b'{"id": 123456789012345678901234567891}'))

"""The `schema` rule: Confluent framing, subjects, payload checks, the registry client.

The registry here is a loopback HTTP server answering the Confluent API's few calls from
a table, so each verdict and each failure can be set up exactly;
tests/integration/rules/test_schema_registry.py runs the rule against a real registry.
"""

from __future__ import annotations

import io
import json
import struct
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest

from filter_rules import CompiledRuleSet, MatchContext, load_rule_text
from filter_rules.record_actions import SchemaRegistryRef, SchemaSpec
from interceptors.builtin.schema import MEMO_S, NOT_FRAMED, SchemaInterceptor
from interceptors.contract import (
    BuildContext,
    InterceptedRecord,
    RecordRejected,
    ServiceUnavailable,
)
from interceptors.engine import RecordEngine
from interceptors.protobuf_schema import (
    PayloadError,
    ProtobufSchema,
    ProtobufSchemaError,
    read_message_indexes,
)
from interceptors.registry import Reference, RegisteredSchema
from interceptors.services import Services
from kafka_wire import ApiKey
from kafka_wire.records import BatchHeader, BatchView, Record, encode_batch
from tests.unit.registry_stub import Registry

ORDER_AVRO = {"type": "record", "name": "Order", "namespace": "shop",
              "fields": [{"name": "id", "type": "long"}, {"name": "sku", "type": "string"}]}
ORDER_JSON = {"title": "Order", "type": "object", "required": ["id"],
              "properties": {"id": {"type": "integer", "minimum": 0}}}
ORDER_PROTO = textwrap.dedent("""
    syntax = "proto3";
    package shop;
    import "money.proto";
    message Order { int64 id = 1; string sku = 2; common.Money price = 3;
                    message Line { string sku = 1; } }
    message Refund { int64 order_id = 1; }
""")
MONEY_PROTO = 'syntax = "proto3";\npackage common;\nmessage Money { int64 cents = 1; }\n'


def framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def avro_body(doc: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(ORDER_AVRO), doc)
    return out.getvalue()


# --- a registry answering from a table ------------------------------------------------


@pytest.fixture
def registry() -> Iterator[Registry]:
    r = Registry()
    r.add(1, ORDER_AVRO, None, ["orders-value", "shop.Order", "orders-shop.Order"])
    r.add(2, ORDER_JSON, "JSON", ["orders-value"])
    r.add(3, ORDER_AVRO, None, ["payments-value"])
    r.add(4, ORDER_PROTO, "PROTOBUF", ["orders-value", "shop.Refund"],
          [{"name": "money.proto", "subject": "money", "version": 1}])
    r.add_subject_version("money", 1, MONEY_PROTO, "PROTOBUF")
    yield r
    r.close()


def interceptor(stub: Registry, services: Services | None = None, **spec: Any
                ) -> SchemaInterceptor:
    full = {"registry": {"url": stub.url, **spec.pop("registry", {})}, **spec}
    return SchemaInterceptor(SchemaSpec.model_validate(full),
                             BuildContext(services=services or Services()))


def verdict(check: SchemaInterceptor, value: bytes | None, topic: str = "orders") -> str | None:
    try:
        check.intercept(InterceptedRecord(topic, 0, None, value))
    except RecordRejected as err:
        return err.reason
    return None


# --- framing and subjects ---------------------------------------------------------------


def test_requires_the_wire_format_and_a_registered_id(registry: Registry) -> None:
    check = interceptor(registry)
    assert verdict(check, framed(1, avro_body({"id": 1, "sku": "a"}))) is None
    assert verdict(check, b"{}") == NOT_FRAMED
    assert verdict(check, b"\x01\x00\x00\x00\x01xx") == NOT_FRAMED
    assert verdict(check, b"\x00\x00\x01") == NOT_FRAMED
    assert verdict(check, framed(99, b"")) == "schema id 99 is not registered"
    assert verdict(check, None) == "value is null"
    assert verdict(interceptor(registry, allow_null=True), None) is None


@pytest.mark.parametrize("strategy, topic, schema_id, expected", [
    ("topic_name", "orders", 1, None),
    ("topic_name", "payments", 1, "schema id 1 is not registered under subject payments-value "
                                  "(it is under orders-shop.Order, orders-value, shop.Order)"),
    ("topic_name", "payments", 3, None),
    ("record_name", "anything", 1, None),
    ("record_name", "orders", 3, "schema id 3 is not registered under subject shop.Order "
                                 "(it is under payments-value)"),
    ("topic_record_name", "orders", 1, None),
    ("topic_record_name", "payments", 1, "schema id 1 is not registered under subject "
                                         "payments-shop.Order (it is under orders-shop.Order, "
                                         "orders-value, shop.Order)"),
    ("record_name", "orders", 2, "schema id 2 is not registered under subject Order (it is "
                                 "under orders-value)"),
])
def test_subject_name_strategies(registry: Registry, strategy: str, topic: str, schema_id: int,
                                 expected: str | None) -> None:
    check = interceptor(registry, subject=strategy)
    assert verdict(check, framed(schema_id, b"{}"), topic) == expected


def test_key_subjects_and_require_subject_off(registry: Registry) -> None:
    keyed = interceptor(registry, target="key")
    record = InterceptedRecord("orders", 0, framed(1, b""), None)
    with pytest.raises(RecordRejected, match="under subject orders-key"):
        keyed.intercept(record)
    loose = interceptor(registry, require_subject=False)
    assert verdict(loose, framed(3, b"x"), "orders") is None


def test_a_subject_the_id_was_registered_under_later_is_found(
        registry: Registry) -> None:
    services = Services()
    value = framed(1, b"")
    assert "under subject payments-value" in (
        verdict(interceptor(registry, services), value, "payments") or "")
    # The same schema registered under another subject keeps its id: a rule that finds
    # its subject missing asks again (once per second per topic and id).
    registry.add(1, ORDER_AVRO, None, ["orders-value", "payments-value"])
    assert verdict(interceptor(registry, services), value, "payments") is None
    asked = [p for p, _h in registry.requests].count("/schemas/ids/1/versions")
    assert asked == 3  # the first answer, the first rule's recheck, the second rule's


def test_protobuf_subjects_follow_the_message_indexes(registry: Registry) -> None:
    check = interceptor(registry, subject="record_name")
    # [1]: the second message of the file, shop.Refund (registered under that subject)
    assert verdict(check, framed(4, b"\x02\x02" + b"\x08\x07")) is None
    # [0] (one 0 byte): shop.Order, not registered under its record name
    reason = verdict(check, framed(4, b"\x00"))
    assert reason is not None and "subject shop.Order" in reason


# --- payloads --------------------------------------------------------------------------


def test_payload_validation_avro_json_protobuf(registry: Registry) -> None:
    check = interceptor(registry, validate_payload=True)
    assert verdict(check, framed(1, avro_body({"id": 7, "sku": "x"}))) is None
    reason = verdict(check, framed(1, avro_body({"id": 7, "sku": "x"}) + b"\x00"))
    assert reason == "schema id 1: not valid Avro for shop.Order: 1 trailing bytes"
    assert verdict(check, framed(2, b'{"id": 3}')) is None
    assert verdict(check, framed(2, b'{"id": -3}')) == (
        "schema id 2: $.id: -3 is less than the minimum of 0")
    assert (verdict(check, framed(2, b"{nope")) or "").startswith("schema id 2: not valid JSON")
    # Protobuf: indexes [0] then shop.Order {id: 5, price: {cents: 9}}
    assert verdict(check, framed(4, b"\x00" + b"\x08\x05\x1a\x02\x08\x09")) is None
    reason = verdict(check, framed(4, b"\x00" + b"\x12\x05ab"))
    assert reason is not None and reason.startswith("schema id 4: not valid Protobuf")
    reason = verdict(check, framed(4, b"\x02\x0a"))  # indexes [5]: no such message
    assert reason == "schema id 4: message indexes [5] name no message of the schema"


def test_message_indexes() -> None:
    assert read_message_indexes(b"\x00rest", 0) == ((0,), 1)
    assert read_message_indexes(b"\x04\x02\x04", 0) == ((1, 2), 3)
    with pytest.raises(PayloadError):
        read_message_indexes(b"\x04\x02", 0)
    with pytest.raises(PayloadError):
        read_message_indexes(b"\x03", 0)  # negative count


def test_protobuf_schemas_compile_with_imports_and_fail_clearly() -> None:
    schema = ProtobufSchema(ORDER_PROTO, {"money.proto": MONEY_PROTO})
    assert schema.first_message == "shop.Order"
    assert schema.full_name((0, 0)) == "shop.Order.Line"
    assert schema.full_name((1,)) == "shop.Refund"
    with pytest.raises(ProtobufSchemaError, match="protoc could not compile"):
        ProtobufSchema('syntax = "proto3";\nmessage X { Unknown u = 1; }\n')
    with pytest.raises(ProtobufSchemaError, match="leaves"):
        ProtobufSchema(MONEY_PROTO, {"../evil.proto": MONEY_PROTO})
    timestamp = ProtobufSchema('syntax = "proto3";\nimport "google/protobuf/timestamp.proto";\n'
                               "message E { google.protobuf.Timestamp at = 1; }\n")
    assert timestamp.first_message == "E"


def test_schemas_with_references_and_broken_ones() -> None:
    customer = {"type": "record", "name": "Customer", "namespace": "shop",
                "fields": [{"name": "email", "type": "string"}]}
    order = {"type": "record", "name": "Order", "namespace": "shop",
             "fields": [{"name": "customer", "type": "shop.Customer"}]}
    ref = Reference("shop.Customer", "customer", 1)
    compiled = RegisteredSchema(5, "AVRO", json.dumps(order), [(ref, "AVRO", json.dumps(customer))])
    assert compiled.error is None and compiled.record_name == "shop.Order"
    body = io.BytesIO()
    fastavro.schemaless_writer(body, compiled._avro.schema, {"customer": {"email": "a"}})  # type: ignore[union-attr]
    assert compiled.check(framed(5, body.getvalue())) is None

    json_ref = Reference("customer.json", "customer-json", 1)
    with_ref = RegisteredSchema(6, "JSON", json.dumps(
        {"type": "object", "properties": {"c": {"$ref": "customer.json"}}}),
        [(json_ref, "JSON", json.dumps({"type": "object", "required": ["email"]}))])
    assert with_ref.check(framed(6, b'{"c": {"email": "x"}}')) is None
    assert "'email' is a required property" in (with_ref.check(framed(6, b'{"c": {}}')) or "")

    broken = RegisteredSchema(7, "AVRO", '{"type": "record"}', [])
    assert broken.error is not None and broken.error.startswith(
        "schema id 7 (AVRO) cannot be used: invalid Avro schema")
    assert broken.check(framed(7, b"")) == broken.error


# --- the client: caches, auth, failures -------------------------------------------------


def test_answers_are_cached_per_id(registry: Registry) -> None:
    check = interceptor(registry, validate_payload=True)
    value = framed(1, avro_body({"id": 1, "sku": "a"}))
    for _ in range(50):
        assert verdict(check, value) is None
    paths = [p for p, _h in registry.requests]
    assert paths == ["/schemas/ids/1", "/schemas/ids/1/versions"]
    # Another rule with the same registry settings shares the client and its caches.
    services = Services()
    first = interceptor(registry, services)
    second = interceptor(registry, services, subject="record_name")
    assert first._registry is second._registry


def test_auth_headers(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEG_TEST_REGISTRY_PASSWORD", "pa:ss")
    monkeypatch.setenv("KEG_TEST_REGISTRY_TOKEN", "tok-123")
    basic = interceptor(registry, registry={"auth": {"basic": {
        "username": "svc", "password": {"env": "KEG_TEST_REGISTRY_PASSWORD"}}}})
    verdict(basic, framed(1, b""))
    assert registry.requests[-1][1]["Authorization"] == "Basic c3ZjOnBhOnNz"
    bearer = interceptor(registry, registry={"auth": {"bearer": {
        "env": "KEG_TEST_REGISTRY_TOKEN"}}})
    verdict(bearer, framed(2, b""))
    assert registry.requests[-1][1]["Authorization"] == "Bearer tok-123"


def test_unreachable_registry_is_retriable_or_passes_as_declared(registry: Registry) -> None:
    down = {"url": "http://127.0.0.1:9", "timeout_ms": 2000}  # nothing listens on port 9
    closed = interceptor(registry, registry=down)
    with pytest.raises(ServiceUnavailable, match="unavailable") as err:
        closed.intercept(InterceptedRecord("orders", 0, None, framed(1, b"")))
    assert not err.value.fail_open
    opened = interceptor(registry, registry=down, on_unavailable="pass")
    verdicts = opened.check_batch("orders", [framed(1, b""), b"not framed"])
    assert [(p, e) for p, e, _r in verdicts] == [(0, "unchecked"), (1, "rejected")]


def test_a_stalled_registry_answers_after_its_timeout(registry: Registry) -> None:
    check = interceptor(registry, registry={"timeout_ms": 100})
    registry.stall.set()
    with pytest.raises(ServiceUnavailable, match="did not answer within 100 ms"):
        check.check_batch("orders", [framed(1, b"")])
    requests = len(registry.requests)
    with pytest.raises(ServiceUnavailable, match="retrying shortly"):
        check.check_batch("orders", [framed(2, b"")])  # down: at once, no new request
    assert len(registry.requests) == requests


def test_http_errors_are_failures_not_verdicts(registry: Registry) -> None:
    registry.routes["/schemas/ids/8"] = (500, {"message": "boom"})
    check = interceptor(registry)
    with pytest.raises(ServiceUnavailable, match="HTTP 500"):
        check.intercept(InterceptedRecord("orders", 0, None, framed(8, b"")))


# --- through the engine: whole batches, as process_batch reports them ------------------


def batch(values: list[bytes | None]) -> BatchView:
    records = [Record(i, 0, None, v, []) for i, v in enumerate(values)]
    return BatchView.from_bytes(encode_batch(BatchHeader(base_timestamp=1), records))


def engine_for(registry: Registry, extra: str = "") -> RecordEngine:
    rules = textwrap.dedent(f"""
    rules:
      - id: need-schema
        match: {{topics: {{prefix: [orders]}}, direction: both}}
        action: {{schema: {{registry: {{url: "{registry.url}"}}, validate_payload: true}}}}
    """) + textwrap.indent(textwrap.dedent(extra), "  ")
    return RecordEngine(CompiledRuleSet(load_rule_text(rules, "r.yaml")), BuildContext())


def test_batches_are_judged_at_once_and_reported_like_records(registry: Registry) -> None:
    engine = engine_for(registry)
    stages = engine.plan("produce", "orders", MatchContext(api_key=ApiKey.PRODUCE, api_version=9))
    assert [s.checks_batches for s in stages] == [True]
    good = framed(1, avro_body({"id": 1, "sku": "a"}))
    outcome = engine.process_batch(batch([good, b"junk", good, framed(99, b"")]), stages,
                                   topic="orders", partition=0, direction="produce",
                                   principal=None)
    assert [(r.index, r.reason) for r in outcome.rejections] == [
        (1, NOT_FRAMED), (3, "schema id 99 is not registered")]
    assert outcome.counts == {("need-schema", "rejected"): 2, ("need-schema", "unchanged"): 2}
    assert outcome.records is None and outcome.failure is None
    # The record-by-record path judges the same.
    single = [engine.evaluate(InterceptedRecord("orders", 0, None, v)).reason
              for v in (good, b"junk", framed(99, b""))]
    assert single == [None, NOT_FRAMED, "schema id 99 is not registered"]


def test_at_fetch_time_invalid_records_are_withheld(registry: Registry) -> None:
    engine = engine_for(registry)
    stages = engine.plan("consume", "orders", MatchContext(api_key=ApiKey.FETCH, api_version=12))
    good = framed(1, avro_body({"id": 1, "sku": "a"}))
    outcome = engine.process_batch(batch([good, b"junk"]), stages, topic="orders", partition=0,
                                   direction="consume", principal=None)
    assert outcome.rejections == [] and outcome.dropped == 1
    assert [r.value for r in outcome.records or []] == [good]


def test_registry_down_fails_the_batch_as_unavailable(registry: Registry) -> None:
    engine = engine_for(registry)
    registry.close()
    stages = engine.plan("produce", "orders", MatchContext(api_key=ApiKey.PRODUCE, api_version=9))
    outcome = engine.process_batch(batch([framed(1, b""), framed(1, b"")]), stages,
                                   topic="orders", partition=0, direction="produce",
                                   principal=None)
    assert outcome.failure is not None and outcome.failure.effect == "unavailable"
    assert outcome.counts == {("need-schema", "unavailable"): 2}


def test_mixed_plans_take_the_record_path(registry: Registry, tmp_path: Path) -> None:
    engine = engine_for(registry, """
      - id: tag
        match: {topics: {prefix: [orders]}}
        action: {headers: {set: {checked: "yes"}}}
    """)
    stages = engine.plan("produce", "orders", MatchContext(api_key=ApiKey.PRODUCE, api_version=9))
    good = framed(1, avro_body({"id": 1, "sku": "a"}))
    outcome = engine.process_batch(batch([good, b"junk"]), stages, topic="orders",
                                   partition=0, direction="produce", principal=None)
    assert [(r.index, r.rule_id) for r in outcome.rejections] == [(1, "need-schema")]


def test_the_rule_model(tmp_path: Path) -> None:
    from filter_rules import RuleSetInvalid, load_rule_data

    def load(spec: dict[str, Any]) -> None:
        load_rule_data({"rules": [{"id": "r", "match": {"topics": {"exact": ["t"]}},
                                   "action": {"schema": spec}}]}, "r.yaml")

    load({"registry": {"url": "https://r:8081"}})
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "registry"),
        ({"registry": {"url": "ftp://x"}}, "url"),
        ({"registry": {"url": "http://x", "auth": {}}}, "exactly one of basic, bearer"),
        ({"registry": {"url": "http://x"}, "subject": "TopicNameStrategy"}, "subject"),
        ({"registry": {"url": "http://x", "timeout_ms": 60000}}, "timeout_ms"),
    ]
    for spec, message in cases:
        with pytest.raises(RuleSetInvalid, match=message):
            load(spec)
    assert SchemaRegistryRef(url="http://x").timeout_ms == 1000


# --- what keg's Kafka filter may be told (vouched ids) -------------------------------------


def test_passing_ids_are_the_verdicts_that_hold_for_any_record_of_the_id(
        registry: Registry) -> None:
    check = interceptor(registry)
    now = time.monotonic()
    assert check.passing("orders", now) == {}
    assert verdict(check, framed(1, b"")) is None
    assert verdict(check, framed(3, b"")) is not None  # under payments-value only
    assert verdict(check, framed(99, b"")) == "schema id 99 is not registered"
    passing = check.passing("orders", time.monotonic())
    assert set(passing) == {1}
    assert 0 < passing[1].expiry - now <= MEMO_S + 0.5
    assert passing[1].json_schema is None, "ids alone"
    assert check.passing("orders", now + MEMO_S + 1) == {}, "a verdict expires"
    assert check.passing("payments", now) == {}
    # Payload validation: each record's payload decides. An Avro id is never passing as
    # such; a JSON Schema keg's filter checks itself is, with that schema.
    validating = interceptor(registry, validate_payload=True)
    assert verdict(validating, framed(1, avro_body({"id": 1, "sku": "a"}))) is None
    assert verdict(validating, framed(2, b'{"id": 1}')) is None
    (json_id,) = validating.passing("orders", time.monotonic()).items()
    assert json_id[0] == 2 and json_id[1].json_schema is not None
    assert orjson.loads(json_id[1].json_schema) == ORDER_JSON
    # Protobuf under record_name: the subject depends on each record's message indexes.
    by_record = interceptor(registry, subject="record_name")
    assert verdict(by_record, framed(4, b"\x02\x02")) is None
    assert 4 not in by_record.passing("orders", time.monotonic())

"""The `schema` rule through the real gateway, against a real schema registry.

Apicurio Registry (its Confluent-compatible API, HTTP and HTTPS) is started like the
broker; librdkafka producers with Confluent's own serializers (Avro, JSON Schema) register
their schemas there and write the Confluent wire format; kafka-python shows the reason
a refused record gets. Good records reach the broker; an unregistered id, a wrong
subject, an invalid payload are refused with INVALID_RECORD and the reason; a registry
that is down or stalled gets the rule's declared policy, audited, without stalling other
topics.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaProducer
from kafka.errors import KafkaError as KafkaPythonError

from filter_rules import load_rule_text
from interceptors.protobuf_schema import ProtobufSchema
from kafka_wire import ErrorCode
from keg.embedded.certs import DevCa
from keg.embedded.kafka import EmbeddedKafka, _free_ports
from keg.embedded.registry import EmbeddedRegistry
from keg.gateway import Gateway
from tests.integration.conftest import (
    DATA_PATH,
    create_topic,
    envoy_data_paths,
    gateway_settings,
    rule_dir,
)
from tests.integration.rules.records_io import AuditLog, consume, consume_records, produce, values

pytestmark = pytest.mark.integration

NATIVE = "native"  # the data path where keg's Kafka filter passes vouched ids itself


ORDER_AVRO = json.dumps({
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "sku", "type": "string"},
               {"name": "amount", "type": "double"}]})
ORDER_JSON = json.dumps({
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "required": ["id", "amount"],
    "properties": {"id": {"type": "integer"}, "amount": {"type": "number", "minimum": 0}}})
ORDER_PROTO = ('syntax = "proto3";\npackage shop;\n'
               "message Order { int64 id = 1; string sku = 2; }\n"
               "message Refund { int64 order_id = 1; }\n")


def rules(registry: EmbeddedRegistry, down_url: str) -> str:
    url = registry.ccompat_url
    return textwrap.dedent(f"""
    rules:
      - id: need-schema-id
        match: {{topics: {{prefix: [sr.id.]}}}}
        action: {{schema: {{registry: {{url: "{url}"}}}}}}
      - id: valid-payload
        match: {{topics: {{prefix: [sr.valid.]}}}}
        action: {{schema: {{registry: {{url: "{url}"}}, validate_payload: true}}}}
      - id: record-name
        match: {{topics: {{prefix: [sr.record.]}}}}
        action:
          schema: {{registry: {{url: "{url}"}}, subject: record_name, validate_payload: true}}
      - id: over-tls
        match: {{topics: {{prefix: [sr.tls.]}}}}
        action:
          schema:
            registry: {{url: "{registry.https_ccompat_url}", ca_file: registry.pem}}
            validate_payload: true
      - id: registry-down
        match: {{topics: {{prefix: [sr.down.]}}}}
        action: {{schema: {{registry: {{url: "{down_url}", timeout_ms: 300}}}}}}
      - id: registry-down-pass
        match: {{topics: {{prefix: [sr.pass.]}}}}
        action:
          schema: {{registry: {{url: "{down_url}", timeout_ms: 300}}, on_unavailable: pass}}
      - id: fetch-valid
        match: {{direction: response, topics: {{prefix: [sr.fetch.]}}}}
        action: {{schema: {{registry: {{url: "{url}"}}, validate_payload: true}}}}
      - id: fetch-down
        match: {{direction: response, topics: {{prefix: [sr.fetchdown.]}}}}
        action: {{schema: {{registry: {{url: "{down_url}", timeout_ms: 300}}}}}}
      - id: fetch-id
        match: {{direction: response, topics: {{prefix: [sr.fetchid.]}}}}
        action: {{schema: {{registry: {{url: "{url}"}}}}}}
    """)


class Env:
    def __init__(self, kafka: EmbeddedKafka, gateway: Gateway, registry: EmbeddedRegistry,
                 audit: Path) -> None:
        self.kafka, self.gateway, self.registry = kafka, gateway, registry
        self.audit = AuditLog(audit)
        self.client = SchemaRegistryClient({"url": registry.ccompat_url})

    def topic(self, prefix: str) -> str:
        return create_topic(self.kafka.bootstrap, name=f"{prefix}{uuid.uuid4().hex[:8]}")

    def register(self, subject: str, text: str, kind: str) -> int:
        return int(self.client.register_schema(subject, Schema(text, kind)))


@pytest.fixture(scope="module")
def env(kafka: EmbeddedKafka, schema_registry: EmbeddedRegistry, dev_ca: DevCa,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The suite's data path (DATA_PATH: `make test` runs ext-proc, then native, keg
    up's default, where keg's filter hands the Produce and Fetch frames to the workers)."""
    base = tmp_path_factory.mktemp("schema-registry")
    (down_port,) = _free_ports(1)  # nothing listens there
    text = rules(schema_registry, f"http://127.0.0.1:{down_port}")
    load_rule_text(text, "check.yaml")
    rules_dir = rule_dir(base / "rules", {"schema.yaml": text})
    shutil.copy(dev_ca.cert_file, rules_dir / "registry.pem")
    audit = base / "audit.jsonl"
    settings = gateway_settings(kafka, base / "envoy", rules_dir=rules_dir, audit_log=audit)
    with Gateway(settings) as gateway:
        assert envoy_data_paths(gateway) == [DATA_PATH]
        yield Env(kafka, gateway, schema_registry, audit)


# --- producing and reading -----------------------------------------------------------------


def serialized(env: Env, topic: str, kind: str, docs: list[dict[str, Any]]) -> list[bytes]:
    """The docs as Confluent's serializer writes them (registering the schema under
    `<topic>-value`, as applications do)."""
    serializer: Callable[..., bytes]
    if kind == "AVRO":
        serializer = AvroSerializer(env.client, ORDER_AVRO)
    else:
        serializer = JSONSerializer(ORDER_JSON, env.client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [serializer(doc, ctx) for doc in docs]


def stored(env: Env, topic: str) -> list[bytes | None]:
    """The values the broker holds for `topic` (read directly, not through the gateway)."""
    return values(consume(env.kafka.bootstrap, topic))


def framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


ORDERS = [{"id": i, "sku": f"sku-{i}", "amount": 10.5 + i} for i in range(5)]


# --- good records pass ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["AVRO", "JSON"])
def test_records_of_confluent_serializers_pass(env: Env, kind: str) -> None:
    for prefix in ("sr.id.", "sr.valid."):
        topic = env.topic(prefix)
        values = serialized(env, topic, kind, ORDERS)
        # Retries: the first record of an id may outwait the registry's first answer.
        assert produce(env.gateway.bootstrap, topic, list(values), retries=10) == [
            None] * len(values)
        assert stored(env, topic) == values


def test_record_name_strategy_and_protobuf(env: Env) -> None:
    topic = env.topic("sr.record.")
    avro_id = env.register("shop.Order", ORDER_AVRO, "AVRO")
    proto_id = env.register("shop.Refund", ORDER_PROTO, "PROTOBUF")
    avro = serialized(env, f"x-{topic}", "AVRO", ORDERS[:1])[0]
    refund = ProtobufSchema(ORDER_PROTO).message_class((1,))(order_id=7).SerializeToString()
    good = [framed(avro_id, avro[5:]), framed(proto_id, b"\x02\x02" + refund)]
    assert produce(env.gateway.bootstrap, topic, list(good), retries=10) == [None, None]
    # shop.Order (indexes [0]) is not registered under its own name
    assert produce(env.gateway.bootstrap, topic, [framed(proto_id, b"\x00")]) == [
        "INVALID_RECORD"]
    event = env.audit.wait_for(topic, "rejected")
    assert "not registered under subject shop.Order" in event["reason"]


def test_registry_over_tls(env: Env) -> None:
    topic = env.topic("sr.tls.")
    values = serialized(env, topic, "AVRO", ORDERS[:2])
    assert produce(env.gateway.bootstrap, topic, list(values), retries=10) == [None, None]


# --- bad records are refused with the reason ------------------------------------------------


def test_unregistered_id_wrong_subject_invalid_payload_are_refused(env: Env) -> None:
    topic = env.topic("sr.valid.")
    good = serialized(env, topic, "AVRO", ORDERS[:1])[0]
    other_id = env.register(f"other-{uuid.uuid4().hex[:6]}-value", ORDER_AVRO.replace(
        '"Order"', '"Other"'), "AVRO")
    cases = {
        "unregistered": (framed(987654, good[5:]), "schema id 987654 is not registered"),
        "wrong subject": (framed(other_id, good[5:]),
                          f"schema id {other_id} is not registered under subject "
                          f"{topic}-value"),
        "invalid payload": (good + b"\x01", "not valid Avro for shop.Order: 1 trailing bytes"),
        "not framed": (b'{"id": 1}', "not in Confluent wire format"),
    }
    assert produce(env.gateway.bootstrap, topic, [good], retries=10) == [None]  # known now
    for what, (value, reason) in cases.items():
        assert produce(env.gateway.bootstrap, topic, [value], retries=10) == [
            "INVALID_RECORD"], what
        # kafka-python shows the reason the gateway answered with
        producer = KafkaProducer(bootstrap_servers=env.gateway.bootstrap, retries=0)
        try:
            with pytest.raises(KafkaPythonError) as err:
                producer.send(topic, value).get(timeout=30)
        finally:
            producer.close()
        assert "keg rule valid-payload" in str(err.value) and reason in str(err.value), what
    events = [e for e in env.audit.events(topic) if e["outcome"] == "rejected"]
    assert {e["error_code"] for e in events} == {ErrorCode.INVALID_RECORD}
    assert all(any(reason in e["reason"] for e in events) for _v, reason in cases.values())
    assert stored(env, topic) == [good]


def test_a_registered_schema_whose_refs_recurse_refuses_its_records(env: Env) -> None:
    """A JSON Schema registered as `{"$ref": "#"}` (valid JSON Schema syntax, a `$ref`
    cycle that reads nothing): its records are invalid, with that reason. Before, each
    recursed to Python's limit and failed its batch as an interceptor error
    (UNKNOWN_SERVER_ERROR, a server fault, not the record's)."""
    topic = env.topic("sr.valid.")
    schema_id = env.register(f"{topic}-value", json.dumps(
        {"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#"}), "JSON")
    assert produce(env.gateway.bootstrap, topic, [framed(schema_id, b"{}")],
                   retries=10) == ["INVALID_RECORD"]
    event = env.audit.wait_for(topic, "rejected")
    assert "recurse without reading the document" in event["reason"], event
    assert stored(env, topic) == []


def test_at_fetch_time_records_without_a_valid_schema_are_withheld(env: Env) -> None:
    topic = env.topic("sr.fetch.")
    good = serialized(env, topic, "JSON", ORDERS[:2])
    bad = framed(int.from_bytes(good[0][1:5], "big"), b'{"id": 1, "amount": -1}')
    produce(env.kafka.bootstrap, topic, [good[0], bad, b"plain", good[1]])  # directly
    assert values(consume(env.gateway.bootstrap, topic)) == good


# --- ids the service vouched for pass in keg's filter (native path) -----------------------


def vouched_passes(env: Env) -> int:
    """Frames keg's Kafka filter let through on vouched schema ids (0 on ext_proc)."""
    return vouched_counter(env, "handoff_vouched")


def vouched_counter(env: Env, counter: str) -> int:
    """keg_kafka.<counter>, summed over Envoy's workers (0 on ext_proc)."""
    if env.gateway.envoy is None or DATA_PATH != NATIVE:
        return 0
    return env.gateway.envoy.module_counter(counter)


@pytest.mark.parametrize("prefix", ["sr.id.", "sr.valid."])
def test_vouched_ids_pass_and_every_other_record_still_meets_the_rule(
        env: Env, prefix: str) -> None:
    """One producer connection: the first record's id is judged by the rule (and, on
    the native path, vouched for, with its JSON Schema where the rule validates
    payloads); the next records of that id pass in keg's filter; an unregistered id, an
    unframed value and (validating) an invalid payload of the vouched id on the same
    connection are still refused."""
    topic = env.topic(prefix)
    good = serialized(env, topic, "JSON", ORDERS[:3])
    bad = [framed(987654, b"{}"), b'{"id": 1}']
    if prefix == "sr.valid.":
        schema_id = int.from_bytes(good[0][1:5], "big")
        bad += [framed(schema_id, b'{"id": 1, "amount": -1}'), framed(schema_id, b"{")]
    before = vouched_passes(env)
    errors: list[str | None] = []
    producer = Producer({"bootstrap.servers": env.gateway.bootstrap, "linger.ms": 0,
                         "retries": 10, "acks": "all"})
    for value in [*good, *bad]:
        producer.produce(topic, value, on_delivery=lambda err, _m: errors.append(
            None if err is None else err.name()))
        producer.flush(30)
    assert errors == [None] * len(good) + ["INVALID_RECORD"] * len(bad)
    assert stored(env, topic) == good
    if DATA_PATH == NATIVE:
        assert vouched_passes(env) - before >= 2, "the second and third records"


def test_pipelined_requests_wait_for_the_first_ones_vouch_and_bad_ones_are_still_refused(
        env: Env) -> None:
    """librdkafka pipelines 200 one-record Produce requests to a new topic at once
    (no idempotence: no in-flight limit), bad ids among the last. On the native path
    the requests behind the first hand-off wait for its answer and pass on the vouch it
    brings, rather than cross to the service too (it handed off 48-122 of 400 requests
    per 100,000 records in benchmarks/record_rules); an expired vouch (a second) costs
    one hand-off the same way. Every good record is stored in order, every bad one is
    refused, whichever way."""
    topic = env.topic("sr.id.")
    good = serialized(env, topic, "JSON", [{"id": i, "sku": "s", "amount": 1.0}
                                           for i in range(200)])
    bad = [framed(987654, b"{}"), b'{"id": 1}']
    before = vouched_counter(env, "handoff_requests")
    errors: list[tuple[bytes | None, str | None]] = []
    producer = Producer({"bootstrap.servers": env.gateway.bootstrap, "linger.ms": 0,
                         "batch.num.messages": 1, "retries": 0, "acks": "all"})
    started = time.monotonic()
    for value in [*good, *bad]:
        producer.produce(topic, value, on_delivery=lambda err, msg: errors.append(
            (msg.value(), None if err is None else err.name())))
        producer.poll(0)
    assert producer.flush(60) == 0
    elapsed = time.monotonic() - started
    assert sorted(errors) == sorted([(v, None) for v in good]
                                    + [(v, "INVALID_RECORD") for v in bad])
    assert stored(env, topic) == good
    if DATA_PATH == NATIVE:
        handed_off = vouched_counter(env, "handoff_requests") - before
        # The first; each bad one; one per expired vouch (a second each).
        assert handed_off <= 1 + len(bad) + math.ceil(elapsed), (handed_off, elapsed)


@pytest.mark.parametrize("prefix", ["sr.fetchid.", "sr.fetch."])
def test_vouched_ids_at_fetch_time_withhold_the_rest(env: Env, prefix: str) -> None:
    """One consumer: fetched records of a vouched id (valid payloads, where the rule
    validates them) pass in keg's filter; a record of another id, or (validating) of
    that id with an invalid payload, stored later still reaches the rule and is
    withheld."""
    topic = env.topic(prefix)
    good = serialized(env, topic, "JSON", ORDERS[:3])
    later = [framed(987654, b"{}")]
    if prefix == "sr.fetch.":
        later.append(framed(int.from_bytes(good[0][1:5], "big"), b'{"id": 1, "amount": -1}'))
    produce(env.kafka.bootstrap, topic, list(good[:2]))  # directly
    before = vouched_passes(env)
    consumer = Consumer({"bootstrap.servers": env.gateway.bootstrap, "group.id": uuid.uuid4().hex,
                         "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes | None] = []

    def read_until(count: int) -> None:
        for _ in range(300):
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            if len(got) >= count:
                return

    try:
        read_until(2)
        for value in later:
            produce(env.kafka.bootstrap, topic, [value])
        produce(env.kafka.bootstrap, topic, list(good[2:]))
        read_until(3)
    finally:
        consumer.close()
    assert got == good
    if DATA_PATH == NATIVE:
        # The consumer's long polls between the two productions: empty answers, or the
        # vouched records, none handed off.
        assert vouched_passes(env) - before >= 1


def test_fetch_answers_past_what_a_frame_may_validate_reach_the_consumer_whole(
        env: Env) -> None:
    """48 MiB of valid JSON orders, read by a consumer that fetches up to 16 MiB per
    partition: more than keg's filter validates per frame (8 MiB), so on the native path
    it cuts such answers at a batch boundary and the consumer fetches the rest. Every
    record arrives, once, in order."""
    topic = env.topic("sr.fetch.")
    docs = [{"id": i, "amount": i % 500, "note": "x" * 8000} for i in range(6000)]
    good = serialized(env, topic, "JSON", docs)
    producer = Producer({"bootstrap.servers": env.kafka.bootstrap, "linger.ms": 20,
                         "batch.size": 1 << 20})
    for value in good:
        producer.produce(topic, value)
    assert producer.flush(60) == 0
    del producer
    before = vouched_counter(env, "handoff_vouched_cut")
    got = consume_records({"bootstrap.servers": env.gateway.bootstrap,
                           "max.partition.fetch.bytes": 16 << 20, "fetch.max.bytes": 64 << 20,
                           "receive.message.max.bytes": 70 << 20}, topic, timeout=120)
    assert [value for _key, value, _headers in got] == good
    if DATA_PATH == NATIVE:
        assert vouched_counter(env, "handoff_vouched_cut") > before


# --- the registry down or stalled: the declared policy -----------------------------------


def test_registry_down_fails_closed_with_a_retriable_error(env: Env) -> None:
    topic = env.topic("sr.down.")
    assert produce(env.gateway.bootstrap, topic, [framed(1, b"x")]) == ["REQUEST_TIMED_OUT"]
    event = env.audit.wait_for(topic, "unavailable")
    assert event["error_code"] == ErrorCode.REQUEST_TIMED_OUT
    assert "schema registry" in event["reason"] and "unavailable" in event["reason"]
    assert stored(env, topic) == []


def test_registry_down_passes_records_when_the_rule_says_so(env: Env) -> None:
    topic = env.topic("sr.pass.")
    assert produce(env.gateway.bootstrap, topic, [framed(1, b"x"), b"junk"]) == [
        "INVALID_RECORD", "INVALID_RECORD"]  # the unframed record still fails its batch
    assert produce(env.gateway.bootstrap, topic, [framed(1, b"x")]) == [None]
    event = env.audit.wait_for(topic, "unchecked")
    assert "schema registry" in event["reason"]
    assert stored(env, topic) == [framed(1, b"x")]


def test_registry_down_at_fetch_time_withholds_records(env: Env) -> None:
    topic = env.topic("sr.fetchdown.")
    produce(env.kafka.bootstrap, topic, [framed(1, b"x")])
    got, event = env.audit.withheld_at_fetch(env.gateway.bootstrap, topic)
    assert got == []
    assert event["api_name"] == "Fetch" and event["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_stalled_registry_stalls_neither_other_topics_nor_known_ids(env: Env) -> None:
    known = env.topic("sr.id.")
    values = serialized(env, known, "AVRO", ORDERS[:1])
    assert produce(env.gateway.bootstrap, known, list(values), retries=10) == [None]  # cached
    plain, fresh = env.topic("plain."), env.topic("sr.id.")
    new_schema = ORDER_AVRO.replace('"Order"', f'"Fresh{uuid.uuid4().hex[:6]}"')
    fresh_id = env.register(f"{fresh}-value", new_schema, "AVRO")
    env.registry.pause()
    try:
        # A record naming an id the gateway has not seen: the registry's timeout, then
        # a retriable refusal.
        assert produce(env.gateway.bootstrap, fresh, [framed(fresh_id, b"")]) == [
            "REQUEST_TIMED_OUT"]
        # Meanwhile: a topic without the rule, and an id already known, are served.
        assert produce(env.gateway.bootstrap, plain, [b"hello"]) == [None]
        assert produce(env.gateway.bootstrap, known, list(values)) == [None]
        assert stored(env, plain) == [b"hello"]
    finally:
        env.registry.resume()
    event = env.audit.wait_for(fresh, "unavailable")
    assert "did not answer" in event["reason"] or "unavailable" in event["reason"]


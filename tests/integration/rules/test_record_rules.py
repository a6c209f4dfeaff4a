"""Record rules through the real gateway: real broker, real Envoy, three real clients.

Each built-in action is checked at produce time (the exact records the broker
stored, read directly from it) and at consume time (the exact records each client
received through the gateway), with librdkafka, kafka-python and Kafka's Java
console clients. Then the PII scenario end to end, batch validation with per-record
errors, idempotent and transactional producers through a dropping rule, and custom
interceptors that time out or fail.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition

from control_plane.topology import SaslPlain
from filter_rules import load_rule_text
from filter_rules.record_actions import HEADER_ENCRYPTION_KEY_ID
from interceptors.builtin import build_decrypt
from interceptors.contract import BuildContext, InterceptedRecord
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import (
    SASL_USERS,
    create_topic,
    dumped_codecs,
    gateway_settings,
    java_sasl,
    rule_dir,
    sasl_conf,
    share_console_consume,
)
from tests.integration.rules.records_io import Rec, consume_records

pytestmark = pytest.mark.integration

CARD_KEY = base64.b64encode(bytes(range(32))).decode()
KEY_ENV = "KEG_TEST_CARD_KEY"
INVALID_RECORD = 87

PLUGIN = '''
import time

class Sleepy:
    def configure(self, config):
        self.seconds = float(config["seconds"])

    def intercept(self, record):
        time.sleep(self.seconds)
        return record

class Boom:
    def configure(self, config):
        pass

    def intercept(self, record):
        raise ValueError("the interceptor exploded")
'''

# A record is valid when it has a non-negative amount (both directions validate it).
AMOUNT_SCHEMA = ("{type: object, required: [amount],"
                 " properties: {amount: {type: number, minimum: 0}}}")

RULES = f"""
rules:
  # --- produce time -----------------------------------------------------------------
  - id: p-mask
    match: {{topics: {{prefix: [p.mask.]}}}}
    action: {{mask: {{fields: [$.customer.email]}}}}
  - id: p-encrypt
    match: {{topics: {{prefix: [p.encrypt.]}}}}
    action:
      encrypt: {{fields: [$.card.number], key: {{id: cards-2026, secret: {{env: {KEY_ENV}}}}}}}
  - id: p-validate
    match: {{topics: {{prefix: [p.validate.]}}}}
    action: {{validate: {{json_schema: {AMOUNT_SCHEMA}}}}}
  - id: p-headers
    match: {{topics: {{prefix: [p.headers.]}}}}
    action: {{headers: {{set: {{x-gateway: keg}}, remove: [secret]}}}}
  - id: p-drop
    match: {{topics: {{prefix: [p.drop., idem.]}}}}
    action: {{drop: {{when: {{fields: {{$.kind: {{exact: [heartbeat]}}}}}}}}}}
  - id: p-copy
    match: {{topics: {{prefix: [p.copy.]}}}}
    action: {{copy: {{topic: copies.produced}}}}
  # --- consume time -----------------------------------------------------------------
  - id: c-copy
    match: {{direction: response, topics: {{prefix: [c.copy.]}}}}
    action: {{copy: {{topic: copies.consumed}}}}
  - id: c-mask
    match: {{direction: response, topics: {{prefix: [c.mask.]}}}}
    action: {{mask: {{fields: [$.customer.email]}}}}
  - id: c-decrypt
    match: {{direction: response, topics: {{prefix: [c.encrypt.]}}}}
    action:
      decrypt: {{fields: [$.card.number], keys: [{{id: cards-2026, secret: {{env: {KEY_ENV}}}}}]}}
  - id: c-validate
    match: {{direction: response, topics: {{prefix: [c.validate.]}}}}
    action: {{validate: {{json_schema: {AMOUNT_SCHEMA}}}}}
  - id: c-headers
    match: {{direction: response, topics: {{prefix: [c.headers.]}}}}
    action: {{headers: {{set: {{x-gateway: keg}}, remove: [secret]}}}}
  - id: c-drop
    match: {{direction: response, topics: {{prefix: [c.drop.]}}}}
    action: {{drop: {{when: {{fields: {{$.kind: {{exact: [heartbeat]}}}}}}}}}}
  # --- the PII scenario ---------------------------------------------------------------
  - id: pii-encrypt-cards
    match: {{topics: {{prefix: [pii.]}}}}
    action:
      encrypt: {{fields: [$.card.number], key: {{id: cards-2026, secret: {{env: {KEY_ENV}}}}}}}
  - id: pii-analytics-masked-emails
    match: {{direction: response, topics: {{prefix: [pii.]}}, principals: {{exact: [analytics]}}}}
    action: {{mask: {{fields: [$.customer.email]}}}}
  - id: pii-analytics-no-cards
    match: {{direction: response, topics: {{prefix: [pii.]}}, principals: {{exact: [analytics]}}}}
    action: {{mask: {{fields: [$.card.number], method: remove}}}}
  - id: pii-billing-cards
    match: {{direction: response, topics: {{prefix: [pii.]}}, principals: {{exact: [billing]}}}}
    action:
      decrypt: {{fields: [$.card.number], keys: [{{id: cards-2026, secret: {{env: {KEY_ENV}}}}}]}}
  # --- custom interceptors --------------------------------------------------------------
  - id: slow-interceptor
    match: {{topics: {{prefix: [slow.]}}}}
    action:
      interceptor: {{class: "plugin:Sleepy", config: {{seconds: 0.6}}, timeout_ms: 100, retries: 1}}
  - id: failing-interceptor
    match: {{topics: {{prefix: [boom.]}}}}
    action: {{interceptor: {{class: "plugin:Boom"}}}}
"""



def order(i: int, kind: str = "order", amount: int = 10) -> dict[str, Any]:
    return {"id": i, "kind": kind, "amount": amount,
            "customer": {"email": f"user{i}@example.com", "name": f"User {i}"},
            "card": {"number": f"4111-0000-0000-{i:04d}"}}


def orders() -> list[Rec]:
    """Three orders and a heartbeat, JSON compact as orjson writes it."""
    values = [order(1), order(2, "heartbeat"), order(3), order(4)]
    return [(f"k{v['id']}".encode(), orjson.dumps(v),
             [("src", b"test"), ("secret", b"s3")] if v["id"] == 3 else [("src", b"test")])
            for v in values]


class Env:
    def __init__(self, kafka: EmbeddedKafka, gateway: Gateway, audit: Path) -> None:
        self.kafka, self.gateway, self.audit = kafka, gateway, audit

    def conf(self, user: str = "alice", extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**sasl_conf(self.gateway.bootstrap, user), **(extra or {})}

    def topic(self, prefix: str) -> str:
        return create_topic(self.kafka.bootstrap, name=f"{prefix}{uuid.uuid4().hex[:8]}")

    def stored(self, topic: str) -> list[Rec]:
        """What the broker holds, read directly (not through the gateway)."""
        return consume_records({"bootstrap.servers": self.kafka.bootstrap}, topic)

    def put(self, topic: str, records: list[Rec]) -> None:
        """Write records directly to the broker (not through the gateway)."""
        produce_librdkafka({"bootstrap.servers": self.kafka.bootstrap}, topic, records)

    def audit_events(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        return [json.loads(line) for line in self.audit.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def env(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("record-rules")
    rules = rule_dir(base / "rules", {"rules.yaml": RULES, "plugin.py": PLUGIN})
    load_rule_text(RULES, "check.yaml")  # a broken test rule set fails here, not in Envoy
    audit = base / "audit.jsonl"
    previous = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = CARD_KEY  # read by the ext_proc child when it builds the rules
    settings = gateway_settings(kafka, base / "envoy", bootstrap_servers=kafka.sasl_bootstrap,
                                sasl=SaslPlain("keg", SASL_USERS["keg"]), rules_dir=rules,
                                audit_log=audit)
    for name in ("copies.produced", "copies.consumed"):
        create_topic(kafka.bootstrap, name=name)
    try:
        with Gateway(settings) as gateway:
            yield Env(kafka, gateway, audit)
    finally:
        if previous is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = previous


# --- three clients, one shape ----------------------------------------------------------


def produce_librdkafka(conf: dict[str, Any], topic: str, records: list[Rec]) -> list[int]:
    """Produce one batch; the error code per record (0: delivered)."""
    codes: list[int] = []
    producer = Producer({**conf, "linger.ms": 50, "retries": 0})
    for key, value, headers in records:
        producer.produce(topic, value, key, headers=list(headers),
                         on_delivery=lambda err, msg: codes.append(0 if err is None
                                                                   else err.code()))
    producer.flush(30)
    assert len(codes) == len(records)
    return codes


def kafka_python_conf(env: Env, user: str) -> dict[str, Any]:
    return {"bootstrap_servers": env.gateway.bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN", "sasl_plain_username": user,
            "sasl_plain_password": SASL_USERS[user]}


def produce_kafka_python(env: Env, user: str, topic: str, records: list[Rec]) -> None:
    producer = KafkaProducer(**kafka_python_conf(env, user), linger_ms=50, retries=0)
    try:
        futures = [producer.send(topic, value=v, key=k, headers=h) for k, v, h in records]
        producer.flush(30)
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close(5)


def consume_kafka_python(env: Env, user: str, topic: str) -> list[Rec]:
    consumer = KafkaConsumer(**kafka_python_conf(env, user), enable_auto_commit=False,
                             consumer_timeout_ms=1000)
    tp = KTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    out: list[Rec] = []
    deadline = time.monotonic() + 30
    try:
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for batch in consumer.poll(1000).values():
                out += [(m.key, m.value, list(m.headers)) for m in batch]
        assert consumer.position(tp) >= end, f"kafka-python did not reach the end of {topic}"
    finally:
        consumer.close()
    return out


def produce_java(env: Env, user: str, topic: str, records: list[Rec]) -> None:
    lines = []
    for key, value, headers in records:
        assert key is not None and value is not None and headers
        head = ",".join(f"{k}:{(v or b'').decode()}" for k, v in headers)
        lines.append(f"{head}\t{key.decode()}\t{value.decode()}")
    args = ["--bootstrap-server", env.gateway.bootstrap, "--topic", topic,
            "--property", "parse.key=true", "--property", "parse.headers=true"]
    for prop in java_sasl(user):
        args += ["--producer-property", prop]
    done = run_java_tool("console-producer", *args, input="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr[-2000:]


def consume_java(env: Env, user: str, topic: str, expected: int) -> list[Rec]:
    args = ["--bootstrap-server", env.gateway.bootstrap, "--topic", topic, "--from-beginning",
            "--max-messages", str(expected), "--timeout-ms", "15000", *PRINT_ALL]
    for prop in java_sasl(user):
        args += ["--consumer-property", prop]
    return _console_records(run_java_tool("console-consumer", *args))


def consume_java_share(env: Env, user: str, topic: str, expected: int) -> list[Rec]:
    """A share group's consumer (KIP-932: ShareFetch, not Fetch) from the topic's start."""
    done = share_console_consume(env.kafka, env.gateway.bootstrap, topic, expected, *PRINT_ALL,
                                 user=user)
    return sorted(_console_records(done), key=lambda r: r[0] or b"")


PRINT_ALL = ("--property", "print.key=true", "--property", "print.headers=true")


def _console_records(done: subprocess.CompletedProcess[str]) -> list[Rec]:
    out: list[Rec] = []
    for line in done.stdout.splitlines():
        head, key, value = line.split("\t", 2)
        headers: list[tuple[str, bytes | None]] = []
        if head != "NO_HEADERS":
            for pair in head.split(","):
                name, _, text = pair.partition(":")
                headers.append((name, text.encode()))
        out.append((key.encode(), value.encode(), headers))
    return out


# --- the actions, as the test expects them ------------------------------------------------


def expected_mask(records: list[Rec]) -> list[Rec]:
    out: list[Rec] = []
    for key, value, headers in records:
        doc = orjson.loads(value or b"{}")
        doc["customer"]["email"] = "****"
        out.append((key, orjson.dumps(doc), headers))
    return out


def expected_headers(records: list[Rec]) -> list[Rec]:
    return [(k, v, [*(h for h in hs if h[0] != "secret"), ("x-gateway", b"keg")])
            for k, v, hs in records]


def expected_drop(records: list[Rec]) -> list[Rec]:
    return [r for r in records if orjson.loads(r[1] or b"{}")["kind"] != "heartbeat"]


def decrypt_cards(records: list[Rec]) -> list[Rec]:
    spec = load_rule_text("""
rules:
  - id: d
    action: {decrypt: {fields: [$.card.number], keys: [{id: cards-2026, secret: {env: X}}]}}
""", "d.yaml").rules[0].action.decrypt
    decrypt = build_decrypt(spec, BuildContext(environ={"X": CARD_KEY}))
    out = []
    for key, value, headers in records:
        rec = decrypt.intercept(InterceptedRecord("t", 0, key, value, list(headers)))
        assert rec is not None
        out.append((rec.key, rec.value, rec.headers))
    return out


def is_encrypted_card(value: bytes | None) -> bool:
    doc = orjson.loads(value or b"{}")
    return str(doc["card"]["number"]).startswith("keg:v1:") and b"4111" not in (value or b"")


Producer_ = Callable[[Env, str, list[Rec]], None]
PRODUCERS: dict[str, Producer_] = {
    "librdkafka": lambda env, topic, recs: (
        None if produce_librdkafka(env.conf(), topic, recs) == [0] * len(recs)
        else pytest.fail("librdkafka produce failed")),
    "kafka-python": lambda env, topic, recs: produce_kafka_python(env, "alice", topic, recs),
    "java": lambda env, topic, recs: produce_java(env, "alice", topic, recs),
}
CONSUMERS: dict[str, Callable[[Env, str, int], list[Rec]]] = {
    "librdkafka": lambda env, topic, n: consume_records(env.conf(), topic),
    "kafka-python": lambda env, topic, n: consume_kafka_python(env, "alice", topic),
    "java": lambda env, topic, n: consume_java(env, "alice", topic, n),
    # Share groups read records with ShareFetch: consume-time rules apply there too
    # (they did not: a share consumer read every record unmasked, undecrypted, undropped).
    "java-share": lambda env, topic, n: consume_java_share(env, "alice", topic, n),
}
EXPECT: dict[str, Callable[[list[Rec]], list[Rec]]] = {
    "mask": expected_mask,
    "validate": lambda records: records,  # every record valid: stored as produced
    "headers": expected_headers,
    "drop": expected_drop,
}


@pytest.mark.parametrize("client", list(PRODUCERS))
@pytest.mark.parametrize("action", [*EXPECT, "encrypt"])
def test_each_action_at_produce_time(env: Env, action: str, client: str) -> None:
    topic = env.topic(f"p.{action}.")
    records = orders()
    PRODUCERS[client](env, topic, records)
    stored = env.stored(topic)
    if action == "encrypt":
        assert all(is_encrypted_card(v) for _, v, _ in stored)
        assert all((HEADER_ENCRYPTION_KEY_ID, b"cards-2026") in h for _, _, h in stored)
        # Decrypted, they are what was produced (plus the key id header).
        assert [(k, v) for k, v, _ in decrypt_cards(stored)] == [(k, v) for k, v, _ in records]
        return
    assert stored == EXPECT[action](records)


@pytest.mark.parametrize("client", list(CONSUMERS))
@pytest.mark.parametrize("action", [*EXPECT, "encrypt"])
def test_each_action_at_consume_time(env: Env, action: str, client: str) -> None:
    topic = env.topic(f"c.{action}.")
    records = orders()
    if action == "validate":
        records.insert(2, (b"bad", orjson.dumps(order(9, amount=-1)), [("src", b"test")]))
    stored = records
    if action == "encrypt":  # stored encrypted (by the produce-time rule's twin)
        topic_in = env.topic("p.encrypt.")
        PRODUCERS["librdkafka"](env, topic_in, records)
        stored = env.stored(topic_in)
    env.put(topic, stored)
    assert env.stored(topic) == stored  # the broker holds them untouched
    want = (records if action == "encrypt" else records[:2] + records[3:]
            if action == "validate" else EXPECT[action](records))
    # As many as it should get: the Java consumers stop there, not at their timeout. A
    # record let through would take the place of one it should get.
    got = CONSUMERS[client](env, topic, len(want))
    if action == "encrypt":
        # Decrypted for this consumer; the key id header may stay (it says how it was kept).
        assert [(k, v, [x for x in h if x[0] != HEADER_ENCRYPTION_KEY_ID]) for k, v, h in got] \
            == records
        return
    assert got == want


def test_pii_scenario_end_to_end(env: Env) -> None:
    topic = env.topic("pii.orders.")
    records = [r for r in orders() if orjson.loads(r[1] or b"{}")["kind"] == "order"]
    assert produce_librdkafka(env.conf("alice"), topic, records) == [0] * len(records)

    stored = env.stored(topic)
    assert all(is_encrypted_card(v) for _, v, _ in stored)
    assert [orjson.loads(v or b"")["customer"]["email"] for _, v, _ in stored] == [
        orjson.loads(v or b"")["customer"]["email"] for _, v, _ in records]  # emails in clear

    analytics = consume_records(env.conf("analytics"), topic)
    for (_, got, _), (_, sent, _) in zip(analytics, records, strict=True):
        doc, original = orjson.loads(got or b""), orjson.loads(sent or b"")
        assert doc["customer"] == {**original["customer"], "email": "****"}
        assert doc["card"] == {}  # no card numbers, not even encrypted ones
        assert doc["amount"] == original["amount"]

    billing = consume_records(env.conf("billing"), topic)
    assert [(k, v) for k, v, _ in billing] == [(k, v) for k, v, _ in records]


def test_one_invalid_record_refuses_the_batch_with_record_errors(env: Env) -> None:
    topic = env.topic("p.validate.")
    records = orders()
    records[1] = (b"bad", orjson.dumps(order(2, amount=-3)), [("src", b"test")])

    codes = produce_librdkafka(env.conf(), topic, records)
    assert codes == [INVALID_RECORD] * len(records)  # one batch: refused whole
    assert env.stored(topic) == []

    # Kafka's Java producer shows the record error and the rule that refused it.
    args = ["--bootstrap-server", env.gateway.bootstrap, "--topic", topic,
            "--property", "parse.key=true", "--producer-property", "linger.ms=1000"]
    for prop in java_sasl("alice"):
        args += ["--producer-property", prop]
    lines = "\n".join(f"{(k or b'').decode()}\t{(v or b'').decode()}" for k, v, _ in records)
    done = run_java_tool("console-producer", *args, input=lines + "\n")
    assert "keg rule p-validate" in done.stderr and "minimum" in done.stderr, done.stderr[-3000:]
    assert env.stored(topic) == []
    refusals = [e for e in env.audit_events() if e.get("rule_id") == "p-validate"
                and e.get("outcome") == "rejected" and e.get("topic") == topic]
    assert refusals and refusals[0]["reason"].startswith("$.amount")
    assert {e["error_code"] for e in refusals} == {INVALID_RECORD}  # what the client got


def test_idempotent_and_transactional_producers_through_a_dropping_rule(env: Env) -> None:
    topic = env.topic("idem.")
    sent: list[Rec] = [
        (f"k{i}".encode(), orjson.dumps(order(i, "heartbeat" if i % 3 == 0 else "order")), [])
        for i in range(1, 601)]
    producer = Producer(env.conf(extra={"enable.idempotence": True, "linger.ms": 5,
                                        "batch.num.messages": 7}))
    errors: list[KafkaError] = []
    for key, value, _ in sent:
        producer.produce(topic, value, key,
                         on_delivery=lambda err, msg: None if err is None else errors.append(err))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []  # no OUT_OF_ORDER_SEQUENCE_NUMBER, no other error
    kept = [(k, v) for k, v, _ in sent if orjson.loads(v or b"")["kind"] != "heartbeat"]
    assert [(k, v) for k, v, _ in env.stored(topic)] == kept

    txn_topic = env.topic("idem.txn.")
    producer = Producer(env.conf(extra={"transactional.id": f"tx-{uuid.uuid4().hex[:6]}",
                                        "linger.ms": 5, "batch.num.messages": 4}))
    producer.init_transactions(30)
    committed: list[tuple[bytes, bytes]] = []
    for round_, commit in enumerate((True, False, True)):
        producer.begin_transaction()
        for i in range(30):
            n = round_ * 100 + i
            value = orjson.dumps(order(n, "heartbeat" if i % 4 == 0 else "order"))
            producer.produce(txn_topic, value, f"t{n}".encode())
            if commit and i % 4:
                committed.append((f"t{n}".encode(), value))
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    read = consume_records({**env.conf(), "isolation.level": "read_committed"}, txn_topic)
    assert [(k, v) for k, v, _ in read] == committed


def test_custom_interceptor_budget_and_failure(env: Env) -> None:
    # A producer on another topic keeps delivering while the slow interceptor sleeps.
    other = env.topic("plain.")
    stop = threading.Event()
    delivered: list[int] = []

    def background() -> None:
        producer = Producer(env.conf(extra={"linger.ms": 1}))
        while not stop.is_set():
            producer.produce(other, b"x", on_delivery=lambda err, msg: delivered.append(
                0 if err is None else err.code()))
            producer.poll(0.02)
        producer.flush(30)

    worker = threading.Thread(target=background)
    worker.start()
    try:
        slow = env.topic("slow.")
        producer = KafkaProducer(**kafka_python_conf(env, "alice"), retries=0)
        with pytest.raises(Exception) as timed_out:
            producer.send(slow, b"v").get(timeout=30)
        assert getattr(timed_out.value, "errno", None) == 7  # REQUEST_TIMED_OUT

        boom = env.topic("boom.")
        with pytest.raises(Exception) as failed:
            producer.send(boom, b"v").get(timeout=30)
        assert getattr(failed.value, "errno", None) == -1  # UNKNOWN_SERVER_ERROR
        producer.send(other, b"after").get(timeout=30)  # the connection still works
        producer.close(5)
    finally:
        stop.set()
        worker.join(60)
    assert delivered and set(delivered) == {0}
    assert env.stored(slow) == [] and env.stored(boom) == []
    outcomes = {(e.get("rule_id"), e.get("outcome")) for e in env.audit_events()}
    assert ("slow-interceptor", "timeout") in outcomes
    assert ("failing-interceptor", "failed") in outcomes


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_changed_batches_keep_their_codec(env: Env, codec: str) -> None:
    topic = env.topic("p.mask.")
    records = orders()
    assert produce_librdkafka(env.conf(extra={"compression.type": codec}), topic, records) \
        == [0] * len(records)
    assert env.stored(topic) == expected_mask(records)
    assert dumped_codecs(env.kafka, topic) == {codec}


def copies(env: Env, topic: str, run: bytes, expected: int) -> list[Rec]:
    """The copies of this run in `topic` (copy rules send asynchronously: wait for them)."""
    deadline = time.monotonic() + 30
    while True:
        found = [r for r in env.stored(topic) if ("run", run) in r[2]]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


@pytest.mark.parametrize("client", list(PRODUCERS))
def test_copy_at_produce_time(env: Env, client: str) -> None:
    topic, run = env.topic("p.copy."), uuid.uuid4().hex.encode()
    records = [(k, v, [*h, ("run", run)]) for k, v, h in orders()]
    PRODUCERS[client](env, topic, records)
    assert env.stored(topic) == records  # the records themselves are untouched
    assert copies(env, "copies.produced", run, len(records)) == records


@pytest.mark.parametrize("client", list(CONSUMERS))
def test_copy_at_consume_time(env: Env, client: str) -> None:
    topic, run = env.topic("c.copy."), uuid.uuid4().hex.encode()
    records = [(k, v, [*h, ("run", run)]) for k, v, h in orders()]
    env.put(topic, records)
    assert CONSUMERS[client](env, topic, len(records)) == records
    assert copies(env, "copies.consumed", run, len(records)) == records


def test_a_java_consumer_reads_a_backlog_larger_than_one_frames_record_budget(
        env: Env) -> None:
    """A Java consumer reading a 400,000-record backlog through a fetch-time mask: the
    answers past a frame's record budget (500,000 records, 1.5 s) were withheld with
    CORRUPT_MESSAGE, and `poll()` threw "Encountered corrupt message" (the console
    consumer exits on it) at every such fetch (a new user's report). Such an answer now
    goes out cut short after the batches judged; every record arrives, masked."""
    topic = create_topic(env.kafka.bootstrap, 6, name=f"c.mask.{uuid.uuid4().hex[:8]}")
    count = 600_000
    producer = Producer({"bootstrap.servers": env.kafka.bootstrap, "linger.ms": 100,
                         "compression.type": "lz4", "batch.num.messages": 50_000,
                         "batch.size": 4_000_000, "queue.buffering.max.messages": count})
    for i in range(count):
        producer.produce(topic, b'{"customer":{"email":"e%d"}}' % i, partition=i % 6)
    assert producer.flush(120) == 0
    args = ["--bootstrap-server", env.gateway.bootstrap, "--topic", topic, "--from-beginning",
            "--max-messages", str(count), "--timeout-ms", "60000"]
    for prop in java_sasl("alice"):
        args += ["--consumer-property", prop]
    done = run_java_tool("console-consumer", *args)
    values = done.stdout.splitlines()
    assert len(values) == count, done.stderr[-2000:]
    assert set(values) == {'{"customer":{"email":"****"}}'}


def test_a_tailing_consumer_of_batches_a_rule_empties_gets_no_errors_and_commits_the_end(
        env: Env) -> None:
    """A fetch-time drop that empties whole batches (a producer of one record per batch,
    heartbeats dropped): librdkafka took each answer of only empty batches for a message
    too large to fetch, doubled its fetch size up to 1 GiB, then gave the application
    MSG_SIZE_TOO_LARGE at every such answer (a new user counted 489 in 60 s); and with the
    partition's last record dropped it committed one short of the end for ever (lag 1).
    Such a batch now goes out as a control batch without a producer: every client steps
    over it, librdkafka as progress."""
    topic = env.topic("c.drop.")
    heartbeat: Rec = (b"hb", orjson.dumps(order(0, "heartbeat")), [])
    first: Rec = (b"k1", orjson.dumps(order(1)), [])
    second: Rec = (b"k2", orjson.dumps(order(2)), [])
    consumer = Consumer({**env.conf("alice"), "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    got: list[Rec] = []
    errors: list[str] = []

    def poll(seconds: float, until: int = 0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (not until or len(got) < until):
            for msg in consumer.consume(10, 0.1):
                if msg.error():
                    errors.append(str(msg.error()))
                else:
                    got.append((msg.key(), msg.value(), []))
                    assert not msg.headers()

    try:
        consumer.assign([TopicPartition(topic, 0)])
        env.put(topic, [first])
        poll(30, until=1)  # tailing the partition from here
        for _ in range(16):  # more answers of only dropped records than doublings to 1 GiB
            env.put(topic, [heartbeat])
            poll(0.2)
        env.put(topic, [second])
        env.put(topic, [heartbeat])  # the partition's last record is dropped
        poll(30, until=2)
        poll(2)
        consumer.commit(asynchronous=False)
        (committed,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        consumer.close()
    assert errors == [] and got == [first, second]
    assert committed.offset == 19, "committed at the end of the partition (19 records)"
    # The other clients step over the same batches.
    reader = KafkaConsumer(**kafka_python_conf(env, "alice"), isolation_level="read_committed")
    try:
        tp = KTopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek_to_beginning(tp)
        read: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while reader.position(tp) < 19 and time.monotonic() < deadline:
            read += [m.value for batch in reader.poll(500).values() for m in batch]
        assert reader.position(tp) == 19 and read == [first[1], second[1]]
    finally:
        reader.close()
    assert [v for _, v, _ in consume_java(env, "alice", topic, 2)] == [first[1], second[1]]


def test_transactions_whose_batches_a_fetch_rule_empties_read_as_committed(env: Env) -> None:
    """Batches of committed and aborted transactions that a fetch-time drop empties go
    out as control batches without a producer: read_committed consumers (librdkafka,
    kafka-python, Java) still skip exactly the aborted transactions' records, and
    read_uncommitted ones read both, the heartbeats dropped."""
    topic = env.topic("c.drop.txn.")
    producer = Producer({"bootstrap.servers": env.kafka.bootstrap, "linger.ms": 0,
                         "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    # Each transaction one batch: heartbeats alone are emptied whole.
    plan = [(["heartbeat"], True), (["order"], False), (["heartbeat"], False),
            (["order", "heartbeat"], True), (["heartbeat"], True), (["order"], True)]
    committed: list[bytes] = []
    uncommitted: list[bytes] = []
    for n, (kinds, commit) in enumerate(plan):
        producer.begin_transaction()
        for i, kind in enumerate(kinds):
            value = orjson.dumps(order(n * 10 + i, kind))
            producer.produce(topic, value, b"k")
            if kind != "heartbeat":
                uncommitted.append(value)
                committed += [value] if commit else []
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    assert len(committed) == 2 and len(uncommitted) == 3

    def librdkafka(isolation: str) -> list[bytes | None]:
        return [v for _, v, _ in consume_records({**env.conf(), "isolation.level": isolation},
                                                 topic)]

    assert librdkafka("read_committed") == committed
    assert librdkafka("read_uncommitted") == uncommitted
    reader = KafkaConsumer(**kafka_python_conf(env, "alice"), isolation_level="read_committed")
    try:
        tp = KTopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek_to_beginning(tp)
        end = reader.end_offsets([tp])[tp]
        read: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while reader.position(tp) < end and time.monotonic() < deadline:
            read += [m.value for batch in reader.poll(500).values() for m in batch]
        assert reader.position(tp) == end and read == committed
    finally:
        reader.close()
    args = ["--bootstrap-server", env.gateway.bootstrap, "--topic", topic, "--from-beginning",
            "--max-messages", "3", "--timeout-ms", "8000",
            "--consumer-property", "isolation.level=read_committed"]
    for prop in java_sasl("alice"):
        args += ["--consumer-property", prop]
    java = run_java_tool("console-consumer", *args)
    assert [line.encode() for line in java.stdout.splitlines()] == committed, java.stderr[-2000:]

"""Request-level rules through the real gateway, with SASL-authenticated real clients.

A broker with a SASL_PLAINTEXT listener (PLAIN and SCRAM) sits behind the gateway;
the control plane logs in to discover it. Rules are read from a directory the test
rewrites while clients stay connected. Every test runs on both data paths (`env`).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource

import kafka_wire
from control_plane.service import free_port
from control_plane.topology import SaslPlain
from kafka_wire import ApiKey
from kafka_wire.records import iter_batches
from keg.embedded.kafka import EmbeddedKafka, java_tool_command, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import (
    SASL_USERS,
    create_topic,
    deliver,
    dumped_codecs,
    gateway_settings,
    java_sasl,
    rule_dir,
    scrape_metrics,
    share_console_consume,
)
from tests.integration.raw_kafka import RawConnection, read_frame
from tests.integration.relay import RecordingRelay, gateway_listener

# Its gateways run both data paths themselves (the env fixture): once per suite pass is enough.
pytestmark = [pytest.mark.integration, pytest.mark.one_data_path]

USERS = SASL_USERS
TOPIC_AUTHORIZATION_FAILED = 29

RULES = """
rules:
  - id: payments-only-alice
    description: only alice may write or read payments topics
    match:
      apis: [Produce, Fetch]
      topics: {prefix: [payments.]}
      not: {principals: {exact: [alice]}}
    action: {deny: {}}
  - id: watch-topic-creation
    match: {apis: [CreateTopics]}
    action: {observe: {}}
  - id: safe-producers
    match: {apis: [Produce], topics: {prefix: [safe.]}}
    action: {safeguard: {require_idempotence: true, compression: {forbid: [none]}}}
  - id: slow-down-carol
    match: {apis: [Produce], principals: {exact: [carol]}}
    action: {rate: {per: principal, bytes_per_second: 50000, burst_seconds: 1}}
  - id: hold-pipelining-producers
    match: {apis: [Produce], topics: {prefix: [held.]}}
    action: {rate: {per: topic, bytes_per_second: 100000, burst_seconds: 1}}
  - id: pace-requests
    match: {apis: [Produce], topics: {prefix: [paced.]}}
    action: {rate: {per: topic, requests_per_second: 2, burst_seconds: 1}}
  - id: no-topic-deletion
    match: {principals: {exact: [bob]}}
    action: {deny_apis: [DeleteTopics]}
  - id: try-freezing-audit-topics
    mode: dry-run
    match: {apis: [Produce], topics: {prefix: [audit.]}}
    action: {deny: {}}
  - id: bulk-fetch-cap
    order: -1
    match: {apis: [Fetch], topics: {prefix: [bulk.]}}
    action: {safeguard: {max_fetch_bytes: 1048576}}
  - id: try-tiny-fetches
    mode: dry-run
    match: {apis: [Fetch], topics: {prefix: [bulk.]}}
    action: {safeguard: {max_fetch_bytes: 100}}
  - id: frozen-topics
    match: {apis: [Produce], topics: {prefix: [frozen.]}}
    action: {deny: {error: POLICY_VIOLATION, message: "frozen topics take no writes"}}
  - id: typed-need-schema-id
    match: {apis: [Produce], topics: {prefix: [typed.]}}
    action: {safeguard: {require_headers: [schema-id]}}
  - id: quiet-freeze
    match: {apis: [Produce], topics: {prefix: [quiet.]}}
    action: {deny: {}}
    audit: {enabled: false}
  - id: hidden-topics
    description: every API, so Metadata too (a topic rule judging Metadata requests by id)
    match: {topics: {prefix: [hidden.]}}
    action: {deny: {}}
  # As filter_rules/examples/safeguards.yaml writes it.
  - id: lz4-producer-hygiene
    match: {apis: [Produce], topics: {prefix: [lz4.]}}
    action: {safeguard: {compression: {require: [lz4, zstd]}, max_batch_bytes: 1048576}}
"""


class Env:
    def __init__(self, kafka: EmbeddedKafka, gateway: Gateway, rules: Path, audit: Path,
                 metrics_port: int) -> None:
        self.kafka, self.gateway, self.rules = kafka, gateway, rules
        self.audit, self.metrics_port = audit, metrics_port

    def client(self, user: str, mechanism: str = "PLAIN",
               conf: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"bootstrap.servers": self.gateway.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": mechanism, "sasl.username": user,
                "sasl.password": USERS[user], **(conf or {})}

    def audit_events(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        return [json.loads(line) for line in self.audit.read_text().splitlines() if line]

    def metrics(self) -> str:
        return scrape_metrics(self.gateway)

    def wait_for_audit(self, rule_id: str, count: int = 1) -> list[dict[str, Any]]:
        """The rule's audit events, once there are `count` (the gateway writes them as it
        processes requests, which may be after the client moved on)."""
        deadline = time.monotonic() + 20
        while True:
            events = [e for e in self.audit_events() if e["rule_id"] == rule_id]
            if len(events) >= count or time.monotonic() > deadline:
                return events
            time.sleep(0.1)

    def broker_count(self, topic: str) -> int:
        """Records the broker stored (read directly, as the admin user)."""
        consumer = Consumer({"bootstrap.servers": self.kafka.sasl_bootstrap,
                             "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                             "sasl.username": "keg", "sasl.password": USERS["keg"],
                             "group.id": f"count-{uuid.uuid4().hex[:6]}"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        finally:
            consumer.close()
        return int(high - low)


@pytest.fixture(scope="module", params=["ext-proc", "native"])
def env(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Env]:
    """Both data paths: the ext_proc service sees every byte, or keg's native filter
    hands it only the frames these rules need (with the identity it read)."""
    base = tmp_path_factory.mktemp("rules-env")
    rules = rule_dir(base / "rules", {"rules.yaml": RULES})
    audit = base / "audit.jsonl"
    metrics_port = free_port()
    settings = gateway_settings(kafka, base / "envoy", bootstrap_servers=kafka.sasl_bootstrap,
                                sasl=SaslPlain("keg", USERS["keg"]), rules_dir=rules,
                                audit_log=audit, metrics_port=metrics_port,
                                data_path=request.param)
    with Gateway(settings) as gateway:
        yield Env(kafka, gateway, rules, audit, metrics_port)


def produce(conf: dict[str, Any], records: list[tuple[str, bytes]]) -> list[tuple[str, int]]:
    """Produce; return (topic, error code or 0) per record."""
    results: list[tuple[str, int]] = []

    def done(err: KafkaError | None, msg: Any) -> None:
        results.append((msg.topic(), 0 if err is None else err.code()))

    producer = Producer({"linger.ms": 50, "retries": 0, "message.timeout.ms": 30000, **conf})
    for topic, value in records:
        producer.produce(topic, value, on_delivery=done)
    assert producer.flush(60) == 0
    return results


@contextlib.contextmanager
def alice_connection(env: Env) -> Iterator[RawConnection]:
    """A bare Kafka connection to the gateway, logged in as alice (SASL PLAIN)."""
    raw = RawConnection(env.gateway.bootstrap)
    try:
        assert raw.request(ApiKey.SASL_HANDSHAKE, 1, {"Mechanism": "PLAIN"})["ErrorCode"] == 0
        auth = b"\0alice\0" + USERS["alice"].encode()
        assert raw.request(ApiKey.SASL_AUTHENTICATE, 2, {"AuthBytes": auth})["ErrorCode"] == 0
        yield raw
    finally:
        raw.close()


def admin_topic(env: Env, name: str) -> str:
    return create_topic(env.kafka.bootstrap, name=name)


def test_alice_writes_payments_bob_is_denied_on_the_same_connection(env: Env) -> None:
    payments = admin_topic(env, f"payments.{uuid.uuid4().hex[:6]}")
    other = admin_topic(env, f"other.{uuid.uuid4().hex[:6]}")

    alice = produce(env.client("alice"), [(payments, b"a")] * 5)
    assert alice == [(payments, 0)] * 5

    # bob (SCRAM): one producer, one connection, both topics in the same requests.
    bob = produce(env.client("bob", "SCRAM-SHA-256"),
                  [(payments, b"b"), (other, b"b")] * 5)
    assert sorted(set(bob)) == sorted({(payments, TOPIC_AUTHORIZATION_FAILED), (other, 0)})
    assert env.broker_count(payments) == 5  # only alice's: bob's never reached the broker
    assert env.broker_count(other) == 5

    events = [e for e in env.audit_events() if e["rule_id"] == "payments-only-alice"]
    assert events and {e["principal"] for e in events} == {"User:bob"}
    assert {(e["topic"], e["outcome"], e["error_code"]) for e in events} == {
        (payments, "denied", TOPIC_AUTHORIZATION_FAILED)}
    assert all(e["security_protocol"] == "SASL_PLAINTEXT" for e in events)
    metrics = env.metrics()
    assert 'rule="payments-only-alice"' in metrics
    assert metric(metrics, "keg_requests_total", 'api="Produce"', 'principal="User:bob"') > 0
    assert metric(metrics, "keg_forwarded_requests_total") > 0
    assert metric(metrics, "keg_frame_latency_seconds_count") > 0
    assert metric(metrics, "keg_request_bytes_total", 'direction="response"') > 0


def metric(text: str, name: str, *labels: str) -> float:
    """The sum of a Prometheus series' samples whose labels include all of `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(label in line for label in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


def committed(env: Env, topic: str, expected: int) -> list[bytes]:
    """The committed records of every partition of `topic` (read directly, sorted):
    `expected` of them, or what came within 15 s once past them (0: the 3 s it waits)."""
    consumer = Consumer({"bootstrap.servers": env.kafka.bootstrap, "enable.auto.commit": False,
                         "isolation.level": "read_committed",
                         "group.id": f"check-{uuid.uuid4().hex[:6]}"})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    values: list[bytes] = []
    deadline = time.monotonic() + (15 if expected else 3)
    try:
        while time.monotonic() < deadline and (not expected or len(values) < expected):
            for msg in consumer.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                values.append(msg.value() or b"")
    finally:
        consumer.close()
    return sorted(values)


def test_a_transaction_writing_a_denied_topic_is_refused_before_its_records(env: Env) -> None:
    """A deny of Produce refused a transaction's records of that topic in the middle of
    its commit: librdkafka then purged batches that already had sequence numbers, and
    the producer's next transaction failed too (OUT_OF_ORDER_SEQUENCE_NUMBER). Kafka
    authorizes a transaction's writes at AddPartitionsToTxn, before any record: so does
    the gateway, with the authorization error (never a Produce rule's own error code)."""
    suffix = uuid.uuid4().hex[:6]
    payments, frozen = (create_topic(env.kafka.bootstrap, 3, f"{p}.{suffix}")
                        for p in ("payments", "frozen"))
    others = [create_topic(env.kafka.bootstrap, 3, f"other{i}.{suffix}") for i in range(2)]
    producer = Producer({**env.client("bob"), "transactional.id": f"txn-{suffix}",
                         "linger.ms": 200, "compression.type": "lz4"})
    producer.init_transactions(30)
    outcomes: list[tuple[str, int | None]] = []
    for attempt, topics in enumerate([[payments, *others], [frozen, *others], others, others]):
        producer.begin_transaction()
        # The allowed topics' partitions are added first, as a producer that writes on
        # does: had its first AddPartitionsToTxn been refused, the broker would hold no
        # transaction to abort and librdkafka's abort fails (INVALID_TXN_STATE), with
        # Kafka's own authorizer too.
        for topic in reversed(topics):
            for i in range(30):
                producer.produce(topic, b"%d-%d" % (attempt, i), partition=i % 3)
            producer.flush(30)
        try:
            producer.commit_transaction(30)
            outcomes.append(("committed", None))
        except KafkaException as err:
            assert err.args[0].txn_requires_abort(), err
            outcomes.append(("aborted", err.args[0].code()))
            producer.abort_transaction(30)
    assert outcomes == [("aborted", TOPIC_AUTHORIZATION_FAILED)] * 2 + [("committed", None)] * 2
    for topic in others:
        assert committed(env, topic, 60) == sorted(
            b"%d-%d" % (a, i) for a in (2, 3) for i in range(30))
    assert committed(env, payments, 0) == committed(env, frozen, 0) == []
    events = [e for e in env.wait_for_audit("payments-only-alice") if e["topic"] == payments]
    assert {(e["api_name"], e["error_code"]) for e in events} == {
        ("AddPartitionsToTxn", TOPIC_AUTHORIZATION_FAILED)}


def test_bob_cannot_read_payments_alice_can(env: Env) -> None:
    payments = admin_topic(env, f"payments.{uuid.uuid4().hex[:6]}")
    produce(env.client("alice"), [(payments, b"secret")] * 3)

    def read(user: str) -> tuple[int, int | None]:
        consumer = Consumer({**env.client(user), "group.id": f"{user}-{uuid.uuid4().hex[:6]}",
                             "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(payments, 0, 0)])
        got, error = 0, None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and got < 3 and error is None:
            for msg in consumer.consume(10, 0.5):
                failure = msg.error()
                if failure is not None:
                    error = failure.code()
                else:
                    got += 1
        consumer.close()
        return got, error

    assert read("alice") == (3, None)
    got, error = read("bob")
    assert got == 0 and error == TOPIC_AUTHORIZATION_FAILED


def test_a_fetch_naming_a_denied_and_an_allowed_topic_reads_the_allowed_one(env: Env) -> None:
    """librdkafka fetches every partition it reads from a broker in one Fetch. One that
    named a denied topic beside an allowed one was refused whole: bob, assigned a
    payments topic and another, read nothing of the other. As Kafka's authorizer, the
    gateway now refuses the denied topic's partitions and answers the others."""
    payments = admin_topic(env, f"payments.{uuid.uuid4().hex[:6]}")
    other = admin_topic(env, f"other.{uuid.uuid4().hex[:6]}")
    direct = {"bootstrap.servers": env.kafka.bootstrap}
    assert produce(direct, [(payments, b"secret")] * 3) == [(payments, 0)] * 3
    assert produce(direct, [(other, b"open-%d" % i) for i in range(5)]) == [(other, 0)] * 5
    consumer = Consumer({**env.client("bob"), "group.id": f"bob-{uuid.uuid4().hex[:6]}"})
    consumer.assign([TopicPartition(payments, 0, 0), TopicPartition(other, 0, 0)])
    got: dict[str, list[bytes]] = {payments: [], other: []}
    errors: set[tuple[str | None, int]] = set()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (len(got[other]) < 5 or not errors):
            for msg in consumer.consume(10, 0.5):
                failure = msg.error()
                if failure is not None:
                    errors.add((msg.topic(), int(failure.code())))
                else:
                    got[msg.topic() or ""].append(msg.value() or b"")
    finally:
        consumer.close()
    assert got == {payments: [], other: [b"open-%d" % i for i in range(5)]}
    assert errors == {(payments, TOPIC_AUTHORIZATION_FAILED)}
    events = env.wait_for_audit("payments-only-alice")
    assert {(e["principal"], e["api_name"], e["outcome"]) for e in events
            if e["topic"] == payments} == {("User:bob", "Fetch", "denied")}


def test_a_kip848_consumer_reads_through_a_topic_rule_on_metadata(env: Env) -> None:
    """A consumer of the new group protocol (group.protocol=consumer) learns its
    assignment as topic ids and asks Metadata for their names. While any enforced
    topic rule judged Metadata, the gateway answered such a request UNKNOWN_TOPIC_ID
    ("refresh metadata": the very request refused), and librdkafka never consumed. Now
    the Metadata goes on and its answer, which names the ids, is judged."""
    topic = admin_topic(env, f"kip848.{uuid.uuid4().hex[:6]}")
    # Written directly: the gateway has not seen the topic's id before the consumer.
    assert produce({"bootstrap.servers": env.kafka.bootstrap},
                   [(topic, b"r%d" % i) for i in range(20)]) == [(topic, 0)] * 20
    consumer = Consumer({**env.client("alice"), "group.id": f"kip848-{uuid.uuid4().hex[:6]}",
                         "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 20 and time.monotonic() < deadline:
            for msg in consumer.consume(20, 0.5):
                value = msg.value()
                assert msg.error() is None and value is not None, msg.error()
                got.append(value)
    finally:
        consumer.close()
    assert sorted(got) == sorted(b"r%d" % i for i in range(20))


def first_fetch_error(env: Env, user: str, topic: str) -> int | None:
    """The error a fresh librdkafka consumer of `user` meets reading `topic` (None:
    it read a record)."""
    consumer = Consumer({**env.client(user), "group.id": f"{user}-{uuid.uuid4().hex[:6]}"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for msg in consumer.consume(10, 0.5):
                failure = msg.error()
                return None if failure is None else int(failure.code())
        raise AssertionError(f"{user} read nothing from {topic}, and no error")
    finally:
        consumer.close()


@pytest.mark.parametrize("tool", ["console-consumer", "console-share-consumer"])
def test_a_deny_added_live_stops_an_open_fetch_session(env: Env, tool: str) -> None:
    """A fetch session (KIP-227; a share session, KIP-932) names only the partitions
    that changed; a deny added while a Java consumer's session was open judged only
    those, so the records written after it still reached the consumer in the session's
    other partitions. Kafka authorizes every partition of a session on every fetch: now
    the answer's partitions of a denied topic are TOPIC_AUTHORIZATION_FAILED, without
    records, and the consumer stops there."""
    topic = admin_topic(env, f"late.{uuid.uuid4().hex[:6]}")
    direct = {"bootstrap.servers": env.kafka.bootstrap}
    assert produce(direct, [(topic, b"written-before-the-deny")]) == [(topic, 0)]
    out = env.rules.parent / f"{topic}.out"
    group = f"late-{uuid.uuid4().hex[:6]}"
    args = ["--bootstrap-server", env.gateway.bootstrap, "--topic", topic, "--group", group]
    if tool == "console-share-consumer":  # a new share group starts at the end otherwise
        run_java_tool("configs", "--bootstrap-server", env.kafka.bootstrap, "--entity-type",
                      "groups", "--entity-name", group, "--alter", "--add-config",
                      "share.auto.offset.reset=earliest", check=True)
    else:
        args.append("--from-beginning")
    for prop in java_sasl("alice"):
        args += ["--consumer-property", prop]
    with out.open("w") as sink:
        consumer = subprocess.Popen(java_tool_command(tool, *args),
                                    stdout=sink, stderr=subprocess.STDOUT, text=True)
    path = env.rules / "rules.yaml"
    try:
        deadline = time.monotonic() + 60
        while "written-before-the-deny" not in out.read_text():
            assert consumer.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        path.write_text(RULES + """
  - id: close-late-topics
    match: {apis: [Fetch, ShareFetch], topics: {prefix: [late.]}}
    action: {deny: {}}
""")
        deadline = time.monotonic() + 30  # enforced on new connections: the set is live
        while first_fetch_error(env, "alice", topic) != TOPIC_AUTHORIZATION_FAILED:
            assert time.monotonic() < deadline, "the deny never applied"
        assert produce(direct, [(topic, b"written-after-the-deny")]) == [(topic, 0)]
        with contextlib.suppress(subprocess.TimeoutExpired):
            consumer.wait(20)  # it stops at the refusal; a leaking one would run on
    finally:
        consumer.kill()
        consumer.wait()
        path.write_text(RULES)
    seen = out.read_text()
    assert "written-after-the-deny" not in seen, seen
    assert "TopicAuthorizationException" in seen, seen


def group_with_offsets(env: Env, prefix: str) -> tuple[str, str, str]:
    """A denied (hidden.) and an allowed topic, and a group (committed directly) at
    offset 7 of the first and 4 of the second."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    public = admin_topic(env, f"pub.{uuid.uuid4().hex[:6]}")
    group = f"{prefix}-{uuid.uuid4().hex[:6]}"
    committer = Consumer({"bootstrap.servers": env.kafka.bootstrap, "group.id": group})
    committer.commit(offsets=[TopicPartition(hidden, 0, 7), TopicPartition(public, 0, 4)],
                     asynchronous=False)
    committer.close()
    return hidden, public, group


def test_a_groups_offsets_show_allowed_topics_and_hide_denied_ones(env: Env) -> None:
    """OffsetFetch for all of a group's topics returned the offsets of a denied topic
    (its name and position leaked), and one naming a denied and an allowed topic was
    refused for the whole group (librdkafka's admin then returned no offsets at all).
    As Kafka's authorizer answers: a denied topic is left out of an all-topics answer,
    and refused per partition beside the allowed ones."""
    hidden, public, group = group_with_offsets(env, "offsets")
    admin = AdminClient(env.client("alice"))

    def offsets(partitions: list[TopicPartition] | None) -> dict[str, tuple[int, int | None]]:
        asked = ConsumerGroupTopicPartitions(group, partitions)
        answer = admin.list_consumer_group_offsets([asked])[group].result(30)
        return {tp.topic: (tp.offset, None if tp.error is None else tp.error.code())
                for tp in answer.topic_partitions}

    assert offsets(None) == {public: (4, None)}
    both = offsets([TopicPartition(hidden, 0), TopicPartition(public, 0)])
    assert both[public] == (4, None)
    assert both[hidden][1] == TOPIC_AUTHORIZATION_FAILED


def test_a_group_description_does_not_name_a_denied_topic(env: Env) -> None:
    """ConsumerGroupDescribe (KIP-848) answers name each member's subscribed and
    assigned topics: a group of a denied topic was described in full through the
    gateway, its topic's name with it. As Kafka answers a caller that may not describe
    one of a group's topics: that group is TOPIC_AUTHORIZATION_FAILED, the others are
    described."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    public = admin_topic(env, f"pub.{uuid.uuid4().hex[:6]}")
    groups = {topic: f"described-{uuid.uuid4().hex[:6]}" for topic in (hidden, public)}
    members = []
    try:
        for topic, group in groups.items():  # directly on the broker: no rule there
            member = Consumer({"bootstrap.servers": env.kafka.bootstrap, "group.id": group,
                               "group.protocol": "consumer"})
            member.subscribe([topic])
            members.append(member)
        deadline = time.monotonic() + 60
        while not all(m.assignment() for m in members):
            assert time.monotonic() < deadline, "the members were never assigned"
            for member in members:
                member.poll(0.2)
        admin = AdminClient(env.client("alice"))
        futures = admin.describe_consumer_groups(list(groups.values()))
        refused = futures[groups[hidden]].exception(30)
        described = futures[groups[public]].result(30)
    finally:
        for member in members:
            member.close()
    assert refused is not None and refused.args[0].code() == TOPIC_AUTHORIZATION_FAILED
    assert hidden not in str(refused)
    [member] = described.members
    assert {tp.topic for tp in member.assignment.topic_partitions} == {public}
    events = env.wait_for_audit("hidden-topics")
    assert ("ConsumerGroupDescribe", hidden) in {(e["api_name"], e["topic"]) for e in events}


def test_metadata_of_a_denied_topic_still_lists_the_brokers(env: Env) -> None:
    """Metadata naming only denied topics was answered by the gateway with no broker at
    all (`kcat -L -t` printed "0 brokers"); Kafka's authorizer lists them. It now goes
    on without its topics and the denied ones are refused in the broker's answer."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    admin = AdminClient(env.client("alice"))
    md = admin.list_topics(hidden, timeout=10)
    assert len(md.brokers) == 1 and md.controller_id >= 0
    error = md.topics[hidden].error
    assert error is not None and error.code() == TOPIC_AUTHORIZATION_FAILED
    assert not md.topics[hidden].partitions


def test_describe_topic_partitions_of_every_topic_leaves_denied_ones_out(env: Env) -> None:
    """DescribeTopicPartitions naming no topic describes them all (a page at a time,
    from a cursor). The gateway passed it on, denied topics and their partitions in the
    answer; one whose cursor named a denied topic was refused whole. As Metadata for
    all topics (and Kafka's authorizer): denied topics are left out, the page goes on."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    public = admin_topic(env, f"pub.{uuid.uuid4().hex[:6]}")
    with alice_connection(env) as raw:
        pages = [raw.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, {
            "Topics": [], "ResponsePartitionLimit": 2000, "Cursor": cursor})
            for cursor in (None, {"TopicName": hidden, "PartitionIndex": 0})]
    for page in pages:
        names = {t["Name"] for t in page["Topics"]}
        assert public in names and not any(n.startswith("hidden.") for n in names), names


def test_share_group_offsets_of_a_denied_topic_are_refused_on_an_open_connection(
        env: Env) -> None:
    """Describe/Alter/DeleteShareGroupOffsets (Kafka 4.1's share-group admin calls)
    naming a denied topic: the gateway had no refusal for them and closed the
    connection; Java's Admin reconnected every second until it timed out (regression).
    Each is now answered TOPIC_AUTHORIZATION_FAILED for the topic, as Kafka's
    authorizer answers, and the connection stays open."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    group = f"share-offsets-{uuid.uuid4().hex[:6]}"
    with alice_connection(env) as raw:
        described = raw.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, {"Groups": [
            {"GroupId": group, "Topics": [{"TopicName": hidden, "Partitions": [0]}]}]})
        altered = raw.request(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, {
            "GroupId": group, "Topics": [{"TopicName": hidden, "Partitions": [
                {"PartitionIndex": 0, "StartOffset": 3}]}]})
        deleted = raw.request(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, {
            "GroupId": group, "Topics": [{"TopicName": hidden}]})
        # Still open: the next request is answered on it.
        assert raw.request(ApiKey.API_VERSIONS, 3, {"ClientSoftwareName": "t",
                                                    "ClientSoftwareVersion": "1"})[
            "ErrorCode"] == 0
    [[partition]] = [t["Partitions"] for g in described["Groups"] for t in g["Topics"]]
    assert partition["ErrorCode"] == TOPIC_AUTHORIZATION_FAILED
    [[partition]] = [t["Partitions"] for t in altered["Responses"]]
    assert partition["ErrorCode"] == TOPIC_AUTHORIZATION_FAILED
    assert [t["ErrorCode"] for t in deleted["Responses"]] == [TOPIC_AUTHORIZATION_FAILED]


def test_pipelined_requests_that_share_a_correlation_id_are_each_answered(env: Env) -> None:
    """Two Metadata requests for all topics (answers a rule judges) pipelined with one
    correlation id: the broker answers both; the native path answered the first and
    closed the connection ("response 7 was not asked for": the service kept one answer
    per id). Each is answered now, in order, and the connection stays open."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    public = admin_topic(env, f"pub.{uuid.uuid4().hex[:6]}")
    with alice_connection(env) as raw:
        header = kafka_wire.RequestHeader(ApiKey.METADATA, 12, 7, "dup-ids", {})
        frame = kafka_wire.encode_request(header, {
            "Topics": None, "AllowAutoTopicCreation": False,
            "IncludeTopicAuthorizedOperations": False})
        raw.sock.sendall(frame + frame)
        answers = []
        for _ in range(2):
            data = read_frame(raw.sock)
            assert data is not None, "the gateway closed the connection"
            answers.append(kafka_wire.decode_response(data, ApiKey.METADATA, 12))
        assert raw.request(ApiKey.API_VERSIONS, 3, {"ClientSoftwareName": "t",
                                                    "ClientSoftwareVersion": "1"})[
            "ErrorCode"] == 0
    assert [cid for cid, _ in answers] == [7, 7]
    for _, answer in answers:
        names = {t["Name"] for t in answer["Topics"]}
        assert public in names and hidden not in names  # judged: the denied one left out


def share_group_at(env: Env, group: str, topics: list[str]) -> None:
    """A share group, empty, with start offsets on partition 0 of `topics`: made directly
    on the broker (a member joins and leaves, then its offsets are set)."""
    direct = RawConnection(env.kafka.bootstrap)
    try:
        member = uuid.uuid4().hex[:22]
        for _ in range(60):  # until the group coordinator is loaded (NOT_COORDINATOR, ...)
            joined = direct.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, {
                "GroupId": group, "MemberId": member, "MemberEpoch": 0, "RackId": None,
                "SubscribedTopicNames": topics})
            if joined["ErrorCode"] not in (14, 15, 16):
                break
            direct.request(ApiKey.FIND_COORDINATOR, 4, {"KeyType": 0, "CoordinatorKeys": [group]})
            time.sleep(0.5)
        assert joined["ErrorCode"] == 0, joined
        epoch = joined["MemberEpoch"]
        for _ in range(60):  # until the group initialized its topics' share partitions
            beat = direct.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, {
                "GroupId": group, "MemberId": member, "MemberEpoch": epoch, "RackId": None,
                "SubscribedTopicNames": None})
            assert beat["ErrorCode"] == 0, beat
            epoch = beat["MemberEpoch"]
            assigned = (beat.get("Assignment") or {}).get("TopicPartitions") or []
            if len(assigned) == len(topics):
                break
            time.sleep(0.5)
        # A share fetch initializes the partitions' share state (their offsets).
        fetched = direct.request(ApiKey.SHARE_FETCH, 1, {
            "GroupId": group, "MemberId": member, "ShareSessionEpoch": 0, "MaxWaitMs": 100,
            "MinBytes": 1, "MaxBytes": 1 << 20, "MaxRecords": 10, "BatchSize": 10,
            "Topics": [{"TopicId": a["TopicId"], "Partitions": [
                {"PartitionIndex": i, "AcknowledgementBatches": []} for i in a["Partitions"]]}
                for a in assigned], "ForgottenTopicsData": []})
        assert fetched["ErrorCode"] == 0, fetched
        left = direct.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, {
            "GroupId": group, "MemberId": member, "MemberEpoch": -1, "RackId": None,
            "SubscribedTopicNames": None})
        assert left["ErrorCode"] == 0, left
        described = direct.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, {"Groups": [
            {"GroupId": group, "Topics": None}]})
        assert {t["TopicName"] for g in described["Groups"] for t in g["Topics"]} == set(topics)
    finally:
        direct.close()


def test_share_group_offsets_hide_denied_topics_and_answer_the_others(env: Env) -> None:
    """A share group's offsets asked for all its topics (null topics) named a denied
    topic, its partitions and offsets: the answer went through unchanged (regression).
    A request naming a denied and an allowed topic refused both, and a second group
    asking for all its topics was answered with none (regression). Now denied topics
    are left out of listings, as Kafka's authorizer leaves them out, and refused one by
    one; allowed ones are answered by the broker, in Describe, Alter and Delete."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    public = admin_topic(env, f"pub.{uuid.uuid4().hex[:6]}")
    group, other = (f"share-offsets-{uuid.uuid4().hex[:6]}" for _ in range(2))
    for g in (group, other):
        share_group_at(env, g, [hidden, public])
    with alice_connection(env) as raw:
        listed = raw.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, {"Groups": [
            {"GroupId": group, "Topics": None}]})
        named = raw.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, {"Groups": [
            {"GroupId": group, "Topics": [{"TopicName": hidden, "Partitions": [0]},
                                          {"TopicName": public, "Partitions": [0]}]},
            {"GroupId": other, "Topics": None}]})
        altered = raw.request(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, {
            "GroupId": group, "Topics": [
                {"TopicName": t, "Partitions": [{"PartitionIndex": 0, "StartOffset": 0}]}
                for t in (hidden, public)]})
        deleted = raw.request(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, {
            "GroupId": group, "Topics": [{"TopicName": hidden}, {"TopicName": public}]})

    def errors(groups: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
        return {(g["GroupId"], t["TopicName"]): p["ErrorCode"]
                for g in groups for t in g["Topics"] for p in t["Partitions"]}

    assert errors(listed["Groups"]) == {(group, public): 0}
    assert errors(named["Groups"]) == {(group, hidden): TOPIC_AUTHORIZATION_FAILED,
                                       (group, public): 0, (other, public): 0}
    # The allowed topic is answered as the broker answers it alone (on the twin group).
    direct = RawConnection(env.kafka.bootstrap)
    try:
        alone = direct.request(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, {
            "GroupId": other, "Topics": [
                {"TopicName": public, "Partitions": [{"PartitionIndex": 0, "StartOffset": 0}]}]})
        deleted_alone = direct.request(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, {
            "GroupId": other, "Topics": [{"TopicName": public}]})
        after = direct.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, {"Groups": [
            {"GroupId": group, "Topics": None}]})
    finally:
        direct.close()
    refused_hidden = {"TopicName": hidden, "TopicId": uuid.UUID(int=0), "Partitions": [
        {"PartitionIndex": 0, "ErrorCode": TOPIC_AUTHORIZATION_FAILED}]}

    def outcomes(topics: list[dict[str, Any]]) -> list[tuple[str, list[tuple[int, int]]]]:
        return sorted((t["TopicName"], [(p["PartitionIndex"], p["ErrorCode"])
                                        for p in t["Partitions"]]) for t in topics)

    assert outcomes(altered["Responses"]) == outcomes([refused_hidden, *alone["Responses"]])
    assert sorted((t["TopicName"], t["ErrorCode"]) for t in deleted["Responses"]) == sorted([
        (hidden, TOPIC_AUTHORIZATION_FAILED),
        *((t["TopicName"], t["ErrorCode"]) for t in deleted_alone["Responses"])])
    assert (group, hidden) in errors(after["Groups"]), "the denied topic's offsets went"


def test_write_txn_markers_naming_a_denied_topic_is_refused_on_an_open_connection(
        env: Env) -> None:
    """WriteTxnMarkers (a broker's call, which a client can send as well) naming a denied
    topic: the gateway had no refusal for it and closed the connection. Each partition
    is now answered TOPIC_AUTHORIZATION_FAILED and the connection stays open."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    with alice_connection(env) as raw:
        answer = raw.request(ApiKey.WRITE_TXN_MARKERS, 1, {"Markers": [{
            "ProducerId": 41, "ProducerEpoch": 0, "TransactionResult": True,
            "Topics": [{"Name": hidden, "PartitionIndexes": [0]}], "CoordinatorEpoch": 0}]})
        assert raw.request(ApiKey.API_VERSIONS, 3, {"ClientSoftwareName": "t",
                                                    "ClientSoftwareVersion": "1"})[
            "ErrorCode"] == 0
    [marker] = answer["Markers"]
    assert marker["ProducerId"] == 41
    assert [(t["Name"], [p["ErrorCode"] for p in t["Partitions"]]) for t in marker["Topics"]] \
        == [(hidden, [TOPIC_AUTHORIZATION_FAILED])]


def test_deleting_a_groups_offsets_refuses_only_the_denied_topic(env: Env) -> None:
    """`kafka-consumer-groups.sh --delete-offsets` describes the topics
    (DescribeTopicPartitions), then deletes (OffsetDelete): each request naming a denied
    and an allowed topic was refused whole, and nothing was deleted. As Kafka's
    authorizer answers, the denied topic is refused and the allowed one's offsets go."""
    hidden, public, group = group_with_offsets(env, "deleting")
    config = env.rules.parent / "alice.properties"
    config.write_text("\n".join(java_sasl("alice")) + "\n")
    done = run_java_tool("consumer-groups", "--bootstrap-server", env.gateway.bootstrap,
                         "--command-config", str(config), "--delete-offsets", "--group", group,
                         "--topic", hidden, "--topic", public, timeout=120)
    assert "TopicAuthorizationException" in done.stdout + done.stderr, done.stdout + done.stderr
    direct = AdminClient({"bootstrap.servers": env.kafka.bootstrap})
    [future] = direct.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    left = {tp.topic: tp.offset for tp in future.result(30).topic_partitions}
    assert left == {hidden: 7}, done.stdout + done.stderr


def test_describing_a_denied_and_an_allowed_topics_configs_describes_the_allowed_one(
        env: Env) -> None:
    """librdkafka's admin asks DescribeConfigs for every resource at once: one naming a
    denied topic refused them all. Kafka authorizes each resource: so does the gateway."""
    hidden = admin_topic(env, f"hidden.{uuid.uuid4().hex[:6]}")
    public = admin_topic(env, f"pub.{uuid.uuid4().hex[:6]}")
    admin = AdminClient(env.client("alice"))
    futures = admin.describe_configs([ConfigResource("topic", hidden),
                                      ConfigResource("topic", public)])
    answers = {resource.name: future for resource, future in futures.items()}
    assert "cleanup.policy" in answers[public].result(30)
    refused = answers[hidden].exception(30)
    assert refused is not None and refused.args[0].code() == TOPIC_AUTHORIZATION_FAILED


def test_a_share_consumer_is_denied_what_fetch_is_denied(env: Env) -> None:
    """A deny on Fetch keeps share groups (KIP-932, ShareFetch) off the topic too: bob's
    share consumer read every payments record before."""
    payments = admin_topic(env, f"payments.{uuid.uuid4().hex[:6]}")
    produce(env.client("alice"), [(payments, b"secret")] * 3)

    def read(user: str) -> list[str]:
        done = share_console_consume(env.kafka, env.gateway.bootstrap, payments, 3, user=user)
        return done.stdout.splitlines()

    assert read("alice") == ["secret"] * 3
    assert read("bob") == []
    events = [e for e in env.audit_events() if e["rule_id"] == "payments-only-alice"
              and e["topic"] == payments]
    assert {(e["api_name"], e["principal"], e["outcome"]) for e in events} == {
        ("ShareFetch", "User:bob", "denied")}


def test_rules_reload_live_and_invalid_sets_are_refused(env: Env) -> None:
    other = admin_topic(env, f"other.{uuid.uuid4().hex[:6]}")
    producer = Producer({**env.client("bob"), "linger.ms": 0, "retries": 0})
    assert deliver(producer, other) == 0
    path = env.rules / "rules.yaml"
    path.write_text(RULES + """
  - id: freeze-other
    match: {apis: [Produce], topics: {prefix: [other.]}}
    action: {deny: {error: POLICY_VIOLATION}}
""")
    deadline = time.monotonic() + 20
    while (code := deliver(producer, other)) == 0:
        assert time.monotonic() < deadline, "the new rule never applied"
        time.sleep(0.5)
    assert code == 44  # POLICY_VIOLATION, on the same live connection

    path.write_text(RULES + "\n  - id: broken\n    match: {apis: [NoSuchApi]}\n"
                    "    action: {deny: {}}\n")
    deadline = time.monotonic() + 20
    while 'keg_rule_reloads_total{result="rejected"}' not in env.metrics():
        assert time.monotonic() < deadline, "the broken set was never read"
        time.sleep(0.2)
    assert deliver(producer, other) == 44  # refused: the last good set (with freeze-other) stays
    path.write_text(RULES)
    deadline = time.monotonic() + 20
    while deliver(producer, other) != 0:
        assert time.monotonic() < deadline, "the valid set never applied again"
        time.sleep(0.5)
    producer.flush(10)


def test_kafka_python_sasl_client_gets_the_same_answers(env: Env) -> None:
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    payments = admin_topic(env, f"payments.{uuid.uuid4().hex[:6]}")
    other = admin_topic(env, f"other.{uuid.uuid4().hex[:6]}")
    producer = KafkaProducer(
        bootstrap_servers=env.gateway.bootstrap, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="bob",
        sasl_plain_password=USERS["bob"], retries=0,
    )
    try:
        assert producer.send(other, b"ok").get(timeout=30).topic == other
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(payments, b"no").get(timeout=30)
        assert producer.send(other, b"still ok").get(timeout=30).offset == 1  # same connection
    finally:
        producer.close(10)
    assert env.broker_count(payments) == 0


def test_safeguard_refuses_unsafe_producers_and_passes_safe_ones(env: Env) -> None:
    topic = admin_topic(env, f"safe.{uuid.uuid4().hex[:6]}")
    unsafe = produce(env.client("alice", conf={"enable.idempotence": False,
                                            "compression.type": "none"}), [(topic, b"x")] * 3)
    assert {code for _, code in unsafe} == {44}  # POLICY_VIOLATION: not idempotent
    # Values big enough to compress: librdkafka sends a batch that lz4 cannot shrink as is.
    safe = produce(env.client("alice", conf={"enable.idempotence": True, "retries": 5,
                                          "compression.type": "lz4"}), [(topic, b"y" * 2000)] * 3)
    assert safe == [(topic, 0)] * 3
    assert env.broker_count(topic) == 3
    reasons = {e["reason"] for e in env.audit_events() if e["rule_id"] == "safe-producers"}
    assert "an idempotent producer is required" in reasons
    assert metric(env.metrics(), "keg_decisions_total", 'rule="safe-producers"',
                  'outcome="denied"') >= 1


def test_rate_limit_answers_with_throttle_time_not_a_disconnect(env: Env) -> None:
    topic = admin_topic(env, f"rated.{uuid.uuid4().hex[:6]}")
    throttles: list[float] = []
    stats: list[dict[str, Any]] = []
    conf = env.client("carol", conf={
        "throttle_cb": lambda event: throttles.append(event.throttle_time),
        "stats_cb": lambda text: stats.append(json.loads(text)),
        "statistics.interval.ms": 500, "batch.size": 20000,
    })
    value = b"v" * 1000
    started = time.monotonic()
    results = produce(conf, [(topic, value)] * 400)  # 400 KB against 50 KB/s
    took = time.monotonic() - started
    assert results == [(topic, 0)] * 400  # every record delivered
    assert throttles and max(throttles) > 0  # the client was told to back off
    print(f"400 KB in {took:.1f} s; throttles up to {max(throttles):.1f} s")
    if env.gateway.settings.data_path == "native":
        # librdkafka ignores throttle_time_ms: the module holds the connection's next
        # requests back for it, as Kafka mutes a throttled channel. 350 KB over the burst
        # at 50 KB/s is 7 s; before, nothing held them (regression: ~0.3 s).
        assert took >= 3.5
    assert env.broker_count(topic) == 400
    disconnects = [b.get("disconnects", 0) for s in stats for b in s["brokers"].values()
                   if "bootstrap" not in b["name"]]
    assert max(disconnects, default=0) == 0
    events = [e for e in env.audit_events() if e["rule_id"] == "slow-down-carol"]
    assert events and {e["outcome"] for e in events} == {"throttled"}
    assert metric(env.metrics(), "keg_decisions_total", 'rule="slow-down-carol"',
                  'outcome="throttled"') >= 1


@contextlib.contextmanager
def pipelining_producer(env: Env, topic: str, records: int, size: int,
                        **conf: Any) -> Iterator[list[int]]:
    """A librdkafka producer (as alice) with `records` of `size` bytes queued at once,
    pipelining its requests; yields the error codes of those delivered so far, and is
    destroyed on exit with the rest still queued or in flight."""
    delivered: list[int] = []
    producer = Producer(env.client("alice", conf={
        "linger.ms": 0, "retries": 0, "message.timeout.ms": 120000,
        "enable.idempotence": False, **conf}))
    for _ in range(records):
        producer.produce(topic, b"v" * size,
                         on_delivery=lambda err, _m: delivered.append(err.code() if err else 0))
    producer.poll(0)
    try:
        yield delivered
    finally:
        producer.purge()
        producer.flush(0)
        del producer


def test_a_pipelining_librdkafka_producer_is_held_to_a_bytes_rate(env: Env) -> None:
    """librdkafka ignores throttle_time_ms and pipelines: with 8 MB queued against
    100 KB/s, the native path let 1.6 MB/s through (regression). Requests were judged as
    they arrived, so the connection's whole queue (up to its 16 MiB bound) ran the bucket
    into the most debt it may owe (10 s of the rate), then went at the mute's end. Now
    they are judged when they may go, one at a time after a mute."""
    if env.gateway.settings.data_path != "native":
        pytest.skip("the ext_proc path holds a request at most 0.25 s (docs/rules.md)")
    topic = admin_topic(env, f"held.{uuid.uuid4().hex[:6]}")
    with pipelining_producer(env, topic, 800, 10_000, **{"batch.size": 64_000}):
        time.sleep(12)
        stored = env.broker_count(topic) * 10_000
    # 12 s at 100 KB/s and the 100 KB burst: 1.3 MB (measured: 1.32), and a request or
    # two of slack. Judged on arrival, 4.08 MB went (64 hand-offs of 64 KB, all judged
    # before the first throttle came back and released together at the mute's end).
    print(f"{stored / 1e6:.2f} MB stored in 12 s through 100 KB/s")
    assert 100_000 <= stored <= 1_500_000


def test_the_brokers_answers_reach_a_client_whose_requests_a_throttle_holds(
        env: Env) -> None:
    """A librdkafka producer (not idempotent: a million requests in flight) pipelining
    16 KB batches into 100 KB/s: past 64 requests held for the rate, the broker's answers
    to those already forwarded waited behind them (regression: 96 answered in 46 s while
    4,960 records were stored; timed out, the client sent them again, and 17,888 of 6,000
    were stored twice). They reach it as the broker gives them now."""
    if env.gateway.settings.data_path != "native":
        pytest.skip("the ext_proc path holds a request at most 0.25 s (docs/rules.md)")
    topic = admin_topic(env, f"held.{uuid.uuid4().hex[:6]}")
    acked: list[int] = []
    producer = Producer(env.client("alice", conf={
        "linger.ms": 5, "batch.size": 16_384, "enable.idempotence": False,
        "max.in.flight": 1000, "message.timeout.ms": 120_000}))
    try:
        for _ in range(4000):
            producer.produce(topic, b"v" * 1000, on_delivery=lambda err, _m: acked.append(
                0 if err is None else err.code()))
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            producer.poll(0.2)
        stored = env.broker_count(topic)
        producer.poll(0.5)
        answered = acked.count(0)
    finally:
        producer.purge()
        producer.flush(0)
    print(f"{stored} records stored in 12 s, {answered} acknowledged to the client")
    assert stored >= 500
    # What is stored is acknowledged, but for the requests in flight (a batch or two).
    assert answered >= stored - 200, (answered, stored)


@pytest.mark.parametrize("requests", [60, 300])
def test_requests_held_for_a_rate_go_nowhere_once_their_client_has_gone(
        env: Env, requests: int) -> None:
    """A non-idempotent librdkafka producer under a requests_per_second rule stored
    records up to 2.7 times, and they kept arriving for 80 s after it exited
    (regression): the requests the module held for the mute still went to the broker
    after the client had closed its connection, and had sent them again on a new one.
    Now a client's end drops what a throttle holds back, and closes the connection.
    With more requests pipelined than the module holds before it stops reading (64),
    the client's end was not seen (regression: a killed producer's requests went on at
    the rate for minutes): a throttled connection reads on to see it."""
    if env.gateway.settings.data_path != "native":
        pytest.skip("the ext_proc path holds a request at most 0.25 s (docs/rules.md)")
    topic = admin_topic(env, f"paced.{uuid.uuid4().hex[:6]}")
    with pipelining_producer(env, topic, requests, 100,
                             **{"batch.num.messages": 1}) as delivered:
        time.sleep(3)
    gone = env.broker_count(topic)
    time.sleep(9)  # past the longest mute (10 s of the rate), when held requests went
    after = env.broker_count(topic)
    print(f"{len(delivered)} delivered before the client went; at the broker {gone}, "
          f"then {after} 9 s later")
    assert 1 <= gone < 60
    assert after == gone, "requests held for the rate reached the broker after the client left"
    assert delivered.count(0) <= gone


ENDLESS_PRODUCER = """
import json, sys
from confluent_kafka import Producer
producer = Producer(json.loads(sys.argv[1]))
while True:
    try:
        producer.produce(sys.argv[2], b"v" * 1000)
    except BufferError:
        producer.poll(0.05)
    producer.poll(0)
"""


def test_a_killed_producer_past_the_modules_bounds_stops_writing_within_two_batches(
        env: Env) -> None:
    """librdkafka's defaults (1 MB batches, no limit on requests in flight) pass the
    module's 16 MiB bound of a throttled connection within a second under 100 KB/s,
    and the connection is read no further, so the client's end is not read. A killed
    producer must not go on writing at the rate (a new user reported 32,064 records
    over minutes, docs/rules.md): the answer to the first batch released after the kill
    is written to the dead client, the write after it fails, and the connection closes,
    dropping what the throttle holds."""
    if env.gateway.settings.data_path != "native":
        pytest.skip("the ext_proc path holds a request at most 0.25 s (docs/rules.md)")
    topic = admin_topic(env, f"held.{uuid.uuid4().hex[:6]}")
    producer = subprocess.Popen([sys.executable, "-c", ENDLESS_PRODUCER,
                                 json.dumps(env.client("alice")), topic])
    try:
        time.sleep(6)
    finally:
        producer.kill()
        producer.wait()
    killed = env.broker_count(topic)
    counts = [killed]
    deadline = time.monotonic() + 60
    # Settled: unchanged for longer than one mute (10 s of the rate).
    while time.monotonic() < deadline and not (len(counts) > 6 and counts[-7] == counts[-1]):
        time.sleep(2)
        counts.append(env.broker_count(topic))
    print(f"{killed} records stored when the producer was killed, then {counts[1:]}")
    assert counts[-7] == counts[-1], "records went on reaching the broker after the kill"
    # Two batches of 990 records (measured) and one more in flight at the kill.
    assert counts[-1] - killed <= 3 * 1000, "more than three batches after the kill"


def test_observe_deny_apis_and_dry_run(env: Env) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    # observe: alice creates a topic through the gateway; it is created and audited.
    name = f"observed.{uuid.uuid4().hex[:6]}"
    admin = AdminClient(env.client("alice"))
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    assert env.broker_count(name) == 0  # exists (watermarks readable), empty
    observed = [e for e in env.audit_events() if e["rule_id"] == "watch-topic-creation"]
    assert [(e["outcome"], e["principal"], e["api_name"]) for e in observed] == [
        ("observed", "User:alice", "CreateTopics")]

    # deny_apis: bob may not delete topics; the broker never sees the request.
    bobs_admin = AdminClient(env.client("bob"))
    with pytest.raises(KafkaException) as refused:
        bobs_admin.delete_topics([name], operation_timeout=10)[name].result(30)
    assert refused.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED
    assert name in AdminClient({"bootstrap.servers": env.kafka.bootstrap}).list_topics(
        timeout=10).topics
    denied = [e for e in env.audit_events() if e["rule_id"] == "no-topic-deletion"]
    assert [(e["outcome"], e["principal"]) for e in denied] == [("denied", "User:bob")]
    assert metric(env.metrics(), "keg_decisions_total", 'rule="no-topic-deletion"',
                  'outcome="denied"') == 1

    # dry-run: the write goes through; the audit says what the rule would have done.
    audit_topic = admin_topic(env, f"audit.{uuid.uuid4().hex[:6]}")
    assert produce(env.client("bob"), [(audit_topic, b"kept")]) == [(audit_topic, 0)]
    assert env.broker_count(audit_topic) == 1
    would = [e for e in env.audit_events() if e["rule_id"] == "try-freezing-audit-topics"]
    assert {(e["outcome"], e["mode"], e["topic"]) for e in would} == {
        ("would-deny", "dry-run", audit_topic)}
    metrics = env.metrics()
    assert metric(metrics, "keg_decisions_total", 'outcome="would-deny"',
                  'rule="try-freezing-audit-topics"') >= 1
    assert metric(metrics, "keg_decisions_total", 'outcome="observed"') >= 1


def answers_of(relay: RecordingRelay, api_key: int) -> list[dict[str, Any]]:
    """The decoded answers of `api_key` the gateway sent the relay's clients."""
    out = []
    for conn in relay.snapshot():
        for frame in conn.frames:
            if frame.direction == "response" and frame.api_key == api_key:
                _cid, _tags, offset = kafka_wire.read_response_header(
                    frame.frame, api_key, frame.api_version)
                out.append(kafka_wire.decode_body(api_key, frame.api_version, "response",
                                                  frame.frame, offset)[0])
    return out


def test_a_dry_run_fetch_limit_never_reaches_the_broker(env: Env) -> None:
    """bulk-fetch-cap (enforced) caps librdkafka's Fetch at 1 MiB, so the request is
    re-encoded; try-tiny-fetches (dry-run, 100 bytes) must leave no trace in it. With
    MaxBytes 100 the broker answers one batch per Fetch (KIP-74), with 1 MiB all five."""
    topic = admin_topic(env, f"bulk.{uuid.uuid4().hex[:6]}")
    direct = Producer({"bootstrap.servers": env.kafka.bootstrap, "linger.ms": 0})
    for i in range(5):  # five batches of 1 KB
        direct.produce(topic, bytes([65 + i]) * 1000)
        assert direct.flush(30) == 0

    relay = RecordingRelay(gateway_listener(env.gateway))
    consumer = Consumer({**env.client("alice", conf={"bootstrap.servers": relay.bootstrap}),
                         "group.id": f"bulk-{uuid.uuid4().hex[:6]}",
                         "enable.partition.eof": True})
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value() or b"")
    finally:
        consumer.close()
        relay.close()
    assert got == [bytes([65 + i]) * 1000 for i in range(5)]
    # The consumer fetches this one topic (by name, or by id from Fetch v13 on).
    batches_per_fetch = [
        sum(1 for p in t["Partitions"] for _ in iter_batches(p["Records"] or b""))
        for answer in answers_of(relay, ApiKey.FETCH) for t in answer["Responses"]]
    assert max(batches_per_fetch) == 5, batches_per_fetch
    limited = env.wait_for_audit("bulk-fetch-cap")
    assert limited and {(e["outcome"], e["reason"]) for e in limited} == {
        ("limited", "fetch of up to 52428800 bytes capped at 1048576")}
    would = env.wait_for_audit("try-tiny-fetches")
    assert would and {(e["outcome"], e["mode"], e["reason"]) for e in would} == {
        ("would-limit", "dry-run", "fetch of up to 1048576 bytes capped at 100")}


def test_refusals_tell_each_client_the_rule_and_its_reason(env: Env) -> None:
    frozen = admin_topic(env, f"frozen.{uuid.uuid4().hex[:6]}")
    typed = admin_topic(env, f"typed.{uuid.uuid4().hex[:6]}")
    frozen_text = "keg rule frozen-topics: frozen topics take no writes"
    typed_text = "keg rule typed-need-schema-id: record 0: lacks header(s) schema-id"

    # librdkafka: the answer it gets carries both (what an application can read of it
    # depends on the binding: docs/rules.md, "What a refused client is told").
    relay = RecordingRelay(gateway_listener(env.gateway))
    try:
        results = produce(env.client("bob", conf={"bootstrap.servers": relay.bootstrap}),
                          [(frozen, b"x"), (typed, b"y")])
    finally:
        relay.close()
    assert sorted(results) == sorted([(frozen, 44), (typed, 87)])  # POLICY_VIOLATION, INVALID
    answers = {t["Name"]: t["PartitionResponses"][0] for answer in answers_of(relay, ApiKey.PRODUCE)
               for t in answer["Responses"]}
    assert answers[frozen]["ErrorMessage"] == frozen_text
    assert answers[typed]["ErrorMessage"] == typed_text
    assert answers[typed]["RecordErrors"] == [{"BatchIndex": 0,
                                               "BatchIndexErrorMessage": typed_text}]

    # kafka-python raises with the message.
    from kafka import KafkaProducer
    producer = KafkaProducer(
        bootstrap_servers=env.gateway.bootstrap, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password=USERS["bob"],
        retries=0)
    try:
        with pytest.raises(Exception) as refused:
            producer.send(frozen, b"no").get(timeout=30)
    finally:
        producer.close(10)
    assert frozen_text in str(refused.value)

    # Kafka's Java producer prints it.
    args = ["--bootstrap-server", env.gateway.bootstrap, "--topic", typed]
    for prop in java_sasl("bob"):
        args += ["--producer-property", prop]
    done = run_java_tool("console-producer", *args, input="untyped\n")
    assert typed_text in done.stderr, done.stderr[-3000:]
    assert env.broker_count(frozen) == 0 and env.broker_count(typed) == 0
    reasons = {(e["rule_id"], e["reason"]) for e in env.audit_events()
               if e["rule_id"] in ("frozen-topics", "typed-need-schema-id")}
    assert reasons == {("frozen-topics", "frozen topics take no writes"),
                       ("typed-need-schema-id", "record 0: lacks header(s) schema-id")}


def test_an_acks_zero_refusal_is_counted_and_audited(env: Env) -> None:
    """Kafka never answers a Produce with acks=0: the producer cannot learn of a refusal,
    so the gateway must say it (even for a rule whose audit is off)."""
    quiet = admin_topic(env, f"quiet.{uuid.uuid4().hex[:6]}")
    results = produce(env.client("alice", conf={"acks": 0}), [(quiet, b"x")] * 3)
    assert results == [(quiet, 0)] * 3  # as far as the producer knows, delivered
    events = env.wait_for_audit("quiet-freeze")
    assert events, "the refusal was never audited"
    assert {(e["outcome"], e["answered"], e["error_code"], e["topic"]) for e in events} == {
        ("denied", False, TOPIC_AUTHORIZATION_FAILED, quiet)}
    assert metric(env.metrics(), "keg_unanswered_refusals_total", 'api="Produce"',
                  'rule="quiet-freeze"') >= len(events)
    assert env.broker_count(quiet) == 0


def test_compression_require_takes_librdkafkas_small_uncompressed_batches(env: Env) -> None:
    """librdkafka leaves a batch uncompressed when lz4 would not shrink it."""
    topic = admin_topic(env, f"lz4.{uuid.uuid4().hex[:6]}")
    lz4 = env.client("alice", conf={"compression.type": "lz4"})
    assert produce(lz4, [(topic, b"tiny")]) == [(topic, 0)]
    big = [(topic, json.dumps({"order": i, "note": "compressible " * 16}).encode())
           for i in range(50)]
    assert produce(lz4, big) == [(topic, 0)] * 50
    assert dumped_codecs(env.kafka, topic) == {"none", "lz4"}  # as librdkafka sent them

    plain = produce(env.client("alice", conf={"compression.type": "none"}), big)
    assert {code for _, code in plain} == {76}  # UNSUPPORTED_COMPRESSION_TYPE: too big
    assert env.broker_count(topic) == 51
    reasons = [e["reason"] for e in env.audit_events() if e["rule_id"] == "lz4-producer-hygiene"]
    assert reasons and all(r.startswith("compression none is not allowed for a batch of ")
                           and r.endswith("(uncompressed only below 1024)") for r in reasons)

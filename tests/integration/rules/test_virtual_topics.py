"""Virtual topics through the real gateway: two tenants, one client topic name.

A SASL/PLAIN broker sits behind the gateway; alice's connections live in the
namespace `tenant-a.`, bob's in `tenant-b.` (their logins choose). Both create,
produce to and consume `orders` with a consumer group `g` of two members (librdkafka
and kafka-python); the broker, read directly, holds `tenant-a.orders` and
`tenant-b.orders` with exactly each tenant's records and `tenant-a.g`/`tenant-b.g`
with their offsets. Kafka's own Java console clients work the same way. A raw
SyncGroup with the wrong protocol name is answered INCONSISTENT_GROUP_PROTOCOL by the
gateway itself.
"""

from __future__ import annotations

import base64
import socket
import struct
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError

import kafka_wire as kw
from control_plane.service import EXT_PROC_PATH, free_port
from control_plane.topology import SaslPlain
from kafka_wire import ApiKey
from kafka_wire.group_protocol import encode_subscription
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import gateway_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

USERS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret",
         "keg": "keg-secret"}
PREFIX = {"alice": "tenant-a.", "bob": "tenant-b."}
RULES = """
rules:
  - id: tenant-a
    match: {principals: {exact: [alice]}}
    action: {virtual_topics: {prefix: "tenant-a."}}
  - id: tenant-b
    match: {principals: {exact: [bob]}}
    action: {virtual_topics: {prefix: "tenant-b."}}
"""
PARTITIONS = 2
RECORDS = 10
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_TOPIC_EXCEPTION, TOPIC_ALREADY_EXISTS = 17, 36
BOB_TOPICS = {"orders", "orders848"}  # all bob ever makes


class Env:
    def __init__(self, kafka: EmbeddedKafka, gateway: Gateway, metrics_port: int,
                 base: Path) -> None:
        self.kafka, self.gateway, self.metrics_port, self.base = kafka, gateway, metrics_port, base

    def client(self, user: str, **conf: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.gateway.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": user,
                "sasl.password": USERS[user], **conf}

    def direct(self, **conf: Any) -> dict[str, Any]:
        """The broker itself, not through the gateway (the plaintext listener)."""
        return {"bootstrap.servers": self.kafka.bootstrap, **conf}

    def forwarded(self) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("keg_forwarded_requests_total"))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("virtual-topics")
    rules = base / "rules"
    rules.mkdir()
    (rules / "rules.yaml").write_text(RULES)
    metrics_port = free_port()
    with EmbeddedKafka(sasl_users=USERS) as kafka:
        settings = gateway_settings(
            kafka, base / "envoy", bootstrap_servers=kafka.sasl_bootstrap,
            sasl=SaslPlain("keg", USERS["keg"]), rules_dir=rules, metrics_port=metrics_port)
        with Gateway(settings) as gateway:
            yield Env(kafka, gateway, metrics_port, base)


# -- helpers ------------------------------------------------------------------------------


def create_topic(env: Env, user: str, topic: str = "orders") -> None:
    admin = AdminClient(env.client(user))
    futures = admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=30)
    futures[topic].result(30)


def produce(conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    producer = Producer({**conf, "linger.ms": 5})
    errors: list[Any] = []
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % PARTITIONS,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert producer.flush(60) == 0
    assert errors == []


def broker_records(env: Env, topic: str) -> list[bytes]:
    consumer = Consumer(env.direct(**{"group.id": f"check-{uuid.uuid4().hex[:6]}",
                                      "enable.auto.commit": False}))
    try:
        got: list[bytes] = []
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        assert partitions, f"{topic} is not on the broker"
        for p in sorted(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            part: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(part) < high - low and time.monotonic() < deadline:
                for msg in consumer.consume(100, 0.5):
                    assert msg.error() is None, msg.error()
                    part.append(msg.value() or b"")
            got += part
        return sorted(got)
    finally:
        consumer.close()


class TenantGroup:
    """Group `g` of one tenant: a librdkafka and a kafka-python member, polled in turn."""

    def __init__(self, env: Env, user: str) -> None:
        self.cf = Consumer(env.client(
            user, **{"group.id": "g", "client.id": f"{user}-cf", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "partition.assignment.strategy": "range",
                     "session.timeout.ms": 10000}))
        self.cf.subscribe(["orders"])
        self.kp = KafkaConsumer(
            "orders", bootstrap_servers=env.gateway.bootstrap, group_id="g",
            client_id=f"{user}-kp", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
            sasl_plain_username=user, sasl_plain_password=USERS[user],
            auto_offset_reset="earliest", enable_auto_commit=False,
            partition_assignment_strategy=[RangePartitionAssignor],
            session_timeout_ms=10000, heartbeat_interval_ms=500)
        self.got: dict[str, list[bytes]] = {"cf": [], "kp": []}

    def poll(self) -> None:
        for msg in self.cf.consume(50, 0.2):
            assert msg.error() is None, msg.error()
            assert msg.topic() == "orders"
            self.got["cf"].append(msg.value() or b"")
        for records in self.kp.poll(timeout_ms=200).values():
            for r in records:
                assert r.topic == "orders"
                self.got["kp"].append(r.value)

    def assignments(self) -> tuple[set[int], set[int]]:
        return ({tp.partition for tp in self.cf.assignment()},
                {tp.partition for tp in self.kp.assignment()})

    def commit(self) -> None:
        self.cf.commit(asynchronous=False)
        self.kp.commit()

    def close(self) -> None:
        self.cf.close()
        self.kp.close()


def poll_until(groups: list[TenantGroup], done: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, (
            f"{what}: assignments (librdkafka, kafka-python) {[g.assignments() for g in groups]}, "
            f"records {[{k: len(v) for k, v in g.got.items()} for g in groups]}")
        for g in groups:
            g.poll()


# -- the two tenants ------------------------------------------------------------------------


def test_two_tenants_share_a_client_topic_name_and_group(env: Env) -> None:
    # A topic outside every namespace: no tenant may see it.
    direct = AdminClient(env.direct())  # kept referenced until its futures resolve
    direct.create_topics([NewTopic("plain", 1, 1)])["plain"].result(30)
    for user in ("alice", "bob"):
        create_topic(env, user)
    groups = {user: TenantGroup(env, user) for user in ("alice", "bob")}
    try:
        both = list(groups.values())
        # Until the rebalance settles: a member that joined later is assigned its
        # partition while the first one may still hold both (it has not polled yet).
        poll_until(both, lambda: all(a and b and a | b == {0, 1} and not a & b
                                     for g in both for a, b in [g.assignments()]),
                   "every member got a partition of its own")
        values = {u: [f"{u}-{i}".encode() for i in range(RECORDS)] for u in groups}
        for user in groups:
            produce(env.client(user), "orders", values[user])
        poll_until(both, lambda: all(len(g.got["cf"]) + len(g.got["kp"]) >= RECORDS
                                     for g in both), "every record consumed")
        for user, g in groups.items():
            assert sorted(g.got["cf"] + g.got["kp"]) == sorted(values[user])
            assert g.got["cf"] and g.got["kp"]  # both members consumed their partition
            g.commit()
            # OffsetFetch through the gateway, from both clients.
            committed = g.cf.committed([TopicPartition("orders", p) for p in range(PARTITIONS)],
                                       timeout=20)
            assert {tp.partition: tp.offset for tp in committed} == {
                p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
            assert {p: g.kp.committed(KpTopicPartition("orders", p))
                    for p in range(PARTITIONS)} == {p: RECORDS // PARTITIONS
                                                    for p in range(PARTITIONS)}
    finally:
        for g in groups.values():
            g.close()

    # The broker, read directly: physical names, exactly each tenant's records and offsets.
    for user in groups:
        assert broker_records(env, PREFIX[user] + "orders") == sorted(values[user])
    admin = AdminClient(env.direct())
    for user in groups:
        [future] = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(PREFIX[user] + "g")]).values()
        offsets = {(tp.topic, tp.partition): tp.offset for tp in future.result(30).topic_partitions}
        assert offsets == {(PREFIX[user] + "orders", p): RECORDS // PARTITIONS
                           for p in range(PARTITIONS)}
    topics = set(admin.list_topics(timeout=10).topics)
    assert {"tenant-a.orders", "tenant-b.orders", "plain"} <= topics
    assert "orders" not in topics


def kafka_python_topics(env: Env, user: str) -> set[str]:
    """A Metadata request for every topic, as kafka-python sends it."""
    consumer = KafkaConsumer(bootstrap_servers=env.gateway.bootstrap,
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             sasl_plain_username=user, sasl_plain_password=USERS[user])
    try:
        assert consumer.partitions_for_topic("orders") == set(range(PARTITIONS))
        return set(consumer.topics())
    finally:
        consumer.close()


def test_metadata_lists_only_the_tenants_own_topics(env: Env) -> None:
    # No tenant-a.*, plain or internal topic (orders848 once the KIP-848 test made it).
    assert "orders" in kafka_python_topics(env, "bob") <= BOB_TOPICS
    assert kafka_python_topics(env, "alice") <= {"orders", "java-orders", "exists"}
    for user in ("alice", "bob"):
        admin = AdminClient(env.client(user))
        groups = admin.list_consumer_groups().result(20)
        assert {g.group_id for g in groups.valid} <= {"g", "java"}
        assert "g" in {g.group_id for g in groups.valid}


def test_librdkafka_lists_only_the_tenants_own_topics(env: Env) -> None:
    admin = AdminClient(env.client("bob", **{"socket.connection.setup.timeout.ms": 5000}))
    topics = set(admin.list_topics(timeout=10).topics)
    assert "orders" in topics <= BOB_TOPICS


def test_unknown_topic_errors_use_the_client_name(env: Env) -> None:
    consumer = Consumer(env.client("alice", **{"group.id": "probe"}))
    try:
        md = consumer.list_topics("nope", timeout=20)
        assert set(md.topics) == {"nope"}
        assert md.topics["nope"].error is not None  # UNKNOWN_TOPIC_OR_PARTITION, as `nope`
    finally:
        consumer.close()


def test_names_kafka_refuses_stay_refused_and_messages_keep_the_namespace(env: Env) -> None:
    """A tenant created the topics "", "." and ".." (the broker stored `tenant-a.`,
    `tenant-a..`, `tenant-a...`), which then broke its own kafka-topics.sh and kcat; and
    the broker's messages named the prefix (`Topic 'tenant-a.orders' already exists.`)."""
    admin = AdminClient(env.client("alice"))
    names = ["", ".", "..", "x" * 241, "bad name!"]
    futures = admin.create_topics([NewTopic(n, 1, 1) for n in names], operation_timeout=30)
    for name in names:
        error = futures[name].exception(30)
        assert error is not None and error.args[0].code() == INVALID_TOPIC_EXCEPTION, (name, error)
        assert "tenant-a." not in str(error)
    admin.create_topics([NewTopic("exists", 1, 1)])["exists"].result(30)
    again = admin.create_topics([NewTopic("exists", 1, 1)])["exists"].exception(30)
    assert again is not None and again.args[0].code() == TOPIC_ALREADY_EXISTS
    assert "'exists'" in str(again) and "tenant-a." not in str(again)
    on_broker = set(AdminClient(env.direct()).list_topics(timeout=10).topics)
    assert not {"tenant-a.", "tenant-a..", "tenant-a..."} & on_broker


# -- Kafka's Java console clients ----------------------------------------------------------


def java_config(env: Env, user: str) -> Path:
    path = env.base / f"{user}.properties"
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{user}" password="{USERS[user]}";\n')
    return path


def test_java_console_clients_through_the_namespace(env: Env) -> None:
    config = java_config(env, "alice")
    lines = [f"java-{i}" for i in range(5)]
    done = run_java_tool("console-producer", "--bootstrap-server", env.gateway.bootstrap,
                         "--topic", "java-orders", "--producer.config", str(config),
                         input="\n".join(lines) + "\n", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_java_tool("console-consumer", "--bootstrap-server", env.gateway.bootstrap,
                         "--topic", "java-orders", "--group", "java", "--from-beginning",
                         "--max-messages", str(len(lines)), "--timeout-ms", "60000",
                         "--consumer.config", str(config), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == lines
    # Auto-created through the gateway: the broker holds it in alice's namespace.
    assert sorted(broker_records(env, "tenant-a.java-orders")) == sorted(
        v.encode() for v in lines)


# -- KIP-559: INCONSISTENT_GROUP_PROTOCOL from the gateway ----------------------------------


class RawClient:
    """The kafka_wire codec over a socket: one request, one response, in order."""

    def __init__(self, address: str, client_id: str = "raw") -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.client_id = client_id
        self.cid = 0

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        self.cid += 1
        self.sock.sendall(kw.encode_request(
            kw.RequestHeader(api_key, version, self.cid, self.client_id), body))
        (size,) = struct.unpack(">i", self._read(4))
        correlation_id, response = kw.decode_response(self._read(size), api_key, version)
        assert correlation_id == self.cid
        return response

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "connection closed"
            data += chunk
        return data

    def login(self, user: str) -> None:
        assert self.call(ApiKey.SASL_HANDSHAKE, 1, {"Mechanism": "PLAIN"})["ErrorCode"] == 0
        auth = b"\0" + user.encode() + b"\0" + USERS[user].encode()
        assert self.call(ApiKey.SASL_AUTHENTICATE, 2, {"AuthBytes": auth})["ErrorCode"] == 0

    def close(self) -> None:
        self.sock.close()


def test_inconsistent_sync_group_is_answered_by_the_gateway(env: Env) -> None:
    raw = RawClient(env.gateway.bootstrap)
    try:
        raw.login("carol")  # no virtual topics for carol: the guard works without them
        group = f"raw-{uuid.uuid4().hex[:6]}"
        meta = encode_subscription("consumer", 0, {"Topics": ["plain"], "UserData": None})
        join = {"GroupId": group, "SessionTimeoutMs": 10000, "RebalanceTimeoutMs": 10000,
                "MemberId": "", "GroupInstanceId": None, "ProtocolType": "consumer",
                "Protocols": [{"Name": "range", "Metadata": meta}], "Reason": None}
        first = raw.call(ApiKey.JOIN_GROUP, 9, join)
        assert first["ErrorCode"] == 79  # MEMBER_ID_REQUIRED: join again with the id
        joined = raw.call(ApiKey.JOIN_GROUP, 9, dict(join, MemberId=first["MemberId"]))
        assert joined["ErrorCode"] == 0 and joined["ProtocolName"] == "range"
        sync = {"GroupId": group, "GenerationId": joined["GenerationId"],
                "MemberId": joined["MemberId"], "GroupInstanceId": None,
                "ProtocolType": "consumer", "ProtocolName": "roundrobin", "Assignments": []}
        before = env.forwarded()
        answer = raw.call(ApiKey.SYNC_GROUP, 5, sync)
        assert answer["ErrorCode"] == INCONSISTENT_GROUP_PROTOCOL
        after_bad = env.forwarded()
        good = raw.call(ApiKey.SYNC_GROUP, 5, dict(sync, ProtocolName="range"))
        assert good["ErrorCode"] == 0 and good["ProtocolName"] == "range"
        # The guard is the ext_proc chain's: there the broker never saw the bad one.
        # keg's native filter passes SyncGroup of a principal without virtual topics to
        # the broker, whose coordinator answers the same (KIP-559).
        if env.gateway.settings.data_path == EXT_PROC_PATH:
            assert after_bad == before  # the broker never saw it
            assert env.forwarded() > before
    finally:
        raw.close()


def test_java_consumer_with_the_kip848_protocol(env: Env) -> None:
    """ConsumerGroupHeartbeat: subscribed names go prefixed, assignments come by topic id."""
    # Its own topic and records: this test does not depend on another one's.
    create_topic(env, "bob", "orders848")
    values = [f"bob848-{i}".encode() for i in range(RECORDS)]
    produce(env.client("bob"), "orders848", values)
    config = java_config(env, "bob")
    done = run_java_tool("console-consumer", "--bootstrap-server", env.gateway.bootstrap,
                         "--topic", "orders848", "--group", "java848", "--from-beginning",
                         "--max-messages", str(RECORDS), "--timeout-ms", "60000",
                         "--consumer-property", "group.protocol=consumer",
                         "--consumer.config", str(config), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(done.stdout.split()) == sorted(v.decode() for v in values)
    admin = AdminClient(env.direct())
    groups = {g.group_id for g in admin.list_consumer_groups().result(20).valid}
    assert "tenant-b.java848" in groups and "java848" not in groups


# -- what new users met (regex subscriptions, lookups by id, error texts) -----------------


def test_librdkafka_regex_subscription_with_the_kip848_protocol(env: Env) -> None:
    """librdkafka sends a regex subscription as `(^rxa-.*)`; only a leading `^` was
    dropped, so the broker matched `tenant\\-a\\.(?:(^rxa-.*))`, which matches nothing:
    the consumer was never assigned a partition, and saw no error."""
    stem = f"rxa-{uuid.uuid4().hex[:6]}"
    topics = [f"{stem}-{i}" for i in range(2)]
    values: list[bytes] = []
    for topic in topics:
        create_topic(env, "alice", topic)
        values += [f"{topic}-{i}".encode() for i in range(RECORDS)]
        produce(env.client("alice"), topic, values[-RECORDS:])
    consumer = Consumer(env.client("alice", **{
        "group.id": f"rx-{uuid.uuid4().hex[:6]}", "group.protocol": "consumer",
        "auto.offset.reset": "earliest"}))
    consumer.subscribe([f"^{stem}-.*"])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 90
        while len(got) < len(values) and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                got.append(msg.value() or b"")
    finally:
        consumer.close()
    assert sorted(got) == sorted(values)


def test_java_admin_describes_a_topic_by_id(env: Env) -> None:
    """Kafka's Java client looks a topic up by id in Metadata with the name "" (not
    null), which was refused as an invalid name: `kafka-topics --describe --topic-id`
    failed (UnknownTopicIdException), and KIP-848 consumers never learned the names of
    the topics they were assigned."""
    create_topic(env, "alice", "byid")
    direct = AdminClient(env.direct())
    topic_id = direct.describe_topics(
        TopicCollection(["tenant-a.byid"]))["tenant-a.byid"].result(30).topic_id
    # Kafka writes ids URL-safe (`-`, `_`), where confluent-kafka's str() has `+`, `/`.
    bits = (topic_id.get_most_significant_bits() % (1 << 64)) << 64 | (
        topic_id.get_least_significant_bits() % (1 << 64))
    kafka_id = base64.urlsafe_b64encode(bits.to_bytes(16, "big")).rstrip(b"=").decode()
    done = run_java_tool("topics", "--bootstrap-server", env.gateway.bootstrap,
                         "--command-config", str(java_config(env, "alice")),
                         "--describe", "--topic-id", kafka_id, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Topic: byid" in done.stdout and "tenant-a." not in done.stdout, done.stdout


def test_error_texts_name_no_broker_topic(env: Env) -> None:
    """Produce's per-record error named the broker's topic (`... without key in topic
    partition tenant-a.comp-0`), and a topic colliding ('.' vs '_') with one outside
    the namespace was named in the refusal."""
    admin = AdminClient(env.client("alice"))
    admin.create_topics([NewTopic("comp", 1, 1, config={"cleanup.policy": "compact"})])[
        "comp"].result(30)
    producer = KafkaProducer(
        bootstrap_servers=env.gateway.bootstrap, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN", sasl_plain_username="alice",
        sasl_plain_password=USERS["alice"], retries=0)
    try:
        with pytest.raises(KafkaError) as refused:
            producer.send("comp", b"no key").get(30)
    finally:
        producer.close()
    assert "comp-0" in str(refused.value) and "tenant-a." not in str(refused.value)

    direct = AdminClient(env.direct())
    direct.create_topics([NewTopic("tenant-a_col", 1, 1)])["tenant-a_col"].result(30)
    collided = admin.create_topics([NewTopic("col", 1, 1)])["col"].exception(30)
    assert collided is not None and "collides" in str(collided), collided
    assert "tenant-a" not in str(collided), collided

"""The hand-off: keg's native filter gives the frames rules need to the real Python
service (frames mode), through the real Envoy, the real broker and real clients.

The module decides from the interest table the control plane computed for the live
rule set (ECDS); the Python chain judges or rewrites the frame; the module forwards its
answer in the frame's place. Identity comes from the module: it reads the SASL exchange
itself and hands the principal over with every frame.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from control_plane.providers import StaticRuleProvider
from control_plane.topology import SaslPlain
from filter_rules import load_rule_text
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway, GatewaySettings
from tests.integration.conftest import SASL_USERS, create_topic, deliver, share_console_consume
from tests.integration.native.conftest import consume
from tests.integration.rules.test_rules_enforcement import produce

pytestmark = pytest.mark.integration

TOPIC_AUTHORIZATION_FAILED = 29
REQUEST_TIMED_OUT = 7

RULES = """
rules:
  - id: no-secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: payments-only-alice
    match:
      apis: [Produce, Fetch]
      topics: {prefix: [payments.]}
      not: {principals: {exact: [alice]}}
    action: {deny: {}}
  - id: mask-emails
    match: {direction: response, topics: {prefix: [pii.]}}
    action: {mask: {fields: [$.email]}}
"""

# keg up's default rules are like these: nothing in them may block normal traffic.
DRY_RUNS = """
rules:
  - id: would-freeze-drafts
    mode: dry-run
    match: {apis: [Produce], topics: {prefix: [draft.]}}
    action: {deny: {}}
  - id: would-report-topic-creation
    mode: dry-run
    match: {apis: [CreateTopics]}
    action: {observe: {audit: true}}
  - id: no-secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
"""

LATER = """
  - id: freeze-later
    match: {apis: [Produce], topics: {prefix: [later.]}}
    action: {deny: {}}
"""


class Env:
    def __init__(self, kafka: EmbeddedKafka, gateway: Gateway, rules: StaticRuleProvider) -> None:
        self.kafka, self.gateway, self.rules = kafka, gateway, rules

    def client(self, user: str, mechanism: str = "PLAIN", **conf: Any) -> dict[str, Any]:
        """librdkafka settings for `user` through the gateway (`conf` with dots: **{})."""
        return {"bootstrap.servers": self.gateway.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": mechanism, "sasl.username": user,
                "sasl.password": SASL_USERS[user], **conf}

    def admin(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.kafka.sasl_bootstrap,
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": "keg", "sasl.password": SASL_USERS["keg"]}

    def topic(self, prefix: str) -> str:
        return create_topic(self.kafka.bootstrap, name=f"{prefix}{uuid.uuid4().hex[:8]}")

    def stored(self, topic: str) -> list[bytes]:
        """What the broker stored, read directly."""
        return consume({**self.admin(), "group.id": f"direct-{uuid.uuid4().hex[:6]}"}, topic)

    def envoy_stats(self, marker: str) -> dict[str, int]:
        """Envoy's counters whose name has `marker` (the admin listener's left out)."""
        assert self.gateway.envoy is not None
        stats = {}
        for line in self.gateway.envoy.admin("/stats").splitlines():
            name, _, value = line.partition(": ")
            if marker in name and "admin" not in name and value.isdigit():
                stats[name] = int(value)
        return stats


@pytest.fixture(scope="module")
def env(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("native-handoff")
    rules = StaticRuleProvider(load_rule_text(RULES, "rules.yaml"), version="1")
    settings = GatewaySettings(
        bootstrap_servers=kafka.sasl_bootstrap, listen_port_base=0,
        sasl=SaslPlain("keg", SASL_USERS["keg"]), rules_provider=rules,
        work_dir=base, ext_proc_log_level="WARNING", data_path="native", metrics_port=0)
    with Gateway(settings) as gateway:
        yield Env(kafka, gateway, rules)


def test_a_denied_topic_is_refused_by_the_python_chain(env: Env) -> None:
    secret, plain = env.topic("secret."), env.topic("plain.")
    results = produce(env.client("alice"), [(secret, b"s"), (plain, b"p")] * 3)
    assert sorted(set(results)) == sorted({(secret, TOPIC_AUTHORIZATION_FAILED), (plain, 0)})
    assert env.stored(secret) == [] and env.stored(plain) == [b"p"] * 3
    stats = env.envoy_stats("keg_kafka.handoff_requests")
    assert sum(stats.values()) > 0, "Produce requests went to the Python service"


def test_principal_rules_see_the_identity_the_module_read(env: Env) -> None:
    """The module reads PLAIN and SCRAM logins and hands the principal over; the Python
    chain never sees the SASL frames."""
    payments = env.topic("payments.")
    assert produce(env.client("alice"), [(payments, b"a")] * 2) == [(payments, 0)] * 2
    assert produce(env.client("bob", "SCRAM-SHA-256"), [(payments, b"b")]) == [
        (payments, TOPIC_AUTHORIZATION_FAILED)]
    assert env.stored(payments) == [b"a", b"a"]


def test_records_are_masked_on_their_way_to_the_consumer(env: Env) -> None:
    pii = env.topic("pii.")
    docs = [{"email": f"user{i}@example.com", "n": i} for i in range(5)]
    assert produce(env.client("alice"), [(pii, orjson.dumps(d)) for d in docs]) == [(pii, 0)] * 5
    seen = consume(env.client("carol", **{"group.id": f"g-{uuid.uuid4().hex[:6]}"}), pii, 5)
    assert [orjson.loads(v)["n"] for v in seen] == list(range(5))
    assert all(orjson.loads(v)["email"] != docs[0]["email"] for v in seen), seen
    assert [orjson.loads(v) for v in env.stored(pii)] == docs, "the broker keeps the originals"
    assert sum(env.envoy_stats("keg_kafka.handoff_responses").values()) > 0


def test_fetches_a_deny_rule_judges_do_not_bring_their_answers_back(env: Env) -> None:
    """Regression: with a consume-time record rule in the set (mask-emails), every Fetch
    the Python chain judged asked for its answer, so each answer of payments.* (which
    payments-only-alice judges) went through Python and back though no rule reads it."""
    payments = env.topic("payments.")
    assert produce(env.client("alice"), [(payments, b"a")] * 3) == [(payments, 0)] * 3
    requests = sum(env.envoy_stats("keg_kafka.handoff_requests").values())
    responses = sum(env.envoy_stats("keg_kafka.handoff_responses").values())
    settings: dict[str, Any] = {"group.id": f"g-{uuid.uuid4().hex[:6]}",
                                "fetch.wait.max.ms": 50, "auto.offset.reset": "earliest"}
    consumer = Consumer(env.client("alice", **settings))
    seen: list[bytes] = []
    try:
        consumer.assign([TopicPartition(payments, 0, 0)])
        deadline = time.monotonic() + 3  # then empty fetches, every 50 ms
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.append(msg.value() or b"")
    finally:
        consumer.close()
    assert seen == [b"a"] * 3
    requests = sum(env.envoy_stats("keg_kafka.handoff_requests").values()) - requests
    responses = sum(env.envoy_stats("keg_kafka.handoff_responses").values()) - responses
    # Every Fetch is judged (handed off); only the learners' Metadata answers come back.
    assert requests >= 10, requests
    assert responses <= 5, (requests, responses)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_every_worker_of_the_pool_knows_the_topic_ids_the_module_learned(
        kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Regression: each ext_proc worker learned topic ids only from the Metadata answers it
    saw, so a consumer whose Metadata request went to one worker and whose Fetch (v13+,
    by topic id) went to another got UNKNOWN_TOPIC_ID and backed off 500 ms (librdkafka's
    debug log says so). The module now names the ids of each frame it hands over."""
    pii = create_topic(kafka.bootstrap, name=f"pii.{uuid.uuid4().hex[:8]}")
    assert deliver(Producer({"bootstrap.servers": kafka.bootstrap}), pii, b'{"email": "a@x"}') == 0
    rules = StaticRuleProvider(load_rule_text(RULES, "rules.yaml"), version="1")
    settings = GatewaySettings(
        bootstrap_servers=kafka.bootstrap, listen_port_base=0, rules_provider=rules,
        work_dir=tmp_path_factory.mktemp("native-pool"), ext_proc_log_level="WARNING",
        data_path="native", ext_proc_workers=2)
    unknown: list[str] = []
    with Gateway(settings) as gateway:
        # Connections are spread over the two workers by hash: six consumers (a dozen
        # connections) meet both.
        for _ in range(6):
            lines = _Lines()
            logger = logging.getLogger(f"rdkafka-{uuid.uuid4().hex[:6]}")
            logger.addHandler(lines)
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
            consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "debug": "fetch",
                                 "group.id": f"g-{uuid.uuid4().hex[:6]}"}, logger=logger)
            try:
                consumer.assign([TopicPartition(pii, 0, 0)])
                value = None
                deadline = time.monotonic() + 20
                while value is None and time.monotonic() < deadline:
                    msg = consumer.poll(0.2)
                    if msg is not None and msg.error() is None:
                        value = msg.value()
            finally:
                consumer.close()
            assert value is not None and orjson.loads(value) == {"email": "****"}, value
            unknown += [line for line in lines.lines if "UNKNOWN_TOPIC_ID" in line.upper()]
    assert unknown == []


def test_a_rule_change_reaches_a_live_connection_without_draining(env: Env) -> None:
    """A new rule set reaches the module (ECDS, process-wide table) and the Python
    service (xDS) while a producer stays on its connection; no listener changes."""
    later = env.topic("later.")
    assert env.gateway.envoy is not None
    producer = Producer(env.client("alice", "PLAIN", **{"linger.ms": 0, "retries": 0}))
    assert deliver(producer, later) == 0
    connections = env.envoy_stats("downstream_cx_total")
    listeners = {k: v for k, v in env.gateway.envoy.dynamic_versions().items()
                 if k.startswith("listener/")}
    changed_at = time.monotonic()
    env.rules.set(load_rule_text(RULES + LATER, "rules.yaml"), version="2")
    attempts = 1
    while (code := deliver(producer, later)) == 0:
        attempts += 1
        assert time.monotonic() - changed_at < 30, "the new rule never reached the connection"
    enforced_after = time.monotonic() - changed_at
    assert code == TOPIC_AUTHORIZATION_FAILED
    assert env.envoy_stats("downstream_cx_total") == connections, "the same connection"
    assert {k: v for k, v in env.gateway.envoy.dynamic_versions().items()
            if k.startswith("listener/")} == listeners, "no listener changed (none drained)"
    print(f"rule change enforced on the live connection after {enforced_after * 1000:.0f} ms "
          f"({attempts} produce requests)")
    env.rules.set(load_rule_text(RULES, "rules.yaml"), version="3")


def test_without_the_service_produce_fails_closed_with_a_retriable_error(env: Env) -> None:
    """The ext_proc service goes away under a connected producer: its handed-off Produce
    requests (a topic a rule names) get REQUEST_TIMED_OUT (retriable) and nothing reaches
    the broker, while a topic no rule names passes natively; once the service is back,
    the same producer's retry goes through."""
    ruled, plain = env.topic("payments."), env.topic("plain.")
    results: list[int] = []
    producer = Producer(env.client("alice", "PLAIN", **{"linger.ms": 0, "retries": 0}))

    def send(topic: str, value: bytes) -> int:
        producer.produce(topic, value, on_delivery=lambda err, _m: results.append(
            0 if err is None else err.code()))
        producer.flush(30)
        return results[-1]

    # Connected, both topics' metadata known (alice may write payments.*).
    assert send(ruled, b"before") == 0 and send(plain, b"before") == 0
    env.gateway.stop_ext_proc()
    try:
        assert send(ruled, b"lost") == REQUEST_TIMED_OUT
        assert env.stored(ruled) == [b"before"]
        assert sum(env.envoy_stats("keg_kafka.handoff_retriable_errors").values()) > 0
        assert send(plain, b"native") == 0, "no rule names it: it never needed the service"
    finally:
        env.gateway.start_ext_proc()
        env.gateway.wait_for_rules()
    assert send(ruled, b"after") == 0
    assert env.stored(ruled) == [b"before", b"after"]
    assert env.stored(plain) == [b"before", b"native"]


def test_without_the_service_a_consumer_is_told_to_retry_and_goes_on(env: Env) -> None:
    """A Fetch a record rule needs (masking) whose hand-off fails closed closed the
    consumer's connection. Now it is answered NOT_LEADER_OR_FOLLOWER for each partition,
    without records: librdkafka refreshes its metadata and fetches again on the same
    connection, and once the service is back it reads the records, masked."""
    pii = env.topic("pii.")
    docs = [{"email": f"user{i}@example.com", "n": i} for i in range(3)]
    assert produce(env.admin(), [(pii, orjson.dumps(d)) for d in docs]) == [(pii, 0)] * 3
    disconnects: list[int] = []  # the consumer's own count, from its statistics

    def count_disconnects(stats: str) -> None:
        disconnects.append(sum(b["disconnects"] for b in orjson.loads(stats)["brokers"].values()))

    # Envoy's connection counters cannot tell a closed connection from a new one that
    # librdkafka opens later (its group coordinator's): the client's statistics can.
    settings: dict[str, Any] = {"group.id": f"g-{uuid.uuid4().hex[:6]}",
                                "statistics.interval.ms": 200, "stats_cb": count_disconnects}
    consumer = Consumer(env.client("carol", **settings))
    seen: list[bytes] = []
    errors: list[Any] = []

    def poll(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(seen) < len(docs):
            for msg in consumer.consume(10, 0.2):
                (errors.append(msg.error()) if msg.error() else seen.append(msg.value() or b""))

    try:
        assert consumer.list_topics(pii, timeout=10).topics[pii].error is None  # connected
        env.gateway.stop_ext_proc()
        try:
            retriable = sum(env.envoy_stats("keg_kafka.handoff_retriable_errors").values())
            consumer.assign([TopicPartition(pii, 0, 0)])
            poll(5)
            assert seen == [] and errors == [], (seen, errors)
            assert sum(env.envoy_stats("keg_kafka.handoff_retriable_errors").values()) > retriable
            assert disconnects and disconnects[-1] == 0, "the consumer's connections stayed open"
        finally:
            env.gateway.start_ext_proc()
            env.gateway.wait_for_rules()
        poll(60)
    finally:
        consumer.close()
    assert errors == [] and [orjson.loads(v)["n"] for v in seen] == [0, 1, 2]
    assert all(orjson.loads(v)["email"] != d["email"] for v, d in zip(seen, docs, strict=True))


def test_without_the_service_new_clients_connect_and_groups_form(env: Env) -> None:
    """Metadata, JoinGroup and SyncGroup reach the Python service only for its learners
    (topic ids, group protocols) while no rule judges them: their hand-off fails open.
    Before, with the service down, every new client's Metadata request failed closed
    (the connection closed) and no client could start, whatever the topic."""
    plain = env.topic("plain.")
    env.gateway.stop_ext_proc()
    try:
        before = sum(env.envoy_stats("keg_kafka.handoff_failed_open").values())
        producer = Producer(env.client("bob", "PLAIN", **{"linger.ms": 0}))
        assert deliver(producer, plain, b"while down") == 0
        group = f"g-{uuid.uuid4().hex[:6]}"
        consumer = Consumer(env.client("bob", "PLAIN", **{
            "group.id": group, "auto.offset.reset": "earliest"}))
        values: list[bytes] = []
        try:
            consumer.subscribe([plain])
            deadline = time.monotonic() + 60
            while not values and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    values.append(msg.value() or b"")
            assigned = consumer.assignment()
        finally:
            consumer.close()
        assert values == [b"while down"]
        assert [tp.topic for tp in assigned] == [plain], "the group formed without the service"
        assert sum(env.envoy_stats("keg_kafka.handoff_failed_open").values()) > before
        # A ruled topic still fails closed (retriable) for a new producer.
        strict = Producer(env.client("alice", "PLAIN", **{"linger.ms": 0, "retries": 0}))
        assert deliver(strict, env.topic("payments."), b"lost") == REQUEST_TIMED_OUT
    finally:
        env.gateway.start_ext_proc()
        env.gateway.wait_for_rules()


def module_interest(env: Env) -> dict[str, Any]:
    """The interest table keg's module runs (Envoy's ECDS)."""
    assert env.gateway.envoy is not None
    for config in json.loads(env.gateway.envoy.admin("/config_dump"))["configs"]:
        for entry in config.get("ecds_filters", []):
            value = entry["ecds_filter"]["typed_config"]["filter_config"]["value"]
            return dict(json.loads(value)["interest"])
    raise AssertionError("no ECDS filter in Envoy")


def test_without_the_service_dry_run_rules_refuse_nothing(env: Env) -> None:
    """A dry-run rule never changes or answers a request: with the service down, what
    only dry runs judge passes, beside an enforced rule on other topics of the same API.
    Before, a Produce to a topic a dry-run deny names got REQUEST_TIMED_OUT, and
    CreateTopics, which a dry-run observer reports, closed the admin client's connection:
    keg up's default rules stopped producers to payments.* and every admin tool while the
    service was down."""
    draft, secret = env.topic("draft."), env.topic("secret.")
    env.rules.set(load_rule_text(DRY_RUNS, "rules.yaml"), version="dry-runs")
    try:
        env.gateway.wait_for_rules()
        deadline = time.monotonic() + 30
        while "draft." not in json.dumps(module_interest(env)["requests"]):  # the new table
            assert time.monotonic() < deadline, "the module never got the dry-run rules"
            time.sleep(0.1)
        handed_off = env.gateway.module_counter("handoff_requests")
        assert produce(env.client("alice"), [(draft, b"judged")]) == [(draft, 0)]
        assert env.gateway.module_counter("handoff_requests") > handed_off  # judged
        env.gateway.stop_ext_proc()
        try:
            strict = Producer(env.client("alice", "PLAIN", **{"linger.ms": 0, "retries": 0}))
            assert deliver(strict, draft, b"while down") == 0
            assert deliver(strict, secret, b"lost") == REQUEST_TIMED_OUT  # enforced: closed
            admin = AdminClient(env.client("alice"))
            name = f"made-while-down.{uuid.uuid4().hex[:6]}"
            admin.create_topics([NewTopic(name, 1, 1)], request_timeout=20)[name].result(30)
            assert name in AdminClient(env.admin()).list_topics(timeout=10).topics
        finally:
            env.gateway.start_ext_proc()
            env.gateway.wait_for_rules()
        assert env.stored(draft) == [b"judged", b"while down"]
        assert env.stored(secret) == []
    finally:
        env.rules.set(load_rule_text(RULES, "rules.yaml"), version="4")
        env.gateway.wait_for_rules()


def test_a_share_consumer_of_an_unruled_topic_stays_in_envoy(env: Env) -> None:
    """KIP-932 share consumers read with ShareFetch: one opening its share session names
    its topics (decided by them), the next ones are judged by their answers. Before, a
    consume-time rule on any topic sent every ShareFetch of every share consumer through
    Python."""
    plain, pii = env.topic("plain."), env.topic("pii.")
    docs = [{"email": f"user{i}@example.com", "n": i} for i in range(30)]
    values = [orjson.dumps(d) for d in docs]
    for at in range(0, 30, 5):  # six batches, read five records at a time: a session
        assert produce(env.client("alice"), [(plain, v) for v in values[at:at + 5]]) == [
            (plain, 0)] * 5
    before = env.gateway.handed_off_requests("ShareFetch")
    done = share_console_consume(env.kafka, env.gateway.bootstrap, plain, 30,
                                 "--consumer-property", "max.poll.records=5")
    assert sorted(done.stdout.split()) == sorted(v.decode() for v in values), done.stderr[-2000:]
    assert env.gateway.handed_off_requests("ShareFetch") == before, \
        "no rule names the topic: no ShareFetch went to Python"
    assert env.gateway.module_counter("handoff_answer_not_selected") > 0

    # A ruled topic's records still come masked to the share consumer.
    assert produce(env.client("alice"), [(pii, v) for v in values[:5]]) == [(pii, 0)] * 5
    done = share_console_consume(env.kafka, env.gateway.bootstrap, pii, 5)
    seen = [orjson.loads(line) for line in done.stdout.split()]
    assert sorted(d["n"] for d in seen) == list(range(5)), done.stderr[-2000:]
    assert all(d["email"] != docs[d["n"]]["email"] for d in seen), seen
    assert env.gateway.handed_off_requests("ShareFetch") > before

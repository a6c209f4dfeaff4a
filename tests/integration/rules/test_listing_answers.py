"""Answers that list topics or groups the request did not name hide what a deny rule
covers, as Kafka's authorizer leaves out what the caller may not describe, and requests
naming several groups have only the denied ones refused; a refusal inside a fetch
session (KIP-227) never leaves the broker's session epoch behind; an envelope (KIP-590)
is judged as its sender's too. Through real Envoy,
the real broker and real clients (raw requests where no client sends the version, or
as Kafka's Java consumer sends them: librdkafka opens no fetch sessions)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import kafka_wire
from kafka_wire import ApiKey, ErrorCode
from kafka_wire.envelope import Principal, envelope_request_body
from kafka_wire.records import BatchHeader, Record, encode_batch
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_with_static_rules
from tests.integration.raw_kafka import RawConnection

pytestmark = pytest.mark.integration

RULES = """
rules:
  - id: deny-secret
    match: {topics: {prefix: [secret.]}}
    action: {deny: {}}
  - id: deny-locked
    match: {groups: {prefix: [locked-]}}
    action: {deny: {}}
  - id: deny-mallory
    match: {client_ids: {exact: [mallory]}}
    action: {deny: {}}
"""


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("listing"), RULES) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def secret(kafka: EmbeddedKafka) -> str:
    return create_topic(kafka.bootstrap, name=f"secret.{uuid.uuid4().hex[:6]}")


def test_metadata_v0_for_every_topic_hides_a_denied_one(kafka: EmbeddedKafka, gateway: Gateway,
                                                        secret: str) -> None:
    """Metadata v0 has no null topics: its empty list asks for every topic, and its answer
    listed the denied ones with their partitions (kcat -L with broker.version.fallback
    0.8.2); v1+ (null) hid them."""
    public = create_topic(kafka.bootstrap, name=f"public.{uuid.uuid4().hex[:6]}")
    for bootstrap, hidden in ((kafka.bootstrap, False), (gateway.bootstrap, True)):
        connection = RawConnection(bootstrap)
        try:
            for version in (0, 1, 4):
                topics: list[dict[str, str]] | None = [] if version == 0 else None
                deadline = time.monotonic() + 15  # until the new topic is in the metadata
                while True:
                    answer = connection.request(ApiKey.METADATA, version, {"Topics": topics})
                    names = {t["Name"] for t in answer["Topics"]}
                    if public in names or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                assert public in names, (bootstrap, version, names)
                assert (secret not in names) == hidden, (bootstrap, version, names)
        finally:
            connection.close()


def test_a_leader_election_of_every_partition_hides_a_denied_topic(
        kafka: EmbeddedKafka, gateway: Gateway, secret: str) -> None:
    """ElectLeaders for all partitions (null) answered with the denied topics' names, as
    the broker does for a caller allowed to see them (its results name every topic,
    with the partitions elected; librdkafka shows partitions only, so raw requests)."""
    for bootstrap, hidden in ((kafka.bootstrap, False), (gateway.bootstrap, True)):
        connection = RawConnection(bootstrap)
        try:
            for version, body in ((0, {}), (2, {"ElectionType": 0})):
                answer = connection.request(ApiKey.ELECT_LEADERS, version, {
                    **body, "TopicPartitions": None, "TimeoutMs": 10000})
                names = {r["Topic"] for r in answer["ReplicaElectionResults"]}
                assert (secret not in names) == hidden, (bootstrap, version, names)
        finally:
            connection.close()


def test_listing_groups_hides_a_denied_group(kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """ListGroups listed a denied group; Kafka's authorizer leaves out groups the caller
    may not describe, and admin tools that describe every listed group then failed on
    it (ConsumerGroupCommand --describe --all-groups: GroupAuthorizationException)."""
    topic = create_topic(kafka.bootstrap, name=f"groups.{uuid.uuid4().hex[:6]}")
    groups = {name: f"{name}-{uuid.uuid4().hex[:6]}" for name in ("locked", "open")}
    for group in groups.values():  # made directly on the broker: committed offsets
        consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        consumer.close()

    def listed(bootstrap: str) -> set[str]:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        deadline = time.monotonic() + 30
        while True:
            found = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
            if groups["open"] in found or time.monotonic() > deadline:
                return found
            time.sleep(0.5)

    assert set(groups.values()) <= listed(kafka.bootstrap)
    through = listed(gateway.bootstrap)
    assert groups["open"] in through and groups["locked"] not in through
    # ... and describing what is listed works (the open group's offsets too).
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(groups["open"])])[groups["open"]].result(30)
    assert [(tp.topic, tp.offset) for tp in offsets.topic_partitions] == [(topic, 0)]




# (API, version, body for the groups, the answer's group -> error code)
_SEVERAL_GROUPS: list[tuple[int, int, Callable[[list[str]], dict[str, Any]],
                            Callable[[dict[str, Any]], dict[str, int]]]] = [
    (ApiKey.FIND_COORDINATOR, 4, lambda gs: {"KeyType": 0, "CoordinatorKeys": gs},
     lambda a: {c["Key"]: c["ErrorCode"] for c in a["Coordinators"]}),
    (ApiKey.DESCRIBE_GROUPS, 5, lambda gs: {"Groups": gs, "IncludeAuthorizedOperations": False},
     lambda a: {g["GroupId"]: g["ErrorCode"] for g in a["Groups"]}),
    (ApiKey.OFFSET_FETCH, 9, lambda gs: {
        "Groups": [{"GroupId": g, "MemberId": None, "MemberEpoch": -1, "Topics": None}
                   for g in gs], "RequireStable": False},
     lambda a: {g["GroupId"]: g["ErrorCode"] for g in a["Groups"]}),
    (ApiKey.CONSUMER_GROUP_DESCRIBE, 0, lambda gs: {
        "GroupIds": gs, "IncludeAuthorizedOperations": False},
     lambda a: {g["GroupId"]: g["ErrorCode"] for g in a["Groups"]}),
    (ApiKey.DELETE_GROUPS, 2, lambda gs: {"GroupsNames": gs},
     lambda a: {r["GroupId"]: r["ErrorCode"] for r in a["Results"]}),
]


@pytest.mark.parametrize("api_key, version, request_for, codes", _SEVERAL_GROUPS,
                         ids=[kafka_wire.api_name(api) for api, *_ in _SEVERAL_GROUPS])
def test_a_request_naming_several_groups_is_refused_only_the_denied_ones(
        kafka: EmbeddedKafka, gateway: Gateway, api_key: int, version: int,
        request_for: Callable[[list[str]], dict[str, Any]],
        codes: Callable[[dict[str, Any]], dict[str, int]]) -> None:
    """A request naming an open and a denied group was refused whole (every group
    GROUP_AUTHORIZATION_FAILED): Kafka authorizes each group, so the open one is answered
    as the broker answers it and only the denied one is refused (Java's admin client
    batches FindCoordinator, DescribeGroups, OffsetFetch and DeleteGroups this way)."""
    topic = create_topic(kafka.bootstrap, name=f"several.{uuid.uuid4().hex[:6]}")
    open_group, locked = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("open", "locked"))
    for group in (open_group, locked):  # made on the broker, with committed offsets
        consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
        consumer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        consumer.close()
    connection = RawConnection(gateway.bootstrap)
    try:
        answer = connection.request(api_key, version, request_for([open_group, locked]))
    finally:
        connection.close()
    through = codes(answer)
    assert through[locked] == ErrorCode.GROUP_AUTHORIZATION_FAILED, answer
    assert through[open_group] == ErrorCode.NONE or (
        api_key == ApiKey.CONSUMER_GROUP_DESCRIBE  # a classic group, as the broker says
        and through[open_group] == ErrorCode.GROUP_ID_NOT_FOUND), answer
    assert len(through) == 2, answer
    if api_key == ApiKey.OFFSET_FETCH:
        group = next(g for g in answer["Groups"] if g["GroupId"] == open_group)
        assert [(t["Name"], [p["CommittedOffset"] for p in t["Partitions"]])
                for t in group["Topics"]] == [(topic, [7])], answer
    if api_key == ApiKey.DELETE_GROUPS:  # the denied group is still there
        direct = RawConnection(kafka.bootstrap)
        try:
            left = direct.request(ApiKey.DESCRIBE_GROUPS, 5, {"Groups": [open_group, locked]})
        finally:
            direct.close()
        states = {g["GroupId"]: g["GroupState"] for g in left["Groups"]}
        assert states == {open_group: "Dead", locked: "Empty"}, left


# -- fetch sessions ---------------------------------------------------------------------

FETCH_VERSION = 12  # topics by name, sessions


def fetch(connection: RawConnection, session_id: int, epoch: int,
          topics: list[str]) -> dict[str, Any]:
    return connection.request(ApiKey.FETCH, FETCH_VERSION, {
        "ReplicaId": -1, "MaxWaitMs": 100, "MinBytes": 1, "MaxBytes": 1 << 20,
        "IsolationLevel": 0, "SessionId": session_id, "SessionEpoch": epoch,
        "Topics": [{"Topic": topic, "Partitions": [
            {"Partition": 0, "CurrentLeaderEpoch": -1, "FetchOffset": 0, "LastFetchedEpoch": -1,
             "LogStartOffset": -1, "PartitionMaxBytes": 1 << 20}]} for topic in topics],
        "ForgottenTopicsData": [], "RackId": ""})


def partition_errors(answer: dict[str, Any]) -> dict[str, int]:
    return {t["Topic"]: p["ErrorCode"] for t in answer["Responses"] for p in t["Partitions"]}


def test_an_incremental_fetch_adding_only_a_denied_topic_keeps_the_session_going(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """An incremental fetch that only added a denied topic's partition was answered by
    the gateway, so its epoch never reached the broker: the session's next fetch was
    refused (INVALID_FETCH_SESSION_EPOCH) and the consumer had to start a new session.
    It goes on now, its answer refuses the denied partition, and the session keeps its
    epochs."""
    public = create_topic(kafka.bootstrap, name=f"public.{uuid.uuid4().hex[:6]}")
    secret = create_topic(kafka.bootstrap, name=f"secret.{uuid.uuid4().hex[:6]}")
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for topic in (public, secret):
        producer.produce(topic, b"a record")
    assert producer.flush(30) == 0
    connection = RawConnection(gateway.bootstrap)
    try:
        opened = fetch(connection, 0, 0, [public])
        assert opened["ErrorCode"] == ErrorCode.NONE and opened["SessionId"] != 0, opened
        assert partition_errors(opened) == {public: ErrorCode.NONE}, opened
        session = opened["SessionId"]
        added = fetch(connection, session, 1, [secret])
        assert added["ErrorCode"] == ErrorCode.NONE, added
        assert partition_errors(added)[secret] == ErrorCode.TOPIC_AUTHORIZATION_FAILED, added
        assert not any(p.get("Records") for t in added["Responses"] for p in t["Partitions"]
                       if t["Topic"] == secret), added
        following = fetch(connection, session, 2, [])
        assert following["ErrorCode"] == ErrorCode.NONE, following
        assert following["SessionId"] == session, following
    finally:
        connection.close()


# -- envelopes ------------------------------------------------------------------------------


def test_a_client_denied_by_a_rule_cannot_wrap_its_request_in_an_envelope(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """The request inside an envelope was judged alone, as the client it names, which
    is whatever the envelope's sender wrote: a client a rule refuses wrapped its Produce
    in an envelope naming another client, and it was let through to the broker. The
    envelope is refused as its sender's now (CLUSTER_AUTHORIZATION_FAILED)."""
    topic = create_topic(kafka.bootstrap, name=f"public.{uuid.uuid4().hex[:6]}")
    inner = kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 77, "someone-else", {})
    body = envelope_request_body(inner, {
        "TransactionalId": None, "Acks": -1, "TimeoutMs": 5000, "TopicData": [
            {"Name": topic, "PartitionData": [{"Index": 0, "Records": b""}]}]},
        Principal("User", "alice"), "192.0.2.9")
    connection = RawConnection(gateway.bootstrap, client_id="mallory")
    try:
        answer = connection.request(ApiKey.ENVELOPE, 0, body)
    finally:
        connection.close()
    assert answer == {"ErrorCode": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                      "ResponseData": None}, answer


# -- KIP-848 pattern subscriptions ----------------------------------------------------------


def test_a_pattern_consumer_keeps_its_membership_when_the_pattern_covers_a_denied_topic(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """The broker resolves a KIP-848 subscription's pattern, knowing no keg rule, and
    assigns a denied topic it matches; librdkafka then reports owning those partitions
    in its heartbeats, and each was refused whole (TOPIC_AUTHORIZATION_FAILED): the
    broker heard nothing more of the member and expelled it after its session timeout,
    while the client went on with its assignment (a new user's two consumers read 2,450
    records twice). The denied topic's partitions are left out of what the client reports
    and of the assignment it is given; what it subscribes to by name is judged as ever."""
    run = uuid.uuid4().hex[:8]
    allowed = create_topic(kafka.bootstrap, 2, f"public.rx{run}")
    create_topic(kafka.bootstrap, 2, f"secret.rx{run}")
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(50):
        producer.produce(allowed, str(i).encode())
    producer.flush(30)
    errors: list[str] = []
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": f"rx-{run}",
                         "group.protocol": "consumer", "auto.offset.reset": "earliest",
                         "error_cb": lambda err: errors.append(str(err))})
    seen: list[bytes] = []
    try:
        consumer.subscribe([f"^(public|secret)\\.rx{run}$"])
        deadline = time.monotonic() + 20  # a few heartbeats (5 s apart) after the assignment
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                errors.append(str(message.error()))
                continue
            seen.append(message.value() or b"")
        assignment = {tp.topic for tp in consumer.assignment()}
    finally:
        consumer.close()
    assert sorted(seen) == sorted(str(i).encode() for i in range(50))
    refused = [e for e in errors if "Heartbeat" in e]
    assert refused == [], refused
    # (a partition of the denied topic the broker assigned before the gateway could name
    # it stays in the client's view without a name: it reads nothing of it)
    assert assignment - {""} == {allowed}, assignment


# -- SaslHandshake v0 -----------------------------------------------------------------------


def test_a_sasl_handshake_v0_does_not_take_the_connection_out_of_the_rules(
        kafka: EmbeddedKafka, gateway: Gateway) -> None:
    """After a SaslHandshake v0 (the pre-1.0 clients' login: raw SASL tokens follow,
    then requests) the native module passed the rest of the connection unread, whatever
    the broker answered: on a PLAINTEXT listener, where the broker refuses the handshake
    and serves on, a client that sent one first wrote to a denied topic (found by a new
    user). The gateway answers a v0 handshake UNSUPPORTED_VERSION itself; what the
    connection sends next is judged as ever."""
    secret_topic = create_topic(kafka.bootstrap, name=f"secret.v0{uuid.uuid4().hex[:6]}")
    connection = RawConnection(gateway.bootstrap)
    try:
        answer = connection.request(ApiKey.SASL_HANDSHAKE, 0, {"Mechanism": "PLAIN"})
        assert answer["ErrorCode"] != ErrorCode.NONE, answer
        produced = connection.request(ApiKey.PRODUCE, 9, {
            "TransactionalId": None, "Acks": -1, "TimeoutMs": 10000, "TopicData": [
                {"Name": secret_topic, "PartitionData": [{"Index": 0, "Records": encode_batch(
                    BatchHeader(base_timestamp=1), [Record(0, 0, None, b"leak", [])])}]}]})
    finally:
        connection.close()
    codes = [p["ErrorCode"] for t in produced["Responses"] for p in t["PartitionResponses"]]
    assert codes == [ErrorCode.TOPIC_AUTHORIZATION_FAILED], produced

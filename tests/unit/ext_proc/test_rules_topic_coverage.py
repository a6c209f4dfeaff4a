"""A topic rule sees every topic a request can name, in every API and version.

Generated from Kafka's schemas, independently of kafka_wire's own walk: the JSON of
each request schema is scanned for fields tagged `"entityType": "topicName"`, for
topic-id fields (uuid `TopicId`), and for the config and ACL resources that name a
topic by type. For every (API key, version) that can name a topic, a request with
every field set is built, a `deny` rule on one of its topics is installed, and the
rule must trigger: the request is refused (or the topic removed from it).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from ext_proc.connection import ConnectionInfo
from ext_proc.filters.rules import RuleEngine, RulesFilter, request_entities
from ext_proc.identity import IdentityTracker
from filter_rules import CompiledRuleSet, load_rule_text
from kafka_wire import ApiKey, RequestHeader
from kafka_wire.error_responses import UnsupportedErrorResponse
from kafka_wire.topic_ids import TopicIds
from tests.unit.kafka_wire.schema_scan import has_field
from tests.unit.kafka_wire.test_codec import ALL, Builder, spec_of

CONN = ConnectionInfo(client_host="10.0.0.5", client_port=5000, gateway_address="gw:19092")
# Resource types that name a topic: ConfigResource.Type TOPIC and AclResourceType TOPIC.
TOPIC_RESOURCE_TYPE = 2
RESOURCE_TYPE_FIELDS = ("ResourceType", "ResourceTypeFilter")
RESOURCE_NAME_FIELDS = ("ResourceName", "ResourceNameFilter")


def names_topic(f: dict[str, Any]) -> bool:
    elem = f["type"].removeprefix("[]")
    return (f.get("entityType") == "topicName" or (elem == "uuid" and f["name"] == "TopicId")
            or f["name"] in RESOURCE_TYPE_FIELDS)


# Inter-broker and controller APIs included: a client could send them to the gateway.
REQUESTS = sorted({(k, v) for k, v, kind in ALL
                   if kind == "request" and has_field(k, v, "request", names_topic)})


def topic_body(api_key: int, version: int, ids: TopicIds) -> dict[str, Any]:
    """A request with every field set; resources typed TOPIC; every topic id known."""
    spec, flexible = spec_of(api_key, version, "request")
    body = Builder(version, flexible, nulls=False).struct(spec, top=True)

    def fix(value: Any) -> None:
        if isinstance(value, list):
            for item in value:
                fix(item)
        elif isinstance(value, dict):
            for field in RESOURCE_TYPE_FIELDS:
                if field in value:
                    value[field] = TOPIC_RESOURCE_TYPE
            topic_id = value.get("TopicId")
            if isinstance(topic_id, uuid.UUID):
                ids.add(topic_id, f"by-id-{topic_id.int}")
            for item in value.values():
                fix(item)

    fix(body)
    return body


def rules_filter(topic: str) -> tuple[RulesFilter, RuleEngine]:
    # A regex: the generated names carry a non-ASCII letter (an encoding check), which no
    # Kafka topic has and `exact` refuses.
    text = f"""
rules:
  - id: deny-one-topic
    match: {{topics: {{regex: [{json.dumps(re.escape(topic))}]}}}}
    action: {{deny: {{}}}}
"""
    engine = RuleEngine(CompiledRuleSet(load_rule_text(text, "t.yaml")))
    return RulesFilter(engine, IdentityTracker()), engine


def test_the_generated_list_covers_the_apis_users_hit() -> None:
    keys = {k for k, _ in REQUESTS}
    # Produce, Fetch, ListOffsets, Metadata, OffsetCommit/Fetch, CreateTopics, DeleteTopics,
    # DeleteRecords, AddPartitionsToTxn, TxnOffsetCommit, DescribeAcls, CreateAcls,
    # DeleteAcls, DescribeConfigs, AlterConfigs, CreatePartitions, ElectLeaders,
    # IncrementalAlterConfigs, AlterPartitionReassignments, OffsetDelete,
    # DescribeProducers, ConsumerGroupHeartbeat, DescribeTopicPartitions, ShareFetch,
    # ShareAcknowledge, share group offsets.
    assert {0, 1, 2, 3, 8, 9, 19, 20, 21, 24, 28, 29, 30, 31, 32, 33, 37, 43, 44, 45, 47,
            61, 68, 75, 78, 79} <= keys
    assert len(REQUESTS) > 200


@pytest.mark.parametrize(("api_key", "version"), REQUESTS)
def test_a_topic_rule_sees_every_topic_the_request_names(api_key: int, version: int) -> None:
    ids = TopicIds()
    body = topic_body(api_key, version, ids)
    named = request_entities(api_key, version, body, ids)
    assert named.topics, f"no topic found in api {api_key} v{version}"
    assert not named.unknown_topic_ids
    f, engine = rules_filter(named.topics[-1])
    engine.topic_ids = ids
    header = RequestHeader(api_key, version, 1, "coverage", {})
    assert f.wants_request(api_key, version)
    try:
        verdict = f.judge(header, body, CONN)
    except UnsupportedErrorResponse:
        return  # no error answer for this API: the connection is closed (fails closed)
    assert verdict is not None, (
        f"deny rule on {named.topics[-1]!r} did not trigger for api {api_key} v{version}")
    if api_key == ApiKey.FETCH and len(set(named.topics)) > 1:
        # Named with allowed topics: it goes on, and its answer refuses the denied one.
        assert verdict.answer is None and verdict.patch is not None
        assert_fetch_answer_refuses(verdict.patch, body, named.topics[-1], ids)
    else:
        assert verdict.answer is not None or verdict.changed


def assert_fetch_answer_refuses(patch: Any, request: dict[str, Any], denied: str,
                                ids: TopicIds) -> None:
    """The broker's answer to `request`, every partition with a record: after `patch`,
    those of `denied` hold the refusal and no offsets, the others are as they came (a
    topic the request only forgets, KIP-227, is not in the answer)."""
    answer: dict[str, Any] = {"Responses": [
        {**({"TopicId": t["TopicId"]} if t.get("TopicId") else {"Topic": t["Topic"]}),
         "Partitions": [{"PartitionIndex": p["Partition"], "ErrorCode": 0, "HighWatermark": 9,
                         "LogStartOffset": 0, "Records": b"record"}
                        for p in t["Partitions"]]}
        for t in request["Topics"]]}
    fetched = [t.get("Topic") or ids.name(t["TopicId"]) for t in answer["Responses"]]
    assert patch(answer) is (denied in fetched)
    for topic in answer["Responses"]:
        name = topic.get("Topic") or ids.name(topic["TopicId"])
        for partition in topic["Partitions"]:
            if name == denied:
                assert partition == {"PartitionIndex": partition["PartitionIndex"],
                                     "ErrorCode": 29, "HighWatermark": -1,
                                     "LogStartOffset": -1, "Records": b""}
            else:
                assert partition["ErrorCode"] == 0 and partition["Records"] == b"record"


def test_an_unknown_topic_id_is_refused_when_a_topic_rule_may_apply() -> None:
    f, _ = rules_filter("orders")
    body = {"Topics": [{"TopicId": uuid.uuid4(), "Name": None}]}  # DeleteTopics v6
    verdict = f.judge(RequestHeader(ApiKey.DELETE_TOPICS, 6, 1, "c", {}), body, CONN)
    assert verdict is not None and verdict.answer is not None
    assert verdict.answer["Responses"][0]["ErrorCode"] == 100  # UNKNOWN_TOPIC_ID


def test_describe_groups_names_groups_not_topics() -> None:
    """Item 1 of the defects: DescribeGroups' Groups is a list of group ids."""
    f, _ = rules_filter("orders")
    body = {"Groups": ["g1", "g2"], "IncludeAuthorizedOperations": False}
    assert f.judge(RequestHeader(ApiKey.DESCRIBE_GROUPS, 5, 1, "c", {}), body, CONN) is None
    named = request_entities(ApiKey.DESCRIBE_GROUPS, 5, body, TopicIds())
    assert named.groups == ["g1", "g2"] and named.topics == []


def test_a_produce_by_topic_id_is_split_by_topic_like_by_name() -> None:
    """Produce v13 names topics by id: a partial denial removes the denied id and
    answers it, the other topic goes on."""
    f, engine = rules_filter("secret.a")
    secret, public = uuid.uuid4(), uuid.uuid4()
    engine.topic_ids.add(secret, "secret.a")
    engine.topic_ids.add(public, "orders")
    body: dict[str, Any] = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"TopicId": tid, "PartitionData": [{"Index": 0, "Records": b""}]}
        for tid in (secret, public)]}
    verdict = f.judge(RequestHeader(ApiKey.PRODUCE, 13, 1, "c", {}), body, CONN)
    assert verdict is not None and verdict.changed and verdict.patch is not None
    assert [t["TopicId"] for t in body["TopicData"]] == [public]
    response: dict[str, Any] = {"Responses": [{"TopicId": public, "PartitionResponses": [
        {"Index": 0, "ErrorCode": 0, "BaseOffset": 5}]}]}
    assert verdict.patch(response)
    codes = {t["TopicId"]: t["PartitionResponses"][0]["ErrorCode"]
             for t in response["Responses"]}
    assert codes == {public: 0, secret: 29}


def test_a_metadata_by_unknown_ids_goes_on_and_its_answer_is_judged() -> None:
    """Metadata is how a client names ids (a KIP-848 consumer's assignment): refusing it
    UNKNOWN_TOPIC_ID left nothing to refresh with. It is forwarded; in the answer, a
    denied topic asked for by id is TOPIC_AUTHORIZATION_FAILED, without name or
    partitions, and the others pass as the broker answered."""
    f, _ = rules_filter("orders")
    denied, allowed = uuid.uuid4(), uuid.uuid4()
    body = {"Topics": [{"TopicId": denied, "Name": None}, {"TopicId": allowed, "Name": None}]}
    verdict = f.judge(RequestHeader(ApiKey.METADATA, 12, 1, "c", {}), body, CONN)
    assert verdict is not None and verdict.answer is None and verdict.patch is not None
    partitions = [{"ErrorCode": 0, "PartitionIndex": 0, "LeaderId": 1}]
    answer = {"Topics": [
        {"ErrorCode": 0, "Name": "orders", "TopicId": denied, "IsInternal": False,
         "Partitions": partitions},
        {"ErrorCode": 0, "Name": "invoices", "TopicId": allowed, "IsInternal": False,
         "Partitions": partitions}]}
    assert verdict.patch(answer)
    hidden, shown = answer["Topics"]
    assert (hidden["Name"], hidden["TopicId"], hidden["ErrorCode"], hidden["Partitions"]) == (
        None, denied, 29, [])
    assert shown["Name"] == "invoices" and shown["Partitions"] == partitions


@pytest.mark.parametrize(("api_key", "version", "epoch"), [
    (ApiKey.FETCH, 12, "SessionEpoch"), (ApiKey.FETCH, 16, "SessionEpoch"),
    (ApiKey.SHARE_FETCH, 1, "ShareSessionEpoch")])
def test_an_incremental_fetch_refuses_the_sessions_denied_partitions_in_its_answer(
        api_key: int, version: int, epoch: str) -> None:
    """A fetch in a session names only what changed: the answer's partitions of a denied
    topic lose their records to TOPIC_AUTHORIZATION_FAILED, the others pass; a full
    fetch (epoch 0) is judged on what it names alone."""
    f, engine = rules_filter("orders")
    denied, allowed = uuid.uuid4(), uuid.uuid4()
    engine.topic_ids.learn(ApiKey.METADATA, 12, {"Topics": [
        {"Name": "orders", "TopicId": denied, "ErrorCode": 0, "Partitions": []},
        {"Name": "invoices", "TopicId": allowed, "ErrorCode": 0, "Partitions": []}]})
    header = RequestHeader(api_key, version, 1, "c", {})
    assert f.judge(header, {epoch: 0, "Topics": []}, CONN) is None
    verdict = f.judge(header, {epoch: 3, "Topics": []}, CONN)
    assert verdict is not None and verdict.answer is None and verdict.patch is not None

    def partitions() -> list[dict[str, Any]]:
        return [{"PartitionIndex": 0, "ErrorCode": 0, "Records": b"batch",
                 "AcquiredRecords": [{"FirstOffset": 0, "LastOffset": 0, "DeliveryCount": 1}]}]

    key = "Topic" if api_key == ApiKey.FETCH and version < 13 else "TopicId"
    answer: dict[str, Any] = {"Responses": [
        {key: "orders" if key == "Topic" else denied, "Partitions": partitions()},
        {key: "invoices" if key == "Topic" else allowed, "Partitions": partitions()}]}
    assert verdict.patch(answer)
    (refused,), (passed,) = (t["Partitions"] for t in answer["Responses"])
    assert (refused["ErrorCode"], refused["Records"], refused["AcquiredRecords"]) == (29, b"", [])
    assert passed == partitions()[0]


@pytest.mark.parametrize("api_key", [ApiKey.CONSUMER_GROUP_DESCRIBE, ApiKey.SHARE_GROUP_DESCRIBE])
def test_a_described_group_using_a_denied_topic_is_refused(api_key: int) -> None:
    """Subscribed, assigned or (consumer groups) to be assigned, by name or by id: a
    group that uses a denied topic is TOPIC_AUTHORIZATION_FAILED without its members;
    one that does not is left as it came."""
    f, engine = rules_filter("secret")
    secret = uuid.uuid4()
    engine.topic_ids.add(secret, "secret")
    version = 0 if api_key == ApiKey.CONSUMER_GROUP_DESCRIBE else 1
    verdict = f.judge(RequestHeader(api_key, version, 1, "c", {}),
                      {"GroupIds": ["a", "b", "c", "d"], "IncludeAuthorizedOperations": False},
                      CONN)
    assert verdict is not None and verdict.answer is None and verdict.patch is not None

    def group(group_id: str, subscribed: list[str], assigned: uuid.UUID | None) -> dict[str, Any]:
        parts = [{"TopicId": assigned, "TopicName": "", "Partitions": [0]}] if assigned else []
        return {"ErrorCode": 0, "GroupId": group_id, "GroupState": "Stable", "Members": [
            {"MemberId": "m", "SubscribedTopicNames": subscribed,
             "Assignment": {"TopicPartitions": parts}}]}

    answer = {"Groups": [group("a", ["secret"], None), group("b", ["orders"], secret),
                         group("c", ["orders"], uuid.uuid4()), group("d", ["orders"], None)]}
    open_group = group("d", ["orders"], None)
    assert verdict.patch(answer)
    assert [(g["GroupId"], g["ErrorCode"], g["Members"]) for g in answer["Groups"][:3]] == [
        (g, 29, []) for g in ("a", "b", "c")]  # c: an id no rule could judge
    assert answer["Groups"][3] == open_group


TOPIC, CLIENT_METRICS = 2, 16  # Kafka's ConfigResource.Type


@pytest.mark.parametrize(("api_key", "request_body", "answer", "kept", "expected"), [
    (ApiKey.DESCRIBE_TRANSACTIONS, {"TransactionalIds": ["tx"]},
     {"TransactionStates": [{"TransactionalId": "tx", "Topics": [
         {"Topic": "secret", "Partitions": [0]}, {"Topic": "orders", "Partitions": [1]}]}]},
     lambda a: [t["Topic"] for t in a["TransactionStates"][0]["Topics"]], ["orders"]),
    (ApiKey.LIST_CONFIG_RESOURCES, {"ResourceTypes": []},
     {"ErrorCode": 0, "ConfigResources": [
         {"ResourceName": "secret", "ResourceType": TOPIC},
         {"ResourceName": "orders", "ResourceType": TOPIC},
         {"ResourceName": "secret", "ResourceType": CLIENT_METRICS}]},
     lambda a: [(r["ResourceName"], r["ResourceType"]) for r in a["ConfigResources"]],
     [("orders", TOPIC), ("secret", CLIENT_METRICS)]),
    (ApiKey.DESCRIBE_LOG_DIRS, {"Topics": None},
     {"Results": [{"LogDir": "/d", "Topics": [{"Name": "secret", "Partitions": []},
                                               {"Name": "orders", "Partitions": []}]}]},
     lambda a: [t["Name"] for t in a["Results"][0]["Topics"]], ["orders"]),
    (ApiKey.LIST_PARTITION_REASSIGNMENTS, {"Topics": None, "TimeoutMs": 1000},
     {"Topics": [{"Name": "secret", "Partitions": []}, {"Name": "orders", "Partitions": []}]},
     lambda a: [t["Name"] for t in a["Topics"]], ["orders"]),
])
def test_answers_listing_topics_the_request_did_not_name_leave_denied_ones_out(
        api_key: int, request_body: dict[str, Any], answer: dict[str, Any], kept: Any,
        expected: list[Any]) -> None:
    f, _ = rules_filter("secret")
    version = 1 if api_key == ApiKey.LIST_CONFIG_RESOURCES else 0
    verdict = f.judge(RequestHeader(api_key, version, 1, "c", {}), request_body, CONN)
    assert verdict is not None and verdict.answer is None and verdict.patch is not None
    assert verdict.patch(answer)
    assert kept(answer) == expected
    assert not verdict.patch(answer)  # nothing left to leave out

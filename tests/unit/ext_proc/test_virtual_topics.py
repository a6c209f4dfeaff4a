"""VirtualTopicsFilter inside a KafkaSession: the bytes the broker gets, the answers the
client gets, with the rules filter and the group protocol guard alongside."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import kafka_wire as kw
from ext_proc.connection import ConnectionInfo
from ext_proc.filters.group_protocol import GroupProtocolObserver
from ext_proc.filters.rules import RuleEngine, RulesFilter
from ext_proc.filters.virtual_topics import InvalidTopicName, Namespace, VirtualTopicsFilter
from ext_proc.identity import IdentityTracker
from ext_proc.session import KafkaSession
from filter_rules import CompiledRuleSet, load_rule_text
from filter_rules.patterns import PatternError
from kafka_wire import ApiKey, ErrorCode
from kafka_wire.group_protocol import decode_assignment, encode_assignment, encode_subscription

RULES = """
rules:
  - id: tenant-a
    match: {client_ids: {prefix: [app-a]}}
    action: {virtual_topics: {prefix: "tenant-a."}}
  - id: tenant-b-topics-only
    match: {client_ids: {prefix: [app-b]}}
    action: {virtual_topics: {prefix: "tenant-b.", groups: false, transactional_ids: false}}
  - id: tenant-c-later
    match: {client_ids: {prefix: [app]}}
    action: {virtual_topics: {prefix: "tenant-c."}}
  - id: tenant-d-dry
    mode: dry-run
    match: {client_ids: {prefix: [dry]}}
    action: {virtual_topics: {prefix: "tenant-d."}}
  - id: no-secrets
    match: {apis: [Produce, Metadata], topics: {prefix: [tenant-a.secret]}}
    action: {deny: {}}
"""
CONN = ConnectionInfo(client_host="10.0.0.5", client_port=5000, gateway_address="gw:19092")
TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION = 29, 3


class Client:
    """A session with the data path's filters, driven one request/response at a time."""

    def __init__(self, client_id: str, rules: str = RULES) -> None:
        self.engine = RuleEngine(CompiledRuleSet(load_rule_text(rules, "t.yaml")))
        self.identity = IdentityTracker()
        self.groups = GroupProtocolObserver()
        self.vt = VirtualTopicsFilter(self.engine, self.identity)
        self.session = KafkaSession(CONN, [self.groups, self.groups.guard(), self.vt,
                                           RulesFilter(self.engine, self.identity)])
        self.client_id = client_id
        self.cid = 0

    def send(self, key: int, version: int, body: dict[str, Any]) -> dict[str, Any] | None:
        """The body the broker receives, or None when the gateway answered."""
        self.cid += 1
        self.last = (key, version)
        out = self.session.from_client(kw.encode_request(
            kw.RequestHeader(key, version, self.cid, self.client_id), body))
        if not out:
            return None
        _, forwarded = kw.decode_request(out[4:])
        return forwarded

    def gateway_answer(self) -> dict[str, Any]:
        key, version = self.last
        _, body = kw.decode_response(self.session.take_client_bytes()[4:], key, version)
        return body

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """What the client gets for the broker's `body`."""
        key, version = self.last
        back = self.session.from_broker(kw.encode_response(self.cid, key, version, body))
        _, got = kw.decode_response(back[4:], key, version)
        return got


def metadata_request(*names: str) -> dict[str, Any]:
    return {"Topics": [{"TopicId": uuid.UUID(int=0), "Name": n} for n in names] or None,
            "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False}


def metadata_response(*topics: tuple[str, int]) -> dict[str, Any]:
    return {"Brokers": [{"NodeId": 1, "Host": "h", "Port": 1, "Rack": None}], "ClusterId": "c",
            "ControllerId": 1, "Topics": [
                {"ErrorCode": err, "Name": name, "TopicId": uuid.UUID(int=i + 1),
                 "IsInternal": name.startswith("__"), "Partitions": []}
                for i, (name, err) in enumerate(topics)]}


def produce(*topics: str, transactional_id: str | None = None) -> dict[str, Any]:
    return {"TransactionalId": transactional_id, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"Name": t, "PartitionData": [{"Index": 0, "Records": b""}]} for t in topics]}


def test_no_virtual_topics_rule_asks_for_nothing() -> None:
    c = Client("app-a", "rules:\n  - id: o\n    action: {observe: {}}\n")
    assert not any(c.vt.wants_request(k, v) for k in kw.known_api_keys()
                   for v in range(0, 14))


def test_names_free_apis_are_not_held() -> None:
    c = Client("app-a")
    assert not c.vt.wants_request(ApiKey.API_VERSIONS, 3)
    assert not c.vt.wants_request(ApiKey.SASL_AUTHENTICATE, 2)
    assert c.vt.wants_request(ApiKey.METADATA, 12) and c.vt.wants_request(
        9999, 0
    )  # unknown: fail closed


def test_a_connection_no_rule_matches_is_untouched() -> None:
    c = Client("other")
    body = metadata_request("orders")
    assert c.send(3, 12, body) == body
    assert c.answer(metadata_response(("orders", 0)))["Topics"][0]["Name"] == "orders"


def test_metadata_of_every_topic_lists_only_the_tenants() -> None:
    c = Client("app-a-1")
    assert c.send(3, 12, metadata_request())["Topics"] is None  # type: ignore[index]
    got = c.answer(metadata_response(("tenant-a.orders", 0), ("tenant-b.orders", 0),
                                     ("__consumer_offsets", 0), ("orders", 0)))
    assert [t["Name"] for t in got["Topics"]] == ["orders"]


def test_named_topics_go_prefixed_and_errors_come_back_in_client_names() -> None:
    c = Client("app-a-1")
    sent = c.send(3, 12, metadata_request("orders", "nope", "tenant-a.x"))
    assert sent is not None
    assert [t["Name"] for t in sent["Topics"]] == [
        "tenant-a.orders", "tenant-a.nope", "tenant-a.tenant-a.x"]
    got = c.answer(metadata_response(("tenant-a.orders", 0),
                                     ("tenant-a.nope", UNKNOWN_TOPIC_OR_PARTITION)))
    assert [(t["Name"], t["ErrorCode"]) for t in got["Topics"]] == [
        ("orders", 0), ("nope", UNKNOWN_TOPIC_OR_PARTITION)]


def test_the_first_matching_rule_decides() -> None:
    c = Client("app-b-1")  # matches tenant-b and tenant-c; tenant-b comes first
    sent = c.send(0, 9, produce("orders", transactional_id="tx"))
    assert sent is not None
    assert sent["TopicData"][0]["Name"] == "tenant-b.orders"
    assert sent["TransactionalId"] == "tx"  # tenant-b keeps its transactional ids


def test_dry_run_rules_rename_nothing() -> None:
    c = Client("dry-1")
    body = produce("orders")
    assert c.send(0, 9, body) == body


def test_groups_and_transactional_ids_are_prefixed_when_enabled() -> None:
    c = Client("app-a-1")
    sent = c.send(8, 8, {"GroupId": "g", "GenerationIdOrMemberEpoch": 1, "MemberId": "m",
                         "GroupInstanceId": None, "RetentionTimeMs": -1,
                         "Topics": [{"Name": "orders", "Partitions": []}]})
    assert sent is not None and sent["GroupId"] == "tenant-a.g"
    assert sent["Topics"][0]["Name"] == "tenant-a.orders"
    c2 = Client("app-b-1")
    sent = c2.send(8, 8, {"GroupId": "g", "GenerationIdOrMemberEpoch": 1, "MemberId": "m",
                          "GroupInstanceId": None, "RetentionTimeMs": -1, "Topics": []})
    assert sent is not None and sent["GroupId"] == "g"


def test_list_groups_shows_only_the_tenants_groups() -> None:
    c = Client("app-a-1")
    c.send(16, 4, {"StatesFilter": []})
    got = c.answer({"ThrottleTimeMs": 0, "ErrorCode": 0, "Groups": [
        {"GroupId": g, "ProtocolType": "consumer", "GroupState": "Stable"}
        for g in ("tenant-a.g1", "tenant-b.g1", "g2")]})
    assert [g["GroupId"] for g in got["Groups"]] == ["g1"]


def test_a_later_filters_deny_is_renamed_back_too() -> None:
    c = Client("app-a-1")
    assert c.send(0, 9, produce("secret")) is None  # no-secrets denies tenant-a.secret
    answer = c.gateway_answer()
    assert [(t["Name"], t["PartitionResponses"][0]["ErrorCode"]) for t in answer["Responses"]] \
        == [("secret", TOPIC_AUTHORIZATION_FAILED)]


def test_a_partial_deny_merges_error_entries_in_client_names() -> None:
    c = Client("app-a-1")
    sent = c.send(0, 9, produce("secret", "orders"))
    assert sent is not None and [t["Name"] for t in sent["TopicData"]] == ["tenant-a.orders"]
    got = c.answer({"Responses": [{"Name": "tenant-a.orders", "PartitionResponses": [
        {"Index": 0, "ErrorCode": 0, "BaseOffset": 5}]}]})
    assert sorted((t["Name"], t["PartitionResponses"][0]["ErrorCode"])
                  for t in got["Responses"]) == [("orders", 0),
                                                 ("secret", TOPIC_AUTHORIZATION_FAILED)]


def test_principal_from_sasl_selects_the_namespace() -> None:
    rules = """
rules:
  - id: alice
    match: {principals: {exact: [alice]}}
    action: {virtual_topics: {prefix: "tenant-a."}}
"""
    c = Client("any", rules)
    body = produce("orders")
    assert c.send(0, 9, body) == body  # not authenticated yet
    c.identity.observe_request(ApiKey.SASL_HANDSHAKE, 1, {"Mechanism": "PLAIN"})
    c.identity.observe_response(ApiKey.SASL_HANDSHAKE, 1, {"ErrorCode": 0, "Mechanisms": ["PLAIN"]})
    c.identity.observe_request(ApiKey.SASL_AUTHENTICATE, 2, {"AuthBytes": b"\0alice\0pw"})
    c.identity.observe_response(ApiKey.SASL_AUTHENTICATE, 2, {"ErrorCode": 0, "ErrorMessage": None,
                                        "AuthBytes": b"", "SessionLifetimeMs": 0})
    sent = c.send(0, 9, produce("orders"))
    assert sent is not None and sent["TopicData"][0]["Name"] == "tenant-a.orders"


# -- group payloads (KIP-559) -------------------------------------------------------------


def sub(*topics: str) -> bytes:
    return encode_subscription("consumer", 1, {
        "Topics": list(topics), "UserData": None,
        "OwnedPartitions": [{"Topic": t, "Partitions": [0]} for t in topics]})


def assign(*topics: str) -> bytes:
    return encode_assignment("consumer", 1, {
        "AssignedPartitions": [{"Topic": t, "Partitions": [0]} for t in topics],
        "UserData": None})


def join_request(version: int) -> dict[str, Any]:
    return {"GroupId": "g", "SessionTimeoutMs": 10000, "RebalanceTimeoutMs": 10000,
            "MemberId": "", "GroupInstanceId": None, "ProtocolType": "consumer",
            "Protocols": [{"Name": "range", "Metadata": sub("orders")}], "Reason": None}


def join_response(version: int, metadata: bytes) -> dict[str, Any]:
    return {"ThrottleTimeMs": 0, "ErrorCode": 0, "GenerationId": 1, "ProtocolType": "consumer",
            "ProtocolName": "range", "Leader": "m1", "SkipAssignment": False, "MemberId": "m1",
            "Members": [{"MemberId": "m1", "GroupInstanceId": None, "Metadata": metadata}]}


@pytest.mark.parametrize(("join_v", "sync_v"), [(5, 3), (7, 5), (9, 5)])
def test_join_and_sync_payloads_are_renamed_both_ways(join_v: int, sync_v: int) -> None:
    c = Client("app-a-1")
    sent = c.send(11, join_v, join_request(join_v))
    assert sent is not None and sent["GroupId"] == "tenant-a.g"
    assert sent["Protocols"][0]["Metadata"] == sub("tenant-a.orders")
    got = c.answer(join_response(join_v, sub("tenant-a.orders")))
    assert got["Members"][0]["Metadata"] == sub("orders")
    sync = {"GroupId": "g", "GenerationId": 1, "MemberId": "m1", "GroupInstanceId": None,
            "ProtocolType": "consumer", "ProtocolName": "range",
            "Assignments": [{"MemberId": "m1", "Assignment": assign("orders")}]}
    sent = c.send(14, sync_v, sync)  # below v5: the protocol type from the JoinGroup
    assert sent is not None
    fields = decode_assignment("consumer", sent["Assignments"][0]["Assignment"]).fields
    assert fields["AssignedPartitions"][0]["Topic"] == "tenant-a.orders"
    got = c.answer({"ThrottleTimeMs": 0, "ErrorCode": 0, "ProtocolType": "consumer",
                    "ProtocolName": "range", "Assignment": assign("tenant-a.orders")})
    assert got["Assignment"] == assign("orders")


def test_inconsistent_sync_group_is_answered_by_the_gateway_without_rules() -> None:
    c = Client("plain", "rules: []\n")
    c.send(11, 9, join_request(9))
    c.answer(join_response(9, sub("orders")))
    bad = {"GroupId": "g", "GenerationId": 1, "MemberId": "m1", "GroupInstanceId": None,
           "ProtocolType": "consumer", "ProtocolName": "roundrobin", "Assignments": []}
    assert c.send(14, 5, bad) is None
    answer = c.gateway_answer()
    assert answer["ErrorCode"] == 23 and answer["Assignment"] == b""
    good = dict(bad, ProtocolName="range")
    assert c.send(14, 5, good) is not None  # forwarded, and its answer is matched to it
    got = c.answer({"ThrottleTimeMs": 0, "ErrorCode": 0, "ProtocolType": "consumer",
                    "ProtocolName": "range", "Assignment": assign("orders")})
    assert got["Assignment"] == assign("orders")
    assert c.groups.tracker.counters.errors == 0


def test_sync_group_of_a_group_never_joined_here_is_forwarded() -> None:
    c = Client("plain", "rules: []\n")
    body = {"GroupId": "g", "GenerationId": 1, "MemberId": "m1", "GroupInstanceId": None,
            "ProtocolType": "consumer", "ProtocolName": "roundrobin", "Assignments": []}
    assert c.send(14, 5, body) == body


# -- regular expressions and refusals ------------------------------------------------------


def heartbeat(regex: str | None) -> dict[str, Any]:
    return {"GroupId": "g", "MemberId": "m", "MemberEpoch": 0, "InstanceId": None,
            "RackId": None, "RebalanceTimeoutMs": -1, "SubscribedTopicNames": ["orders"],
            "SubscribedTopicRegex": regex, "ServerAssignor": None, "TopicPartitions": None}


def test_regex_subscriptions_are_anchored_in_the_namespace() -> None:
    c = Client("app-a-1")
    sent = c.send(68, 1, heartbeat("^ord.*"))
    assert sent is not None
    assert sent["SubscribedTopicRegex"] == r"tenant\-a\.(?:ord.*)"
    assert sent["SubscribedTopicNames"] == ["tenant-a.orders"] and sent["GroupId"] == "tenant-a.g"


@pytest.mark.parametrize("regex", ["ord)|(.*", "(", r"\Qabc"])
def test_regexes_that_could_escape_are_refused(regex: str) -> None:
    c = Client("app-a-1")
    assert c.send(68, 1, heartbeat(regex)) is None
    answer = c.gateway_answer()
    assert answer["ErrorCode"] == ErrorCode.INVALID_REGULAR_EXPRESSION
    assert "virtual topics" in answer["ErrorMessage"]


def test_namespace_anchor_roundtrip() -> None:
    ns = Namespace("tenant-a.")
    assert ns.unanchor(ns.anchor("a|b")) == "a|b"
    assert ns.unanchor("other") is None
    with pytest.raises(PatternError):
        ns.anchor("a)|(b")


def test_consumer_group_describe_shows_client_names() -> None:
    c = Client("app-a-1")
    c.send(69, 0, {"GroupIds": ["g"], "IncludeAuthorizedOperations": False})
    member: dict[str, Any] = {"MemberId": "m", "InstanceId": None, "RackId": None, "MemberEpoch": 1,
              "ClientId": "c", "ClientHost": "h", "SubscribedTopicNames": ["tenant-a.orders"],
              "SubscribedTopicRegex": r"tenant\-a\.(?:ord.*)",
              "Assignment": {"TopicPartitions": [
                  {"TopicId": uuid.UUID(int=5), "TopicName": "tenant-a.orders",
                   "Partitions": [0]}]},
              "TargetAssignment": {"TopicPartitions": []}}
    got = c.answer({"ThrottleTimeMs": 0, "Groups": [
        {"ErrorCode": 0, "ErrorMessage": None, "GroupId": "tenant-a.g", "GroupState": "Stable",
         "GroupEpoch": 1, "AssignmentEpoch": 1, "AssignorName": "uniform", "Members": [member],
         "AuthorizedOperations": -2147483648}]})
    m = got["Groups"][0]["Members"][0]
    assert got["Groups"][0]["GroupId"] == "g"
    assert m["SubscribedTopicNames"] == ["orders"] and m["SubscribedTopicRegex"] == "ord.*"
    assert m["Assignment"]["TopicPartitions"][0]["TopicName"] == "orders"


def test_unconfinable_acl_deletion_is_answered_invalid_request() -> None:
    c = Client("app-a-1")
    body = {"Filters": [{"ResourceTypeFilter": 1, "ResourceNameFilter": "x",
                         "PatternTypeFilter": 3, "PrincipalFilter": None, "HostFilter": None,
                         "Operation": 1, "PermissionType": 1}]}
    assert c.send(31, 3, body) is None
    answer = c.gateway_answer()
    assert answer["FilterResults"][0]["ErrorCode"] == 42


def test_delete_topics_by_id_is_refused_by_name_is_renamed() -> None:
    c = Client("app-a-1")
    by_id = {"Topics": [{"Name": None, "TopicId": uuid.UUID(int=9)}], "TimeoutMs": 1000}
    assert c.send(20, 6, by_id) is None
    assert c.gateway_answer()["Responses"][0]["ErrorCode"] == 42
    sent = c.send(20, 6, {"Topics": [{"Name": "orders", "TopicId": uuid.UUID(int=0)}],
                          "TimeoutMs": 1000})
    assert sent is not None and sent["Topics"][0]["Name"] == "tenant-a.orders"


def test_a_tenant_names_only_its_own_topics_by_id() -> None:
    """Produce v13 and Fetch v13+ name topics by id, which are not renamed: an id must be
    one of the namespace's topics; another tenant's, or one never seen, is unknown."""
    c = Client("app-a")
    own, foreign, unseen = uuid.UUID(int=11), uuid.UUID(int=12), uuid.UUID(int=13)
    c.engine.topic_ids.add(own, "tenant-a.orders")
    c.engine.topic_ids.add(foreign, "tenant-b.orders")

    def produce_by_id(topic_id: uuid.UUID) -> dict[str, Any] | None:
        return c.send(0, 13, {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000,
                              "TopicData": [{"TopicId": topic_id, "PartitionData": [
                                  {"Index": 0, "Records": b""}]}]})

    forwarded = produce_by_id(own)
    assert forwarded is not None and forwarded["TopicData"][0]["TopicId"] == own
    c.answer({"Responses": [], "ThrottleTimeMs": 0})
    for refused in (foreign, unseen):
        assert produce_by_id(refused) is None
        (topic,) = c.gateway_answer()["Responses"]
        assert topic["PartitionResponses"][0]["ErrorCode"] == 100  # UNKNOWN_TOPIC_ID


@pytest.mark.parametrize(("name", "why"), [
    ("", "the empty string is not allowed"), (".", "'.' is not allowed"),
    ("..", "'..' is not allowed"), ("x" * 241, "longer than the max allowed length 240"),
    ("bad name!", "characters other than ASCII alphanumerics")])
def test_a_topic_name_kafka_refuses_is_refused_before_its_prefix_makes_it_valid(
        name: str, why: str) -> None:
    """`""` would become the topic `tenant-a.`, `..` the topic `tenant-a...`: created on
    the broker, they broke the tenant's own tools. Refused as Kafka refuses them, with
    the length the 9-character prefix leaves of Kafka's 249."""
    ns = Namespace("tenant-a.")
    with pytest.raises(InvalidTopicName, match=why):
        ns.check_topic(name)
    ns.check_topic("x" * 240)  # the longest a tenant may name
    ns.check_topic("orders.v2-eu_1")


def test_broker_messages_do_not_tell_a_tenant_its_prefix() -> None:
    ns = Namespace("tenant-a.")
    assert ns.strip_from_message("Topic 'tenant-a.orders' already exists.") == (
        "Topic 'orders' already exists.")
    assert ns.strip_from_message("The topic tenant-a.adm currently has 4 partition(s)") == (
        "The topic adm currently has 4 partition(s)")
    # Inside another name it stays: that name is not the tenant's.
    assert ns.strip_from_message("topic x.tenant-a.y") == "topic x.tenant-a.y"


@pytest.mark.parametrize("regex, inner", [
    ("^ord.*", "ord.*"),
    ("(^ord.*)", "(ord.*)"),  # as librdkafka sends a subscription (KIP-848)
    ("^a|^b", "a|b"),
    ("(?:^a|b)|^c", "(?:a|b)|c"),
    ("((^a))|(?P<n>^b)", "((a))|(?P<n>b)"),
    (r"(?i)^x", "(?i)x"),
    (r"\Aord", "ord"),
    (r"\b^a", r"\ba"),
    ("^*a", "(?:)*a"),
    # not where a match begins: they never matched for the client either, so they stay
    ("a^b", "a^b"),
    ("x(^a|b)", "x(^a|b)"),
    (r"\Q^\E^a", r"\Q^\E^a"),
    # not anchors
    ("[^a]b", "[^a]b"),
    ("[]^]a", "[]^]a"),
    (r"\^x", r"\^x"),
])
def test_start_anchors_are_dropped_where_a_match_begins(regex: str, inner: str) -> None:
    """librdkafka sends `(^ord.*)`: only a leading `^` was dropped, so the broker got
    `tenant\\-a\\.(?:(^ord.*))`, which matches nothing, and the consumer was never
    assigned a partition."""
    assert Namespace("tenant-a.").anchor(regex) == rf"tenant\-a\.(?:{inner})"


def test_broker_messages_quote_the_clients_pattern_and_no_foreign_topic() -> None:
    ns = Namespace("tenant-a.")
    sent = ns.anchor(r"xa\C")
    assert ns.strip_from_message(f"SubscribedTopicRegex `{sent}` is not a valid regular "
                                 "expression", {sent: r"xa\C"}) == (
        r"SubscribedTopicRegex `xa\C` is not a valid regular expression")
    # A topic a new one collides with ('.' vs '_'): outside the namespace it is not named.
    assert ns.strip_from_message("Topic 'tenant-a.col' collides with existing topic: "
                                 "tenant-a_col") == (
        "Topic 'col' collides with an existing topic")
    assert ns.strip_from_message("Topic 'tenant-a.c_l' collides with existing topic: "
                                 "tenant-a.c.l") == (
        "Topic 'c_l' collides with existing topic: c.l")


def test_every_error_message_field_loses_the_prefix() -> None:
    """Produce's per-record error (BatchIndexErrorMessage) named the broker's topic:
    `... without key in topic partition tenant-a.comp-0`."""
    c = Client("app-a-1")
    sent = c.send(0, 11, {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000,
                          "TopicData": [{"Name": "comp", "PartitionData": []}]})
    assert sent is not None and sent["TopicData"][0]["Name"] == "tenant-a.comp"
    message = "Compacted topic cannot accept message without key in topic partition "
    answer = c.answer({"Responses": [{"Name": "tenant-a.comp", "PartitionResponses": [
        {"Index": 0, "ErrorCode": 87, "BaseOffset": -1, "LogAppendTimeMs": -1,
         "LogStartOffset": -1, "ErrorMessage": message + "tenant-a.comp-0",
         "RecordErrors": [{"BatchIndex": 0,
                           "BatchIndexErrorMessage": message + "tenant-a.comp-0"}]}]}],
        "ThrottleTimeMs": 0})
    partition = answer["Responses"][0]["PartitionResponses"][0]
    assert partition["ErrorMessage"] == message + "comp-0"
    assert partition["RecordErrors"][0]["BatchIndexErrorMessage"] == message + "comp-0"


def test_a_metadata_lookup_by_id_with_an_empty_name_is_not_refused() -> None:
    """Kafka's Java client looks topics up by id with the name "" (not null): refused as
    an invalid topic name, its consumers of the KIP-848 protocol never got the names of
    their assigned topics, and describeTopics(ids) failed."""
    c = Client("app-a-1")
    topic_id = uuid.UUID(int=7)
    c.engine.topic_ids.add(topic_id, "tenant-a.cin")
    sent = c.send(3, 12, {"Topics": [{"TopicId": topic_id, "Name": ""}],
                          "AllowAutoTopicCreation": False,
                          "IncludeTopicAuthorizedOperations": False})
    assert sent is not None and sent["Topics"] == [{"TopicId": topic_id, "Name": ""}]
    answer = c.answer(metadata_response(("tenant-a.cin", 0)))
    assert [t["Name"] for t in answer["Topics"]] == ["cin"]

"""kafka_wire.entity_names: every schema-tagged name of every message, and the rest."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

import kafka_wire as kw
from kafka_wire import ApiKey
from kafka_wire.entity_names import (
    GROUP,
    TOPIC,
    TRANSACTIONAL_ID,
    EntityNameError,
    Renames,
    entity_types,
    names_entities,
    rename_entities,
    rename_group_payload,
)
from kafka_wire.group_protocol import decode_assignment, decode_subscription, encode_payload
from tests.unit.kafka_wire.test_codec import ALL, Builder, spec_of

PREFIX = "T."


def add(name: str) -> str:
    return PREFIX + name


def strip(name: str) -> str | None:
    return name[len(PREFIX):] if name.startswith(PREFIX) else None


IN: Renames = {TOPIC: add, GROUP: add, TRANSACTIONAL_ID: add}
OUT: Renames = {TOPIC: strip, GROUP: strip, TRANSACTIONAL_ID: strip}

NAMED = [(k, v, kind) for k, v, kind in ALL
         if entity_types(k, v, kind)]  # type: ignore[arg-type]


def string_diffs(before: Any, after: Any) -> list[tuple[str, str]]:
    """(old, new) for every string that differs between two same-shaped values."""
    if isinstance(before, dict):
        return [d for key in before for d in string_diffs(before[key], after.get(key))]
    if isinstance(before, list):
        assert isinstance(after, list) and len(after) == len(before)
        return [d for b, a in zip(before, after, strict=True) for d in string_diffs(b, a)]
    if isinstance(before, str) and before != after:
        return [(before, after)]
    return []


def test_the_named_messages_cover_what_tenants_use() -> None:
    keys = {k for k, _, _ in NAMED}
    assert {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19, 20, 22, 24, 25, 26, 28, 29, 30,
            31, 32, 33, 37, 42, 44, 47, 65, 66, 68, 69, 75} <= keys
    assert not names_entities(ApiKey.API_VERSIONS, 3)
    assert not names_entities(ApiKey.SASL_HANDSHAKE, 1)


@pytest.mark.parametrize("nulls", [False, True])
def test_every_named_message_renames_both_ways_and_reencodes(nulls: bool) -> None:
    renamed_somewhere = 0
    for api_key, version, kind in NAMED:
        s, flexible = spec_of(api_key, version, kind)
        body = Builder(version, flexible, nulls).struct(s, top=True)
        original = Builder(version, flexible, nulls).struct(s, top=True)  # records: no deepcopy
        where = (api_key, version, kind)
        changed = rename_entities(api_key, version, kind, body, IN)  # type: ignore[arg-type]
        diffs = string_diffs(original, body)
        assert changed == bool(diffs), where
        for old, new in diffs:
            assert new == PREFIX + old, (where, old, new)
        renamed_somewhere += bool(diffs)
        raw = kw.encode_body(api_key, version, kind, body)
        decoded, _ = kw.decode_body(api_key, version, kind, raw)
        rename_entities(api_key, version, kind, decoded, OUT)  # type: ignore[arg-type]
        assert decoded == original, where
    assert renamed_somewhere > 300


def names_in(api_key: int, version: int, body: dict[str, Any]) -> list[str]:
    """Every entity name of a response body, as the walk sees them."""
    seen: list[str] = []

    def record(name: str) -> str:
        seen.append(name)
        return name

    rename_entities(api_key, version, "response", body, dict.fromkeys(IN, record))
    return seen


def every_other_inside() -> Renames:
    """Renames putting every other name (in walk order) into the namespace."""
    count = itertools.count()

    def rename(name: str) -> str:
        return add(name) if next(count) % 2 == 0 else name

    return dict.fromkeys(IN, rename)


def test_a_response_loses_the_entries_outside_the_namespace() -> None:
    """Every other name of each response put in the namespace, then the client's view
    (OUT): the names inside come back stripped, and entries naming something outside
    are gone, the body still a valid message."""
    with_outside_names = 0
    for api_key, version, kind in NAMED:
        if kind != "response":
            continue
        s, flexible = spec_of(api_key, version, kind)
        body = Builder(version, flexible, False).struct(s, top=True)
        rename_entities(api_key, version, "response", body, every_other_inside())
        before = names_in(api_key, version, body)
        rename_entities(api_key, version, "response", body, OUT)
        after = names_in(api_key, version, body)
        kw.encode_body(api_key, version, "response", body)  # still a valid message
        where = (api_key, version, before, after)
        assert not any(name.startswith(PREFIX) for name in after), where
        assert set(after) <= {strip(n) or n for n in before}, where
        outside = {n for n in before if not n.startswith(PREFIX)}
        # FindCoordinator answers keys the client asked for; the response has no key type.
        assert not outside & set(after) or api_key == ApiKey.FIND_COORDINATOR, where
        with_outside_names += bool(outside)
    assert with_outside_names > 150, with_outside_names  # the loop is not vacuous


def metadata_response(names: list[str | None]) -> dict[str, Any]:
    return {"Brokers": [], "ClusterId": "c", "ControllerId": 1,
            "Topics": [{"ErrorCode": 0, "Name": n, "TopicId": uuid.UUID(int=i + 1),
                        "IsInternal": False, "Partitions": []} for i, n in enumerate(names)]}


def test_metadata_of_every_topic_shows_only_the_namespace_stripped() -> None:
    body = metadata_response(["T.orders", "U.orders", "__consumer_offsets", "T.", None])
    assert rename_entities(ApiKey.METADATA, 12, "response", body, OUT)
    assert [t["Name"] for t in body["Topics"]] == ["orders", "", None]
    kw.encode_body(ApiKey.METADATA, 12, "response", body)


def test_names_that_already_carry_the_prefix_are_prefixed_again() -> None:
    body: dict[str, Any] = {"Topics": [{"Name": "T.orders", "TopicId": uuid.UUID(int=0)}],
            "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False}
    rename_entities(ApiKey.METADATA, 12, "request", body, IN)
    assert body["Topics"][0]["Name"] == "T.T.orders"


def test_only_the_entity_types_given_are_renamed() -> None:
    body: dict[str, Any] = {"GroupId": "g", "GenerationIdOrMemberEpoch": 1, "MemberId": "m",
            "GroupInstanceId": None, "RetentionTimeMs": -1,
            "Topics": [{"Name": "t", "Partitions": []}]}
    rename_entities(ApiKey.OFFSET_COMMIT, 8, "request", body, {TOPIC: add})
    assert body["GroupId"] == "g" and body["Topics"][0]["Name"] == "T.t"


def test_topic_ids_pass_unchanged() -> None:
    tid = uuid.UUID(int=77)
    body: dict[str, Any] = {"Topics": [{"Name": None, "TopicId": tid}],
                            "AllowAutoTopicCreation": False,
                            "IncludeTopicAuthorizedOperations": False}
    assert not rename_entities(ApiKey.METADATA, 12, "request", body, IN)
    assert body["Topics"] == [{"Name": None, "TopicId": tid}]


# -- special cases ------------------------------------------------------------------------


def test_config_resources_of_topics_and_groups_are_renamed() -> None:
    body: dict[str, Any] = {"Resources": [
        {"ResourceType": 2, "ResourceName": "orders", "ConfigurationKeys": None},
        {"ResourceType": 4, "ResourceName": "1", "ConfigurationKeys": None},
        {"ResourceType": 32, "ResourceName": "g", "ConfigurationKeys": None},
    ], "IncludeSynonyms": False, "IncludeDocumentation": False}
    assert rename_entities(ApiKey.DESCRIBE_CONFIGS, 4, "request", body, IN)
    assert [r["ResourceName"] for r in body["Resources"]] == ["T.orders", "1", "T.g"]
    response: dict[str, Any] = {"ThrottleTimeMs": 0, "Results": [
        {"ErrorCode": 0, "ErrorMessage": None, "ResourceType": t, "ResourceName": n,
         "Configs": []} for t, n in ((2, "T.orders"), (4, "1"), (2, "U.x"))]}
    assert rename_entities(ApiKey.DESCRIBE_CONFIGS, 4, "response", response, OUT)
    assert [r["ResourceName"] for r in response["Results"]] == ["orders", "1"]
    alter: dict[str, Any] = {"Resources": [{"ResourceType": 2, "ResourceName": "t", "Configs": []}],
             "ValidateOnly": False}
    rename_entities(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", alter, IN)
    assert alter["Resources"][0]["ResourceName"] == "T.t"
    answer: dict[str, Any] = {"ThrottleTimeMs": 0, "Responses": [
        {"ErrorCode": 3, "ErrorMessage": None, "ResourceType": 2, "ResourceName": "T.t"}]}
    rename_entities(ApiKey.ALTER_CONFIGS, 2, "response", answer, OUT)
    assert answer["Responses"][0]["ResourceName"] == "t"


def acl(rtype: int, name: str, pattern: int = 3) -> dict[str, Any]:
    return {"ResourceType": rtype, "ResourceName": name, "ResourcePatternType": pattern,
            "Principal": "User:a", "Host": "*", "Operation": 3, "PermissionType": 3}


def test_acl_creations_rename_topics_groups_and_transactional_ids_only() -> None:
    body: dict[str, Any] = {"Creations": [acl(2, "orders"), acl(3, "g", 4), acl(5, "tx"),
                                          acl(4, "kafka-cluster"), acl(2, "*")]}
    rename_entities(ApiKey.CREATE_ACLS, 3, "request", body, IN)
    got = [(c["ResourceName"], c["ResourcePatternType"]) for c in body["Creations"]]
    assert got == [("T.orders", 3), ("T.g", 4), ("T.tx", 3), ("kafka-cluster", 3), ("T.", 4)]
    kw.encode_body(ApiKey.CREATE_ACLS, 3, "request", body)
    with pytest.raises(EntityNameError, match="v1"):
        rename_entities(ApiKey.CREATE_ACLS, 0, "request", {"Creations": [acl(2, "*")]}, IN)


def test_described_acls_come_back_in_the_namespace_with_the_wildcard() -> None:
    request: dict[str, Any] = {
        "ResourceTypeFilter": 2, "ResourceNameFilter": None, "PatternTypeFilter": 1,
               "PrincipalFilter": None, "HostFilter": None, "Operation": 1,
               "PermissionType": 1}
    assert not rename_entities(
        ApiKey.DESCRIBE_ACLS, 3, "request", request, IN
    )  # every name: answer filtered
    response: dict[str, Any] = {
        "ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "Resources": [
        {"ResourceType": t, "ResourceName": n, "PatternType": p, "Acls": []}
        for t, n, p in ((2, "T.orders", 3), (2, "U.orders", 3), (2, "T.", 4), (2, "*", 3),
                        (4, "kafka-cluster", 3))]}
    assert rename_entities(ApiKey.DESCRIBE_ACLS, 3, "response", response, OUT)
    assert [(r["ResourceName"], r["PatternType"]) for r in response["Resources"]] == [
        ("orders", 3), ("*", 3), ("kafka-cluster", 3)]


def test_acl_deletion_that_could_reach_other_tenants_is_refused() -> None:
    def filt(rtype: int, name: str | None, pattern: int = 3) -> dict[str, Any]:
        return {"ResourceTypeFilter": rtype, "ResourceNameFilter": name,
                "PatternTypeFilter": pattern, "PrincipalFilter": None, "HostFilter": None,
                "Operation": 1, "PermissionType": 1}

    with pytest.raises(EntityNameError, match="ANY"):
        rename_entities(ApiKey.DELETE_ACLS, 3, "request", {"Filters": [filt(1, "orders")]}, IN)
    with pytest.raises(EntityNameError, match="null name"):
        rename_entities(ApiKey.DELETE_ACLS, 3, "request", {"Filters": [filt(2, None)]}, IN)
    body: dict[str, Any] = {"Filters": [filt(2, "orders"), filt(2, "*")]}
    rename_entities(ApiKey.DELETE_ACLS, 3, "request", body, IN)
    assert [(f["ResourceNameFilter"], f["PatternTypeFilter"]) for f in body["Filters"]] == [
        ("T.orders", 3), ("T.", 4)]
    response: dict[str, Any] = {
        "ThrottleTimeMs": 0, "FilterResults": [{"ErrorCode": 0, "ErrorMessage": None,
        "MatchingAcls": [{"ErrorCode": 0, "ErrorMessage": None, **acl(2, n)} for n in
                         ("T.orders", "U.orders")]}]}
    for m in response["FilterResults"][0]["MatchingAcls"]:
        m["PatternType"] = m.pop("ResourcePatternType")
    rename_entities(ApiKey.DELETE_ACLS, 3, "response", response, OUT)
    assert [m["ResourceName"] for m in response["FilterResults"][0]["MatchingAcls"]] == [
        "orders"]


@pytest.mark.parametrize(("version", "key_type", "renames", "expected"), [
    (0, 0, IN, "T.g"), (2, 0, IN, "T.g"), (2, 1, IN, "T.g"),
    (2, 1, {TOPIC: add, GROUP: add}, "g"),  # transactional ids not renamed
])
def test_find_coordinator_key_by_key_type(version: int, key_type: int, renames: Renames,
                                          expected: str) -> None:
    body: dict[str, Any] = {"Key": "g"}
    if version >= 1:
        body["KeyType"] = key_type
    rename_entities(ApiKey.FIND_COORDINATOR, version, "request", body, renames)
    assert body["Key"] == expected


def test_find_coordinator_batched_keys_both_ways() -> None:
    body: dict[str, Any] = {"KeyType": 0, "CoordinatorKeys": ["a", "b"]}
    rename_entities(ApiKey.FIND_COORDINATOR, 4, "request", body, IN)
    assert body["CoordinatorKeys"] == ["T.a", "T.b"]
    response: dict[str, Any] = {"ThrottleTimeMs": 0, "Coordinators": [
        {"Key": k, "NodeId": 1, "Host": "h", "Port": 1, "ErrorCode": 0, "ErrorMessage": None}
        for k in ("T.a", "T.b")]}
    rename_entities(ApiKey.FIND_COORDINATOR, 4, "response", response, OUT)
    assert [c["Key"] for c in response["Coordinators"]] == ["a", "b"]


# -- group payloads (KIP-559) ------------------------------------------------------------


def subscription(topics: list[str], version: int = 1) -> bytes:
    fields: dict[str, Any] = {"Topics": topics, "UserData": b"opaque"}
    if version >= 1:
        fields["OwnedPartitions"] = [{"Topic": t, "Partitions": [0]} for t in topics]
    from kafka_wire.group_protocol import encode_subscription
    return encode_subscription("consumer", version, fields)


def assignment(topics: list[str]) -> bytes:
    from kafka_wire.group_protocol import encode_assignment
    return encode_assignment("consumer", 1, {
        "AssignedPartitions": [{"Topic": t, "Partitions": [0, 1]} for t in topics],
        "UserData": None})


def test_consumer_payloads_rename_every_topic_and_keep_user_data() -> None:
    new = rename_group_payload("consumer", "subscription", subscription(["a", "b"]), IN)
    assert new is not None
    payload = decode_subscription("consumer", new)
    assert payload.fields["Topics"] == ["T.a", "T.b"]
    assert [p["Topic"] for p in payload.fields["OwnedPartitions"]] == ["T.a", "T.b"]
    assert payload.fields["UserData"] == b"opaque"
    back = rename_group_payload("consumer", "subscription", new, OUT)
    assert back == subscription(["a", "b"])
    given = rename_group_payload("consumer", "assignment", assignment(["a"]), IN)
    assert given is not None
    assert decode_assignment("consumer", given).fields["AssignedPartitions"][0]["Topic"] == "T.a"
    v0 = rename_group_payload("consumer", "subscription", subscription(["a"], 0), IN)
    assert v0 is not None and decode_subscription("consumer", v0).fields["Topics"] == ["T.a"]


def test_payloads_left_alone_when_not_consumer_or_not_decodable() -> None:
    assert rename_group_payload("connect", "subscription", b"\x00\x00", IN) is None
    assert rename_group_payload(None, "assignment", assignment(["a"]), IN) is None
    assert rename_group_payload("consumer", "assignment", b"\x00", IN) is None
    assert rename_group_payload("consumer", "assignment", b"", IN) is None
    assert rename_group_payload("consumer", "assignment", assignment(["a"]), {GROUP: add}) is None


def test_a_newer_payload_version_keeps_its_trailing_bytes() -> None:
    raw = subscription(["a"], 3)
    future = b"\x00\x07" + raw[2:] + b"tail"
    new = rename_group_payload("consumer", "subscription", future, IN)
    assert new is not None and new.endswith(b"tail") and new.startswith(b"\x00\x07")
    assert encode_payload(decode_subscription("consumer", new)) == new


def test_describe_groups_members_payloads_are_renamed_for_consumer_groups() -> None:
    def member(meta: bytes, assign: bytes) -> dict[str, Any]:
        return {"MemberId": "m", "GroupInstanceId": None, "ClientId": "c", "ClientHost": "h",
                "MemberMetadata": meta, "MemberAssignment": assign}

    response: dict[str, Any] = {"ThrottleTimeMs": 0, "Groups": [
        {"ErrorCode": 0, "ErrorMessage": None, "GroupId": "T.g", "GroupState": "Stable",
         "ProtocolType": "consumer", "ProtocolData": "range",
         "Members": [member(subscription(["T.a"]), assignment(["T.a"]))],
         "AuthorizedOperations": -2147483648},
        {"ErrorCode": 0, "ErrorMessage": None, "GroupId": "T.c", "GroupState": "Stable",
         "ProtocolType": "connect", "ProtocolData": "sessioned",
         "Members": [member(b"\x00\x09", b"")], "AuthorizedOperations": -2147483648}]}
    assert rename_entities(ApiKey.DESCRIBE_GROUPS, 5, "response", response, OUT)
    g, c = response["Groups"]
    assert g["GroupId"] == "g" and c["GroupId"] == "c"
    assert g["Members"][0]["MemberMetadata"] == subscription(["a"])
    assert g["Members"][0]["MemberAssignment"] == assignment(["a"])
    assert c["Members"][0]["MemberMetadata"] == b"\x00\x09"
    kw.encode_body(ApiKey.DESCRIBE_GROUPS, 5, "response", response)

"""Error responses as a Kafka broker builds them, and per-topic refusals for partial denies.

`error_response` is the body a broker sends when it refuses a WHOLE request with one
error code: the shape of Apache Kafka's `AbstractRequest.getErrorResponse` for that
request class, mirroring the request where Kafka's does (every topic and partition of
a Produce, every group of a DescribeGroups, every key of a batched FindCoordinator).
The dict is ready for `encode_body(api_key, api_version, "response", body)`.

`partial_error_entries` and `remove_topics` serve the other case: some topics of a
request are refused, the rest goes on to the broker. `remove_topics` gives the
request without them; `partial_error_entries` the response's per-topic entries for
them (the shape `error_response` uses, and Kafka's for an unauthorized topic), to merge
into the broker's answer.

Everything is version-aware: a builder may name every field an API ever had, and the
result is trimmed to the fields of the response schema at that version, so a field the
version lacks is never set (the codec would refuse a non-default one).

Deliberate choices, where Kafka has more than one behaviour:

- `message` goes into every ErrorMessage field the response has (Kafka puts its
  exception's message there); None leaves them null.
- Fetch partitions carry empty records (b"", length 0) rather than null: Kafka wrote
  `MemoryRecords.EMPTY` until 2.8 and null since; every client reads both, and old
  ones expect a length.
- A Produce with acks=0 gets no response at all from Kafka: check `expects_response`.
- An ApiVersions request of a version the broker does not support is answered at v0
  (see docs/codec.md); `error_response` builds the body of whatever version it is
  given, with the ApiVersions range in ApiKeys for UNSUPPORTED_VERSION, as KIP-511 does.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kafka_wire import _catalog
from kafka_wire._schema import StructSpec
from kafka_wire.enums import ApiKey, ErrorCode
from kafka_wire.errors import KafkaWireError

Body = dict[str, Any]
TopicRef = str | uuid.UUID

ZERO_UUID: Final = uuid.UUID(int=0)
# Kafka's "authorized operations not requested" marker (Integer.MIN_VALUE).
AUTHORIZED_OPERATIONS_OMITTED: Final = -(2**31)
TOPIC_RESOURCE: Final = 2  # ConfigResource.Type.TOPIC


class UnsupportedErrorResponse(KafkaWireError):
    """No error-response builder for this API (or no per-topic split): close instead."""

    def __init__(self, api_key: int, what: str = "error response") -> None:
        self.api_key = api_key
        name = _catalog.api_name(api_key) or "unknown API"
        super().__init__(f"no {what} builder for {name} (api key {api_key})")


@dataclass(frozen=True, slots=True)
class _Ctx:
    version: int
    error: int
    message: str | None
    throttle: int
    per_topic: bool = False  # the refusal is about the topics, not the request


# --- helpers -------------------------------------------------------------------------


def _topic_id(entry: Mapping[str, Any], field: str = "TopicId") -> uuid.UUID:
    value = entry.get(field)
    if value is None:
        return ZERO_UUID
    if isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(bytes=bytes(value))


def _list(container: Mapping[str, Any], field: str) -> list[Any]:
    """The array `field` of a request struct; a missing or null array is empty."""
    return list(container.get(field) or ())


def _fit(struct: StructSpec, version: int, value: Mapping[str, Any]) -> Body:
    """`value` keeping only the fields `struct` has at `version`, recursively.

    Builders name the fields of every version of both schema sets (Produce's TopicId
    is only in the newer file), so keys `struct` lacks are dropped, not refused.
    """
    out: Body = {}
    for f in struct.fields:
        if f.name not in value or not f.present(version):
            continue
        v = value[f.name]
        if f.struct is not None and v is not None:
            if f.is_array:
                v = [_fit(f.struct, version, e) for e in v]
            else:
                v = _fit(f.struct, version, v)
        out[f.name] = v
    return out


def _fit_response(api_key: int, version: int, body: Mapping[str, Any]) -> Body:
    spec = _catalog.message_file(api_key, version, "response").spec()
    return _fit(spec.struct, version, body)


def _top(c: _Ctx, **fields: Any) -> Body:
    """A top-level-only error body: ThrottleTimeMs, ErrorCode, ErrorMessage plus `fields`."""
    return {"ThrottleTimeMs": c.throttle, "ErrorCode": c.error, "ErrorMessage": c.message, **fields}


# --- per-topic entries: one response entry for one request topic entry -------------


def _produce_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Name": t.get("Name", ""),
        "TopicId": _topic_id(t),
        "PartitionResponses": [
            {
                "Index": p.get("Index", 0),
                "ErrorCode": c.error,
                "BaseOffset": -1,
                "LogAppendTimeMs": -1,
                "LogStartOffset": -1,
                "RecordErrors": [],
                "ErrorMessage": c.message,
            }
            for p in _list(t, "PartitionData")
        ],
    }


def _fetch_partition(c: _Ctx, index: int) -> Body:
    # FetchResponse.partitionResponse: HighWatermark -1, the rest at their -1 defaults.
    return {
        "PartitionIndex": index,
        "ErrorCode": c.error,
        "HighWatermark": -1,
        "LastStableOffset": -1,
        "LogStartOffset": -1,
        "PreferredReadReplica": -1,
        "Records": b"",
    }


def _fetch_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Topic": t.get("Topic", ""),
        "TopicId": _topic_id(t),
        "Partitions": [_fetch_partition(c, p.get("Partition", 0)) for p in _list(t, "Partitions")],
    }


def _list_offsets_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Name": t.get("Name", ""),
        "Partitions": [
            {
                "PartitionIndex": p.get("PartitionIndex", 0),
                "ErrorCode": c.error,
                "OldStyleOffsets": [],
                "Timestamp": -1,
                "Offset": -1,
                "LeaderEpoch": -1,
            }
            for p in _list(t, "Partitions")
        ],
    }


def _metadata_topic(c: _Ctx, t: Body) -> Body:
    # The response's Name is not nullable before v12: Kafka writes "" for a topic
    # asked by id.
    return {
        "Name": t.get("Name") or "",
        "TopicId": _topic_id(t),
        "ErrorCode": c.error,
        "IsInternal": False,
        "Partitions": [],
        "TopicAuthorizedOperations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _indexed_partitions(c: _Ctx, t: Body, field: str = "Partitions", key: str = "PartitionIndex",
                        out_key: str = "PartitionIndex", **extra: Any) -> list[Body]:
    return [{out_key: p.get(key, 0), "ErrorCode": c.error, **extra} for p in _list(t, field)]


def _offset_commit_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Name": t.get("Name", ""),
        "TopicId": _topic_id(t),
        "Partitions": _indexed_partitions(c, t),
    }


def _offset_fetch_topic(c: _Ctx, t: Body) -> Body:
    # OffsetFetchResponse.UNAUTHORIZED_PARTITION: offset -1, no epoch, metadata "".
    return {
        "Name": t.get("Name", ""),
        "Partitions": [
            {
                "PartitionIndex": i,
                "CommittedOffset": -1,
                "CommittedLeaderEpoch": -1,
                "Metadata": "",
                "ErrorCode": c.error,
            }
            for i in _list(t, "PartitionIndexes")
        ],
    }


def _offset_fetch_topics(c: _Ctx, t: Body) -> Body:
    """v8+: the topics of a group, by name or (v10) by id."""
    return {**_offset_fetch_topic(c, t), "TopicId": _topic_id(t)}


def _offset_fetch_group(c: _Ctx, g: Body, topics: list[Body]) -> Body:
    return {"GroupId": g.get("GroupId", ""), "Topics": topics, "ErrorCode": 0}


def _create_topics_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Name": t.get("Name", ""),
        "TopicId": ZERO_UUID,
        "ErrorCode": c.error,
        "ErrorMessage": c.message,
        "NumPartitions": -1,
        "ReplicationFactor": -1,
    }


def _delete_topics_topic(c: _Ctx, t: Any) -> Body:
    if isinstance(t, str):  # v0-5: TopicNames
        return {"Name": t, "ErrorCode": c.error, "ErrorMessage": c.message}
    return {
        "Name": t.get("Name"),
        "TopicId": _topic_id(t),
        "ErrorCode": c.error,
        "ErrorMessage": c.message,
    }


def _delete_records_topic(c: _Ctx, t: Body) -> Body:
    return {"Name": t.get("Name", ""), "Partitions": _indexed_partitions(c, t, LowWatermark=-1)}


def _offset_for_leader_epoch_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Topic": t.get("Topic", ""),
        "Partitions": _indexed_partitions(
            c, t, key="Partition", out_key="Partition", LeaderEpoch=-1, EndOffset=-1
        ),
    }


def _add_partitions_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Name": t.get("Name", ""),
        "ResultsByPartition": [
            {"PartitionIndex": i, "PartitionErrorCode": c.error} for i in _list(t, "Partitions")
        ],
    }


def _add_partitions_txn(c: _Ctx, tx: Body, topics: list[Body]) -> Body:
    return {"TransactionalId": tx.get("TransactionalId", ""), "TopicResults": topics}


def _txn_offset_commit_topic(c: _Ctx, t: Body) -> Body:
    return {"Name": t.get("Name", ""), "Partitions": _indexed_partitions(c, t)}


def _config_resource(c: _Ctx, r: Body) -> Body:
    return {
        "ErrorCode": c.error,
        "ErrorMessage": c.message,
        "ResourceType": r.get("ResourceType", 0),
        "ResourceName": r.get("ResourceName", ""),
    }


def _describe_configs_resource(c: _Ctx, r: Body) -> Body:
    return {**_config_resource(c, r), "Configs": []}


def _create_partitions_topic(c: _Ctx, t: Body) -> Body:
    return {"Name": t.get("Name", ""), "ErrorCode": c.error, "ErrorMessage": c.message}


def _offset_delete_topic(c: _Ctx, t: Body) -> Body:
    return {"Name": t.get("Name", ""), "Partitions": _indexed_partitions(c, t)}


def _elect_leaders_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Topic": t.get("Topic", ""),
        "PartitionResult": [
            {"PartitionId": i, "ErrorCode": c.error, "ErrorMessage": c.message}
            for i in _list(t, "Partitions")
        ],
    }


def _reassignment_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Name": t.get("Name", ""),
        "Partitions": _indexed_partitions(c, t, ErrorMessage=c.message),
    }


def _describe_producers_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Name": t.get("Name", ""),
        "Partitions": [
            {
                "PartitionIndex": i,
                "ErrorCode": c.error,
                "ErrorMessage": c.message,
                "ActiveProducers": [],
            }
            for i in _list(t, "PartitionIndexes")
        ],
    }


def _describe_topic_partitions_topic(c: _Ctx, t: Body) -> Body:
    return {
        "Name": t.get("Name", ""),
        "TopicId": ZERO_UUID,
        "ErrorCode": c.error,
        "IsInternal": False,
        "Partitions": [],
        "TopicAuthorizedOperations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _share_offsets_partition(c: _Ctx, index: Any) -> Body:
    return {"PartitionIndex": index, "StartOffset": -1, "LeaderEpoch": -1,
            "ErrorCode": c.error, "ErrorMessage": c.message}


def _describe_share_offsets_topic(c: _Ctx, t: Body) -> Body:
    return {"TopicName": t.get("TopicName", ""), "TopicId": ZERO_UUID,
            "Partitions": [_share_offsets_partition(c, p) for p in _list(t, "Partitions")]}


def _share_offsets_group(c: _Ctx, g: Body, topics: list[Body]) -> Body:
    return {"GroupId": g.get("GroupId", ""), "Topics": topics, "ErrorCode": 0,
            "ErrorMessage": None}


def _alter_share_offsets_topic(c: _Ctx, t: Body) -> Body:
    return {"TopicName": t.get("TopicName", ""), "TopicId": ZERO_UUID,
            "Partitions": [{"PartitionIndex": p.get("PartitionIndex", 0),
                            "ErrorCode": c.error, "ErrorMessage": c.message}
                           for p in _list(t, "Partitions")]}


def _delete_share_offsets_topic(c: _Ctx, t: Body) -> Body:
    return {"TopicName": t.get("TopicName", ""), "TopicId": ZERO_UUID,
            "ErrorCode": c.error, "ErrorMessage": c.message}


# --- where the topics are, per API and version ---------------------------------------

# (name, topic id) of one request topic entry; None where the entry has no such key.
TopicKey = tuple[str | None, uuid.UUID | None]


def _named(field: str) -> Callable[[Any], TopicKey]:
    def key(entry: Any) -> TopicKey:
        return entry.get(field), None

    return key


def _named_or_id(field: str) -> Callable[[Any], TopicKey]:
    def key(entry: Any) -> TopicKey:
        tid = _topic_id(entry)
        return entry.get(field), (None if tid == ZERO_UUID else tid)

    return key


def _plain_name(entry: Any) -> TopicKey:
    return entry, None


def _topic_resource(entry: Any) -> TopicKey:
    if entry.get("ResourceType") != TOPIC_RESOURCE:
        return None, None
    return entry.get("ResourceName"), None


@dataclass(frozen=True, slots=True)
class _Outer:
    """Topics nested one level down: in groups (OffsetFetch v8+), transactions (...)."""

    request: str  # request field holding the containers
    response: str  # response field holding the per-container results
    wrap: Callable[[_Ctx, Body, list[Body]], Body]
    key: str  # the field naming a container (the same in request and response)


@dataclass(frozen=True, slots=True)
class _Topics:
    request: str  # request field (of the body, or of each container) holding the topics
    response: str  # response field holding the per-topic entries
    entry: Callable[[_Ctx, Any], Body]
    key: Callable[[Any], TopicKey]
    outer: _Outer | None = None


# Where each API's request and response keep their topics (newest layout).
_TOPICS: Final[Mapping[int, _Topics]] = {
    ApiKey.PRODUCE: _Topics("TopicData", "Responses", _produce_topic, _named_or_id("Name")),
    ApiKey.FETCH: _Topics("Topics", "Responses", _fetch_topic, _named_or_id("Topic")),
    ApiKey.LIST_OFFSETS: _Topics("Topics", "Topics", _list_offsets_topic, _named("Name")),
    ApiKey.METADATA: _Topics("Topics", "Topics", _metadata_topic, _named_or_id("Name")),
    ApiKey.OFFSET_COMMIT: _Topics(
        "Topics", "Topics", _offset_commit_topic, _named_or_id("Name")),
    ApiKey.OFFSET_FETCH: _Topics(
        "Topics", "Topics", _offset_fetch_topics, _named_or_id("Name"),
        _Outer("Groups", "Groups", _offset_fetch_group, "GroupId")),
    ApiKey.CREATE_TOPICS: _Topics("Topics", "Topics", _create_topics_topic, _named("Name")),
    ApiKey.DELETE_TOPICS: _Topics(
        "Topics", "Responses", _delete_topics_topic, _named_or_id("Name")),
    ApiKey.DELETE_RECORDS: _Topics("Topics", "Topics", _delete_records_topic, _named("Name")),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _Topics(
        "Topics", "Topics", _offset_for_leader_epoch_topic, _named("Topic")),
    ApiKey.ADD_PARTITIONS_TO_TXN: _Topics(
        "Topics", "TopicResults", _add_partitions_topic, _named("Name"),
        _Outer("Transactions", "ResultsByTransaction", _add_partitions_txn,
               "TransactionalId")),
    ApiKey.TXN_OFFSET_COMMIT: _Topics(
        "Topics", "Topics", _txn_offset_commit_topic, _named("Name")),
    ApiKey.DESCRIBE_CONFIGS: _Topics(
        "Resources", "Results", _describe_configs_resource, _topic_resource),
    ApiKey.ALTER_CONFIGS: _Topics("Resources", "Responses", _config_resource, _topic_resource),
    ApiKey.CREATE_PARTITIONS: _Topics(
        "Topics", "Results", _create_partitions_topic, _named("Name")),
    ApiKey.ELECT_LEADERS: _Topics(
        "TopicPartitions", "ReplicaElectionResults", _elect_leaders_topic, _named("Topic")),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _Topics(
        "Resources", "Responses", _config_resource, _topic_resource),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _Topics(
        "Topics", "Responses", _reassignment_topic, _named("Name")),
    ApiKey.OFFSET_DELETE: _Topics("Topics", "Topics", _offset_delete_topic, _named("Name")),
    ApiKey.DESCRIBE_PRODUCERS: _Topics(
        "Topics", "Topics", _describe_producers_topic, _named("Name")),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: _Topics(
        "Topics", "Topics", _describe_topic_partitions_topic, _named("Name")),
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: _Topics(
        "Topics", "Topics", _describe_share_offsets_topic,
        _named("TopicName"),
        _Outer("Groups", "Groups", _share_offsets_group, "GroupId")),
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: _Topics(
        "Topics", "Responses", _alter_share_offsets_topic,
        _named("TopicName")),
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: _Topics(
        "Topics", "Responses", _delete_share_offsets_topic,
        _named("TopicName")),
}
# The older layouts: (the first version with the newest layout, where they were before).
_OLDER_TOPICS: Final[Mapping[int, tuple[int, _Topics]]] = {
    ApiKey.OFFSET_FETCH: (8, _Topics("Topics", "Topics", _offset_fetch_topic, _named("Name"))),
    ApiKey.DELETE_TOPICS: (
        6, _Topics("TopicNames", "Responses", _delete_topics_topic, _plain_name)),
    ApiKey.ADD_PARTITIONS_TO_TXN: (4, _Topics(
        "V3AndBelowTopics", "ResultsByTopicV3AndBelow", _add_partitions_topic, _named("Name"))),
}


def _topics_of(api_key: int, version: int) -> _Topics | None:
    """Where `api_key`'s request and response keep their topics at `version`."""
    older = _OLDER_TOPICS.get(api_key)
    if older is not None and version < older[0]:
        return older[1]
    return _TOPICS.get(api_key)


def _all_entries(c: _Ctx, spec: _Topics, request: Body) -> list[Body]:
    assert spec.outer is None
    return [spec.entry(c, t) for t in _list(request, spec.request)]


# --- whole-request error bodies --------------------------------------------------------


def _every_topic(api_key: int, field: str) -> Callable[[_Ctx, Body], Body]:
    """The builder of a response that is the throttle time and, under `field`, an
    entry per topic of the request (each carrying the error)."""

    def build(c: _Ctx, r: Body) -> Body:
        return {"ThrottleTimeMs": c.throttle, field: _all_entries(c, _topics(api_key, c), r)}

    return build


def _error_and(**fields: Any) -> Callable[[_Ctx, Body], Body]:
    """The builder of a response that is the throttle time, the error and `fields`: the
    placeholders Kafka sends where there is no result."""
    return lambda c, r: {"ThrottleTimeMs": c.throttle, "ErrorCode": c.error,
                         **copy.deepcopy(fields)}


def _top_and(**fields: Any) -> Callable[[_Ctx, Body], Body]:
    """The builder of a `_top` response (with the error message) and `fields`."""
    return lambda c, r: _top(c, **copy.deepcopy(fields))


def _fetch(c: _Ctx, r: Body) -> Body:
    # The whole request: v13+ the top-level error alone; before, every partition too
    # (and top-level v7+). Its topics (an authorizer's answer): every partition, by
    # name or id, and no top-level error, at every version.
    if c.per_topic:
        responses, top_error = _all_entries(c, _topics(1, c), r), 0
    else:
        responses = [] if c.version >= 13 else _all_entries(c, _topics(1, c), r)
        top_error = c.error
    return {
        "ThrottleTimeMs": c.throttle,
        "ErrorCode": top_error,
        "SessionId": r.get("SessionId", 0),
        "Responses": responses,
    }


def _metadata(c: _Ctx, r: Body) -> Body:
    # Null topics (all topics) or v0's empty list: no topics. No brokers either.
    return {
        "ThrottleTimeMs": c.throttle,
        "Brokers": [],
        "Topics": _all_entries(c, _topics(3, c), r),
        "ErrorCode": c.error,
    }


def _offset_fetch(c: _Ctx, r: Body) -> Body:
    if c.version < 2:  # no top-level error yet: every partition carries it
        return {"Topics": _all_entries(c, _topics(9, c), r)}
    if c.version < 8:
        return {"ThrottleTimeMs": c.throttle, "ErrorCode": c.error, "Topics": []}
    return {
        "ThrottleTimeMs": c.throttle,
        "Groups": [
            {"GroupId": g.get("GroupId", ""), "ErrorCode": c.error, "Topics": []}
            for g in _list(r, "Groups")
        ],
    }


def _find_coordinator(c: _Ctx, r: Body) -> Body:
    no_node = {"NodeId": -1, "Host": "", "Port": -1}
    if c.version < 4:
        return {"ThrottleTimeMs": c.throttle, "ErrorCode": c.error, "ErrorMessage": c.message,
                **no_node}
    return {
        "ThrottleTimeMs": c.throttle,
        "Coordinators": [
            {"Key": k, **no_node, "ErrorCode": c.error, "ErrorMessage": c.message}
            for k in _list(r, "CoordinatorKeys")
        ],
    }


def _join_group(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "ErrorCode": c.error,
        "GenerationId": -1,
        "ProtocolName": None if c.version >= 7 else "",
        "Leader": "",
        "MemberId": "",
        "Members": [],
    }


def _describe_groups(c: _Ctx, r: Body) -> Body:
    # DescribeGroupsResponse.groupError; v0 carries no throttle (the field starts at v1).
    return {
        "ThrottleTimeMs": c.throttle,
        "Groups": [
            {
                "ErrorCode": c.error,
                "ErrorMessage": c.message,
                "GroupId": g,
                "GroupState": "",
                "ProtocolType": "",
                "ProtocolData": "",
                "Members": [],
                "AuthorizedOperations": AUTHORIZED_OPERATIONS_OMITTED,
            }
            for g in _list(r, "Groups")
        ],
    }


def _sasl_handshake(c: _Ctx, r: Body) -> Body:
    return {"ErrorCode": c.error, "Mechanisms": []}


def _api_versions(c: _Ctx, r: Body) -> Body:
    body: Body = {"ThrottleTimeMs": c.throttle, "ErrorCode": c.error, "ApiKeys": []}
    if c.error == ErrorCode.UNSUPPORTED_VERSION:  # KIP-511: tell the client which versions to retry
        lo, hi = _catalog.supported_versions(ApiKey.API_VERSIONS) or (0, 0)
        body["ApiKeys"] = [{"ApiKey": ApiKey.API_VERSIONS, "MinVersion": lo, "MaxVersion": hi}]
    return body


def _add_partitions_to_txn(c: _Ctx, r: Body) -> Body:
    if c.version < 4:
        return {"ThrottleTimeMs": c.throttle,
                "ResultsByTopicV3AndBelow": _all_entries(c, _topics(24, c), r)}
    return {"ThrottleTimeMs": c.throttle, "ErrorCode": c.error, "ResultsByTransaction": []}


def _create_acls(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "Results": [
            {"ErrorCode": c.error, "ErrorMessage": c.message} for _ in _list(r, "Creations")
        ],
    }


def _delete_acls(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "FilterResults": [
            {"ErrorCode": c.error, "ErrorMessage": c.message, "MatchingAcls": []}
            for _ in _list(r, "Filters")
        ],
    }


def _alter_replica_log_dirs(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "Results": [
            {
                "TopicName": t.get("Name", ""),
                "Partitions": [
                    {"PartitionIndex": i, "ErrorCode": c.error} for i in _list(t, "Partitions")
                ],
            }
            for d in _list(r, "Dirs")
            for t in _list(d, "Topics")
        ],
    }


def _sasl_authenticate(c: _Ctx, r: Body) -> Body:
    return {"ErrorCode": c.error, "ErrorMessage": c.message, "AuthBytes": b""}


def _create_delegation_token(c: _Ctx, r: Body) -> Body:
    # CreateDelegationTokenResponse.prepareResponse(..., ANONYMOUS, ANONYMOUS)
    return {
        "ErrorCode": c.error,
        "PrincipalType": "User",
        "PrincipalName": "ANONYMOUS",
        "TokenRequesterPrincipalType": "User",
        "TokenRequesterPrincipalName": "ANONYMOUS",
        "IssueTimestampMs": -1,
        "ExpiryTimestampMs": -1,
        "MaxTimestampMs": -1,
        "TokenId": "",
        "Hmac": b"",
        "ThrottleTimeMs": c.throttle,
    }


def _describe_delegation_token(c: _Ctx, r: Body) -> Body:
    return {"ErrorCode": c.error, "Tokens": [], "ThrottleTimeMs": c.throttle}


def _delete_groups(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "Results": [{"GroupId": g, "ErrorCode": c.error} for g in _list(r, "GroupsNames")],
    }


def _elect_leaders(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "ErrorCode": c.error,
        "ReplicaElectionResults": _all_entries(c, _topics(43, c), r),
    }


def _alter_partition_reassignments(c: _Ctx, r: Body) -> Body:
    return {
        **_top(c),
        "AllowReplicationFactorChange": r.get("AllowReplicationFactorChange", True),
        "Responses": _all_entries(c, _topics(45, c), r),
    }


def _alter_client_quotas(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "Entries": [
            {
                "ErrorCode": c.error,
                "ErrorMessage": c.message,
                "Entity": [
                    {"EntityType": e.get("EntityType", ""), "EntityName": e.get("EntityName")}
                    for e in _list(entry, "Entity")
                ],
            }
            for entry in _list(r, "Entries")
        ],
    }


def _describe_user_scram_credentials(c: _Ctx, r: Body) -> Body:
    return {
        **_top(c),
        "Results": [
            {"User": u.get("Name", ""), "ErrorCode": c.error, "ErrorMessage": c.message,
             "CredentialInfos": []}
            for u in _list(r, "Users")
        ],
    }


def _alter_user_scram_credentials(c: _Ctx, r: Body) -> Body:
    users = {d.get("Name", "") for d in _list(r, "Deletions")}
    users |= {u.get("Name", "") for u in _list(r, "Upsertions")}
    return {
        "ThrottleTimeMs": c.throttle,
        "Results": [
            {"User": u, "ErrorCode": c.error, "ErrorMessage": c.message} for u in sorted(users)
        ],
    }


def _describe_quorum(c: _Ctx, r: Body) -> Body:
    return {"ErrorCode": c.error, "ErrorMessage": c.message, "Topics": [], "Nodes": []}


def _describe_cluster(c: _Ctx, r: Body) -> Body:
    return {
        **_top(c),
        "EndpointType": r.get("EndpointType", 1),
        "ClusterId": "",
        "ControllerId": -1,
        "Brokers": [],
        "ClusterAuthorizedOperations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _describe_transactions(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "TransactionStates": [
            {"ErrorCode": c.error, "TransactionalId": t, "Topics": []}
            for t in _list(r, "TransactionalIds")
        ],
    }


def _group_heartbeat(c: _Ctx, r: Body) -> Body:
    # Consumer/ShareGroupHeartbeat: the error, no member id, no assignment.
    return {**_top(c), "MemberId": None, "MemberEpoch": 0, "HeartbeatIntervalMs": 0,
            "Assignment": None}


def _group_describe(c: _Ctx, r: Body) -> Body:
    # Consumer/ShareGroupDescribe: one failed group per id asked.
    return {
        "ThrottleTimeMs": c.throttle,
        "Groups": [
            {"ErrorCode": c.error, "ErrorMessage": c.message, "GroupId": g, "Members": [],
             "AuthorizedOperations": AUTHORIZED_OPERATIONS_OMITTED}
            for g in _list(r, "GroupIds")
        ],
    }


def _get_telemetry_subscriptions(c: _Ctx, r: Body) -> Body:
    return {"ThrottleTimeMs": c.throttle, "ErrorCode": c.error,
            "ClientInstanceId": _topic_id(r, "ClientInstanceId")}


def _describe_topic_partitions(c: _Ctx, r: Body) -> Body:
    return {"ThrottleTimeMs": c.throttle, "Topics": _all_entries(c, _topics(75, c), r),
            "NextCursor": None}


def _describe_share_group_offsets(c: _Ctx, r: Body) -> Body:
    # A refusal of the topics: each partition asked carries it (the group's error is 0);
    # of the request: each group does.
    groups = []
    for g in _list(r, "Groups"):
        if c.per_topic:
            groups.append(_share_offsets_group(
                c, g, [_describe_share_offsets_topic(c, t) for t in _list(g, "Topics")]))
        else:
            groups.append({"GroupId": g.get("GroupId", ""), "Topics": [],
                           "ErrorCode": c.error, "ErrorMessage": c.message})
    return {"ThrottleTimeMs": c.throttle, "Groups": groups}


def _alter_share_group_offsets(c: _Ctx, r: Body) -> Body:
    return _share_offsets_answer(c, [_alter_share_offsets_topic(c, t) for t in _list(r, "Topics")])


def _delete_share_group_offsets(c: _Ctx, r: Body) -> Body:
    return _share_offsets_answer(c, [_delete_share_offsets_topic(c, t) for t in _list(r, "Topics")])


def _share_offsets_answer(c: _Ctx, topics: list[Body]) -> Body:
    # Alter/DeleteShareGroupOffsets: every topic carries the error; the top level too
    # unless the refusal is about the topics alone.
    if c.per_topic:
        return {"ThrottleTimeMs": c.throttle, "ErrorCode": 0, "ErrorMessage": None,
                "Responses": topics}
    return _top(c, Responses=topics)


def _streams_group_describe(c: _Ctx, r: Body) -> Body:
    return {
        "ThrottleTimeMs": c.throttle,
        "Groups": [
            {"ErrorCode": c.error, "ErrorMessage": c.message, "GroupId": g, "GroupState": "",
             "GroupEpoch": -1, "AssignmentEpoch": -1, "Topology": None, "Members": [],
             "AuthorizedOperations": AUTHORIZED_OPERATIONS_OMITTED}
            for g in _list(r, "GroupIds")
        ],
    }


def _write_txn_markers(c: _Ctx, r: Body) -> Body:
    # Each partition of each marker carries the error (the response has no other place).
    return {"Markers": [
        {"ProducerId": m.get("ProducerId", -1),
         "Topics": [{"Name": t.get("Name", ""),
                     "Partitions": [{"PartitionIndex": p, "ErrorCode": c.error}
                                    for p in _list(t, "PartitionIndexes")]}
                    for t in _list(m, "Topics")]}
        for m in _list(r, "Markers")]}


def _share_group_state(**state: Any) -> Callable[[_Ctx, Body], Body]:
    """Initialize/Read/Write/Delete/ReadSummary ShareGroupState (broker to share
    coordinator): each partition asked carries the error, with `state` (unknown: -1)."""

    def build(c: _Ctx, r: Body) -> Body:
        return {"Results": [
            {"TopicId": _topic_id(t),
             "Partitions": [{"Partition": p.get("Partition", 0), "ErrorCode": c.error,
                             "ErrorMessage": c.message, **copy.deepcopy(state)}
                            for p in _list(t, "Partitions")]}
            for t in _list(r, "Topics")]}

    return build


def _topics(api_key: int, c: _Ctx) -> _Topics:
    spec = _topics_of(api_key, c.version)
    assert spec is not None
    return spec


_BUILDERS: Final[Mapping[int, Callable[[_Ctx, Body], Body]]] = {
    ApiKey.PRODUCE: _every_topic(ApiKey.PRODUCE, "Responses"),
    ApiKey.FETCH: _fetch,
    ApiKey.LIST_OFFSETS: _every_topic(ApiKey.LIST_OFFSETS, "Topics"),
    ApiKey.METADATA: _metadata,
    ApiKey.OFFSET_COMMIT: _every_topic(ApiKey.OFFSET_COMMIT, "Topics"),
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.JOIN_GROUP: _join_group,
    ApiKey.HEARTBEAT: _error_and(),
    ApiKey.LEAVE_GROUP: _error_and(Members=[]),  # the top-level error, no member results
    ApiKey.SYNC_GROUP: _error_and(Assignment=b""),
    ApiKey.DESCRIBE_GROUPS: _describe_groups,
    ApiKey.LIST_GROUPS: _error_and(Groups=[]),
    ApiKey.SASL_HANDSHAKE: _sasl_handshake,
    ApiKey.API_VERSIONS: _api_versions,
    ApiKey.CREATE_TOPICS: _every_topic(ApiKey.CREATE_TOPICS, "Topics"),
    ApiKey.DELETE_TOPICS: _every_topic(ApiKey.DELETE_TOPICS, "Responses"),
    ApiKey.DELETE_RECORDS: _every_topic(ApiKey.DELETE_RECORDS, "Topics"),
    ApiKey.INIT_PRODUCER_ID: _error_and(ProducerId=-1, ProducerEpoch=-1),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _every_topic(ApiKey.OFFSET_FOR_LEADER_EPOCH, "Topics"),
    ApiKey.ADD_PARTITIONS_TO_TXN: _add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: _error_and(),
    ApiKey.END_TXN: _error_and(ProducerId=-1, ProducerEpoch=-1),
    ApiKey.TXN_OFFSET_COMMIT: _every_topic(ApiKey.TXN_OFFSET_COMMIT, "Topics"),
    ApiKey.DESCRIBE_ACLS: _top_and(Resources=[]),
    ApiKey.CREATE_ACLS: _create_acls,
    ApiKey.DELETE_ACLS: _delete_acls,
    ApiKey.DESCRIBE_CONFIGS: _every_topic(ApiKey.DESCRIBE_CONFIGS, "Results"),
    ApiKey.ALTER_CONFIGS: _every_topic(ApiKey.ALTER_CONFIGS, "Responses"),
    ApiKey.ALTER_REPLICA_LOG_DIRS: _alter_replica_log_dirs,
    # the top-level error (v3+), no results at any version
    ApiKey.DESCRIBE_LOG_DIRS: _error_and(Results=[]),
    ApiKey.SASL_AUTHENTICATE: _sasl_authenticate,
    ApiKey.CREATE_PARTITIONS: _every_topic(ApiKey.CREATE_PARTITIONS, "Results"),
    ApiKey.CREATE_DELEGATION_TOKEN: _create_delegation_token,
    ApiKey.RENEW_DELEGATION_TOKEN: _error_and(),
    ApiKey.EXPIRE_DELEGATION_TOKEN: _error_and(),
    ApiKey.DESCRIBE_DELEGATION_TOKEN: _describe_delegation_token,
    ApiKey.DELETE_GROUPS: _delete_groups,
    ApiKey.ELECT_LEADERS: _elect_leaders,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _every_topic(ApiKey.INCREMENTAL_ALTER_CONFIGS, "Responses"),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _alter_partition_reassignments,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: _top_and(Topics=[]),
    ApiKey.OFFSET_DELETE: _error_and(Topics=[]),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: _top_and(Entries=None),
    ApiKey.ALTER_CLIENT_QUOTAS: _alter_client_quotas,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: _describe_user_scram_credentials,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: _alter_user_scram_credentials,
    ApiKey.DESCRIBE_QUORUM: _describe_quorum,
    ApiKey.UPDATE_FEATURES: _top_and(Results=[]),
    ApiKey.DESCRIBE_CLUSTER: _describe_cluster,
    ApiKey.DESCRIBE_PRODUCERS: _every_topic(ApiKey.DESCRIBE_PRODUCERS, "Topics"),
    ApiKey.UNREGISTER_BROKER: _top_and(),
    ApiKey.DESCRIBE_TRANSACTIONS: _describe_transactions,
    ApiKey.LIST_TRANSACTIONS: _error_and(UnknownStateFilters=[], TransactionStates=[]),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _group_heartbeat,
    ApiKey.CONSUMER_GROUP_DESCRIBE: _group_describe,
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: _get_telemetry_subscriptions,
    ApiKey.PUSH_TELEMETRY: _error_and(),
    # KIP-590: the envelope refused as such, no response of the request it carries
    ApiKey.ENVELOPE: lambda c, r: {"ErrorCode": c.error, "ResponseData": None},
    ApiKey.LIST_CONFIG_RESOURCES: _error_and(ConfigResources=[]),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: _describe_topic_partitions,
    ApiKey.WRITE_TXN_MARKERS: _write_txn_markers,
    ApiKey.INITIALIZE_SHARE_GROUP_STATE: _share_group_state(),
    ApiKey.READ_SHARE_GROUP_STATE: _share_group_state(
        StateEpoch=-1, StartOffset=-1, StateBatches=[]),
    ApiKey.WRITE_SHARE_GROUP_STATE: _share_group_state(),
    ApiKey.DELETE_SHARE_GROUP_STATE: _share_group_state(),
    ApiKey.READ_SHARE_GROUP_STATE_SUMMARY: _share_group_state(
        StateEpoch=-1, LeaderEpoch=-1, StartOffset=-1),
    ApiKey.SHARE_GROUP_HEARTBEAT: _group_heartbeat,
    ApiKey.SHARE_GROUP_DESCRIBE: _group_describe,
    # ShareFetch and ShareAcknowledge: the top-level error alone, as Kafka answers
    ApiKey.SHARE_FETCH: _top_and(Responses=[], NodeEndpoints=[]),
    ApiKey.SHARE_ACKNOWLEDGE: _top_and(Responses=[], NodeEndpoints=[]),
    ApiKey.ADD_RAFT_VOTER: _top_and(),
    ApiKey.REMOVE_RAFT_VOTER: _top_and(),
    # Kafka Streams' group protocol (KIP-1071): the error, no member, no tasks
    ApiKey.STREAMS_GROUP_HEARTBEAT: _top_and(MemberId="", MemberEpoch=0,
                                             HeartbeatIntervalMs=0, ActiveTasks=None,
                                             StandbyTasks=None, WarmupTasks=None),
    ApiKey.STREAMS_GROUP_DESCRIBE: _streams_group_describe,
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: _describe_share_group_offsets,
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: _alter_share_group_offsets,
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: _delete_share_group_offsets,
}

#: API keys `error_response` can answer.
ERROR_RESPONSE_APIS: Final = frozenset(_BUILDERS)
#: API keys `partial_error_entries` and `remove_topics` can split by topic.
PARTIAL_APIS: Final = frozenset(
    {0, 1, 2, 3, 8, 9, 19, 20, 21, 23, 24, 28, 32, 33, 37, 43, 44, 45, 47, 61, 75, 90, 91, 92}
)


# --- public API --------------------------------------------------------------------------


def expects_response(api_key: int, api_version: int, request: Mapping[str, Any]) -> bool:
    """False when the client expects no response at all: a Produce with acks=0.

    Kafka's `ProduceRequest.getErrorResponse` returns null then; the broker closes the
    connection instead of answering (the client only learns from its next metadata).
    """
    return not (api_key == 0 and request.get("Acks", -1) == 0)


def error_response(
    api_key: int,
    api_version: int,
    request: Mapping[str, Any],
    error_code: int,
    message: str | None = None,
    *,
    throttle_time_ms: int = 0,
    per_topic: bool = False,
) -> Body:
    """The response body Kafka's broker sends when it refuses the whole request.

    `request` is the decoded request body (missing fields read as their defaults).
    `per_topic`: the refusal is about every topic the request names (as an authorizer
    refuses them), not the request as such; it matters where Kafka answers the two
    differently (Fetch v13+: per partition instead of the top-level error).
    Raises UnsupportedErrorResponse for an API without a builder (the caller closes
    the connection instead), UnknownApiError for a version the schemas lack.
    """
    builder = _BUILDERS.get(api_key)
    if builder is None:
        raise UnsupportedErrorResponse(api_key)
    ctx = _Ctx(api_version, error_code, message, throttle_time_ms, per_topic)
    return _fit_response(api_key, api_version, builder(ctx, dict(request)))


def _matcher(
    topics: Collection[TopicRef], topic_ids: Mapping[uuid.UUID, str] | None
) -> Callable[[TopicKey], bool]:
    names = {t for t in topics if isinstance(t, str)}
    ids = {t for t in topics if isinstance(t, uuid.UUID)}
    if topic_ids:
        ids |= {i for i, name in topic_ids.items() if name in names}

    def match(key: TopicKey) -> bool:
        name, tid = key
        return (name is not None and name in names) or (tid is not None and tid in ids)

    return match


def _partial_spec(api_key: int, api_version: int) -> _Topics:
    spec = _topics_of(api_key, api_version) if api_key in PARTIAL_APIS else None
    if spec is None:
        raise UnsupportedErrorResponse(api_key, "per-topic error")
    return spec


def partial_error_entries(
    api_key: int,
    api_version: int,
    request: Mapping[str, Any],
    topics: Collection[TopicRef],
    error_code: int,
    message: str | None = None,
    *,
    topic_ids: Mapping[uuid.UUID, str] | None = None,
) -> list[Body]:
    """The response's per-topic entries refusing just `topics` of `request`.

    A request topic matches when its name is in `topics`, its TopicId is (pass the
    uuid.UUID), or `topic_ids` maps its TopicId to a name in `topics` (Fetch v13+,
    Produce v13, OffsetCommit v10 and OffsetFetch v10 name topics by id only, DeleteTopics
    v6+ may). The zero uuid never matches.

    The entries have the shape `error_response` uses for those topics, in request
    order, for the response field that holds them:

    - Produce/Fetch/DeleteTopics `Responses`, ListOffsets/Metadata/OffsetCommit/... `Topics`,
      DescribeConfigs/CreatePartitions `Results`, AlterConfigs/IncrementalAlterConfigs
      `Responses` (only TOPIC resources match), ElectLeaders `ReplicaElectionResults`,
      AlterPartitionReassignments `Responses`, AddPartitionsToTxn v0-3
      `ResultsByTopicV3AndBelow`;
    - OffsetFetch v8+: `Groups` entries (GroupId, ErrorCode 0, Topics: the refused ones)
      for the groups that asked for any of them; AddPartitionsToTxn v4+:
      `ResultsByTransaction` entries (TransactionalId, TopicResults) likewise;
      `merge_error_entries` puts them into the broker's entry of the same group /
      transaction.

    A Fetch entry always lists its partitions (Kafka's answer for an unauthorized
    topic), also at v13+ where `error_response` uses the top-level error alone. A
    request asking for all topics (Metadata/OffsetFetch null topics) matches nothing:
    filter the broker's response instead.
    """
    spec = _partial_spec(api_key, api_version)
    ctx = _Ctx(api_version, error_code, message, 0)
    match = _matcher(topics, topic_ids)
    if spec.outer is None:
        entries = [spec.entry(ctx, t) for t in _list(request, spec.request) if match(spec.key(t))]
        return list(_fit_response(api_key, api_version, {spec.response: entries})[spec.response])
    outer = spec.outer
    containers = []
    for container in _list(request, outer.request):
        refused = [
            spec.entry(ctx, t) for t in _list(container, spec.request) if match(spec.key(t))
        ]
        if refused:
            containers.append(outer.wrap(ctx, container, refused))
    return list(_fit_response(api_key, api_version, {outer.response: containers})[outer.response])


def merge_error_entries(api_key: int, api_version: int, response: dict[str, Any],
                        entries: list[Body]) -> bool:
    """Add `partial_error_entries` to the broker's answer to the rest of the request.

    Entries nested under groups or transactions (OffsetFetch v8+, AddPartitionsToTxn
    v4+) join the broker's entry of the same group / transaction (a new one when the
    broker's answer has none). False when the API has no per-topic split.
    """
    spec = _topics_of(api_key, api_version) if api_key in PARTIAL_APIS else None
    if spec is None:
        return False
    outer = spec.outer
    if outer is None:
        response[spec.response] = [*(response.get(spec.response) or []), *entries]
        return True
    containers = {c.get(outer.key): c for c in response.get(outer.response) or ()}
    for entry in entries:
        container = containers.get(entry.get(outer.key))
        if container is None:
            response[outer.response] = [*(response.get(outer.response) or []), entry]
        else:
            container[spec.response] = [*(container.get(spec.response) or []),
                                        *(entry.get(spec.response) or [])]
    return True


def remove_topics(
    api_key: int,
    api_version: int,
    request: Mapping[str, Any],
    topics: Collection[TopicRef],
    *,
    topic_ids: Mapping[uuid.UUID, str] | None = None,
) -> Body:
    """A copy of `request` without `topics` (matched as in `partial_error_entries`).

    The copy is shallow below the lists it changes: the entries kept are the request's
    own. A Fetch also loses those topics from ForgottenTopicsData (v7+); in an
    incremental fetch session the broker's session then never holds them, so only the
    merged entries tell the client about them. A null topic
    list (all topics) stays null; containers (OffsetFetch v8+ groups, AddPartitionsToTxn
    v4+ transactions) stay, possibly with no topics left.
    """
    spec = _partial_spec(api_key, api_version)
    match = _matcher(topics, topic_ids)

    def keep(entries: Iterable[Any]) -> list[Any]:
        return [t for t in entries if not match(spec.key(t))]

    out = dict(request)
    if spec.outer is None:
        if out.get(spec.request) is not None:
            out[spec.request] = keep(out[spec.request])
        if api_key == 1 and out.get("ForgottenTopicsData") is not None:
            out["ForgottenTopicsData"] = keep(out["ForgottenTopicsData"])
        return out
    containers = []
    for container in _list(request, spec.outer.request):
        copy = dict(container)
        if copy.get(spec.request) is not None:
            copy[spec.request] = keep(copy[spec.request])
        containers.append(copy)
    out[spec.outer.request] = containers
    return out


# --- requests naming several groups --------------------------------------------------------


@dataclass(frozen=True)
class _GroupList:
    """Where a request lists groups, and where its answer gives one entry per group."""

    request: str
    response: str
    key: Callable[[Any], str | None]  # a request entry's group id


def _by_name(entry: Any) -> str | None:
    return entry if isinstance(entry, str) else None


def _by_group_id(entry: Any) -> str | None:
    return entry.get("GroupId") if isinstance(entry, Mapping) else None


_IDS_TO_GROUPS: Final = _GroupList("GroupIds", "Groups", _by_name)
# (api key, first version): the requests that name several groups, one answer entry each.
_GROUP_LISTS: Final[dict[int, tuple[int, _GroupList]]] = {
    ApiKey.FIND_COORDINATOR: (4, _GroupList("CoordinatorKeys", "Coordinators", _by_name)),
    ApiKey.DESCRIBE_GROUPS: (0, _GroupList("Groups", "Groups", _by_name)),
    ApiKey.DELETE_GROUPS: (0, _GroupList("GroupsNames", "Results", _by_name)),
    ApiKey.OFFSET_FETCH: (8, _GroupList("Groups", "Groups", _by_group_id)),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, _IDS_TO_GROUPS),
    ApiKey.SHARE_GROUP_DESCRIBE: (0, _IDS_TO_GROUPS),
    ApiKey.STREAMS_GROUP_DESCRIBE: (0, _IDS_TO_GROUPS),
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: (0, _GroupList("Groups", "Groups", _by_group_id)),
}
_FIND_COORDINATOR_GROUP_KEYS: Final = frozenset({0, 2})  # KeyType GROUP, SHARE (not a txn)


def _group_list(api_key: int, api_version: int,
                request: Mapping[str, Any]) -> _GroupList | None:
    found = _GROUP_LISTS.get(api_key)
    if found is None or api_version < found[0]:
        return None
    if (api_key == ApiKey.FIND_COORDINATOR
            and request.get("KeyType", 0) not in _FIND_COORDINATOR_GROUP_KEYS):
        return None
    return found[1]


def answers_groups_apart(api_key: int, api_version: int, request: Mapping[str, Any]) -> bool:
    """Whether `request` lists groups its answer gives an entry each (`split_groups`)."""
    return _group_list(api_key, api_version, request) is not None


def split_groups(
    api_key: int,
    api_version: int,
    request: Mapping[str, Any],
    groups: Collection[str],
    error_code: int,
    message: str | None = None,
) -> tuple[Body, list[Body]] | None:
    """`request` without `groups`, and the answer's entries refusing them.

    For the requests that name several groups, each answered in an entry of its own
    (FindCoordinator v4+ for groups, DescribeGroups, DeleteGroups, OffsetFetch v8+, the
    consumer, share and streams group descriptions, DescribeShareGroupOffsets), as
    Kafka's authorizer refuses each group it may not touch and answers the others. The
    entries have `error_response`'s shape; `merge_group_entries` adds them to the
    broker's answer to the rest. None when the request lists no groups that way (an
    older version, FindCoordinator for transactions).
    """
    spec = _group_list(api_key, api_version, request)
    if spec is None:
        return None
    listed = _list(request, spec.request)
    refused = [entry for entry in listed if spec.key(entry) in groups]
    rest = dict(request)
    rest[spec.request] = [entry for entry in listed if spec.key(entry) not in groups]
    answer = error_response(api_key, api_version, {**request, spec.request: refused},
                            error_code, message)
    return rest, list(answer.get(spec.response) or [])


def merge_group_entries(api_key: int, api_version: int, request: Mapping[str, Any],
                        response: dict[str, Any], entries: list[Body]) -> bool:
    """Add `split_groups`' entries to the broker's answer to the rest of `request`."""
    spec = _group_list(api_key, api_version, request)
    if spec is None:
        return False
    response[spec.response] = [*(response.get(spec.response) or []), *entries]
    return True


__all__ = [
    "ERROR_RESPONSE_APIS",
    "PARTIAL_APIS",
    "UnsupportedErrorResponse",
    "answers_groups_apart",
    "error_response",
    "expects_response",
    "merge_error_entries",
    "merge_group_entries",
    "partial_error_entries",
    "remove_topics",
    "split_groups",
]

"""Error responses as Kafka builds them, and per-topic refusals: every API, every version.

Requests are built from the schemas (2 topics x 2 partitions, every field set), encoded
and decoded back so they look exactly like what the gateway decodes. Every response
must encode at its version, hold only that version's fields, carry the error in every
error code field and mirror the request's topics and partitions where Kafka does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import kafka_wire as kw
from kafka_wire import ApiKey, _catalog
from kafka_wire._schema import FieldSpec, StructSpec, registry
from kafka_wire.error_responses import (
    _BUILDERS,
    ERROR_RESPONSE_APIS,
    PARTIAL_APIS,
    UnsupportedErrorResponse,
    _Ctx,
    answers_groups_apart,
    error_response,
    expects_response,
    merge_group_entries,
    partial_error_entries,
    remove_topics,
    split_groups,
)

ERROR = 29  # TOPIC_AUTHORIZATION_FAILED
MESSAGE = "denied by keg"
THROTTLE = 5
ERROR_FIELDS = ("ErrorCode", "PartitionErrorCode")


def topic_uuid(index: int) -> uuid.UUID:
    return uuid.UUID(int=index + 1)


# --- requests from the schema ----------------------------------------------------------


def _string(field: FieldSpec, idx: int) -> str:
    if field.name in ("Name", "Topic", "TopicName", "ResourceName"):
        return f"topic-{idx}"
    return f"{field.name.lower()}-{idx}"


def _scalar(field: FieldSpec, idx: int) -> Any:
    t, name = field.elem_type, field.name
    if t == "bool":
        return True
    if t == "int8":
        return 2 if name == "ResourceType" else 1  # TOPIC config resources
    if t == "int16":
        return -1 if name == "Acks" else 1
    if t in ("int32", "int64"):
        return idx if ("Partition" in name or name == "Index") else 7
    if t in ("uint16", "uint32"):
        return 1
    if t == "float64":
        return 1.5
    if t == "string":
        return _string(field, idx)
    if t in ("bytes", "records"):
        return b"" if t == "records" else b"xy"
    if t == "uuid":
        return topic_uuid(idx)
    raise AssertionError(t)


def sample(struct: StructSpec, version: int, idx: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in struct.fields:
        if not f.present(version):
            continue
        if f.struct is not None:
            if f.is_array:
                out[f.name] = [sample(f.struct, version, i) for i in range(2)]
            else:
                out[f.name] = sample(f.struct, version, idx)
        elif f.is_array:
            if f.elem_type == "string":
                stem = "topic" if "Topic" in f.name else f.name.lower()
                out[f.name] = [f"{stem}-0", f"{stem}-1"]
            elif "Partition" in f.name:
                out[f.name] = [0, 1]
            else:
                out[f.name] = [_scalar(f, i) for i in range(2)]
        else:
            out[f.name] = _scalar(f, idx)
    return out


def request_for(api_key: int, version: int) -> dict[str, Any]:
    spec = _catalog.message_file(api_key, version, "request").spec()
    raw = kw.encode_body(api_key, version, "request", sample(spec.struct, version))
    body, _ = kw.decode_body(api_key, version, "request", raw)
    return body


def versions(apis: Any) -> list[tuple[int, int]]:
    out = []
    for api_key in sorted(apis):
        rng = kw.supported_versions(api_key)
        assert rng is not None
        out += [(api_key, v) for v in range(rng[0], rng[1] + 1)]
    return out


ALL_VERSIONS = versions(ERROR_RESPONSE_APIS)
PARTIAL_VERSIONS = versions(PARTIAL_APIS)


def roundtrip(api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
    raw = kw.encode_body(api_key, version, "response", body)
    decoded, end = kw.decode_body(api_key, version, "response", raw)
    assert end == len(raw)
    assert kw.encode_body(api_key, version, "response", decoded) == raw
    return decoded


# --- walking responses -------------------------------------------------------------------


def walk(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str, Any]]:
    """(path, key, value) of every field of every struct in `value`."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield path, k, v
            yield from walk(v, (*path, k))
    elif isinstance(value, list):
        for v in value:
            yield from walk(v, path)


def struct_at(struct: StructSpec, path: tuple[str, ...]) -> StructSpec:
    for name in path:
        f = next(f for f in struct.fields if f.name == name)
        assert f.struct is not None
        struct = f.struct
    return struct


def assert_fields_of_version(api_key: int, version: int, body: dict[str, Any]) -> None:
    root = _catalog.message_file(api_key, version, "response").spec().struct
    for path, key, _ in walk(body):
        st = struct_at(root, path)
        fields = {f.name: f for f in st.fields}
        assert key in fields, f"{'/'.join(path)}: {key} not in {st.name}"
        assert fields[key].present(version), f"{key} absent in v{version}"


def assert_subset(expected: Any, actual: Any, where: str = "") -> None:
    """Every field set in `expected` decodes to the same value."""
    if isinstance(expected, dict):
        for k, v in expected.items():
            assert_subset(v, actual[k], f"{where}/{k}")
    elif isinstance(expected, list):
        assert len(expected) == len(actual), where
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_subset(e, a, f"{where}[{i}]")
    elif isinstance(expected, bytes | bytearray | memoryview):
        assert bytes(expected) == bytes(actual), where
    else:
        assert expected == actual, where


def error_codes(body: Any) -> list[tuple[tuple[str, ...], int]]:
    return [(p, v) for p, k, v in walk(body) if k in ERROR_FIELDS]


# --- which topics and partitions a message holds -----------------------------------------


@dataclass(frozen=True)
class Side:
    path: tuple[str, ...]  # fields down to the topic entries (lists flattened)
    key: str | None  # the entry's topic (None: the entry is the name itself)
    parts: str | None = None  # partition list of the entry
    part_key: str | None = None  # partition index in it (None: a list of ints)

    def pairs(self, body: dict[str, Any]) -> list[tuple[Any, Any]]:
        level: list[Any] = [body]
        for name in self.path:
            level = [e for c in level for e in (c.get(name) or [])]
        out: list[tuple[Any, Any]] = []
        for entry in level:
            ref = entry if self.key is None else entry[self.key]
            if self.parts is None:
                out.append((ref, None))
                continue
            for p in entry[self.parts]:
                out.append((ref, p if self.part_key is None else p[self.part_key]))
        return out


@dataclass(frozen=True)
class Mirror:
    request: Side
    response: Side
    in_error_response: bool = True  # does error_response list them (else top-level only)


def mirror(api_key: int, v: int) -> Mirror | None:
    S, M = Side, Mirror
    if api_key == ApiKey.PRODUCE:
        k = "TopicId" if v >= 13 else "Name"
        return M(S(("TopicData",), k, "PartitionData", "Index"),
                 S(("Responses",), k, "PartitionResponses", "Index"))
    if api_key == ApiKey.FETCH:
        k = "TopicId" if v >= 13 else "Topic"
        return M(S(("Topics",), k, "Partitions", "Partition"),
                 S(("Responses",), k, "Partitions", "PartitionIndex"), v < 13)
    if api_key == ApiKey.LIST_OFFSETS:
        return M(S(("Topics",), "Name", "Partitions", "PartitionIndex"),
                 S(("Topics",), "Name", "Partitions", "PartitionIndex"))
    if api_key == ApiKey.METADATA:
        return M(S(("Topics",), "Name"), S(("Topics",), "Name"))
    if api_key == ApiKey.OFFSET_COMMIT:
        k = "TopicId" if v >= 10 else "Name"
        return M(S(("Topics",), k, "Partitions", "PartitionIndex"),
                 S(("Topics",), k, "Partitions", "PartitionIndex"))
    if api_key == ApiKey.OFFSET_FETCH:
        if v < 8:
            return M(S(("Topics",), "Name", "PartitionIndexes"),
                     S(("Topics",), "Name", "Partitions", "PartitionIndex"), v < 2)
        k = "TopicId" if v >= 10 else "Name"
        return M(S(("Groups", "Topics"), k, "PartitionIndexes"),
                 S(("Groups", "Topics"), k, "Partitions", "PartitionIndex"), False)
    if api_key == ApiKey.FIND_COORDINATOR and v >= 4:
        return M(S(("CoordinatorKeys",), None), S(("Coordinators",), "Key"))
    if api_key == ApiKey.DESCRIBE_GROUPS:
        return M(S(("Groups",), None), S(("Groups",), "GroupId"))
    if api_key == ApiKey.CREATE_TOPICS:
        return M(S(("Topics",), "Name"), S(("Topics",), "Name"))
    if api_key == ApiKey.DELETE_TOPICS:
        req = S(("TopicNames",), None) if v < 6 else S(("Topics",), "Name")
        return M(req, S(("Responses",), "Name"))
    if api_key == ApiKey.DELETE_RECORDS:
        return M(S(("Topics",), "Name", "Partitions", "PartitionIndex"),
                 S(("Topics",), "Name", "Partitions", "PartitionIndex"))
    if api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
        return M(S(("Topics",), "Topic", "Partitions", "Partition"),
                 S(("Topics",), "Topic", "Partitions", "Partition"))
    if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
        if v < 4:
            return M(S(("V3AndBelowTopics",), "Name", "Partitions"),
                     S(("ResultsByTopicV3AndBelow",), "Name", "ResultsByPartition",
                       "PartitionIndex"))
        return M(S(("Transactions", "Topics"), "Name", "Partitions"),
                 S(("ResultsByTransaction", "TopicResults"), "Name", "ResultsByPartition",
                   "PartitionIndex"), False)
    if api_key == ApiKey.TXN_OFFSET_COMMIT:
        return M(S(("Topics",), "Name", "Partitions", "PartitionIndex"),
                 S(("Topics",), "Name", "Partitions", "PartitionIndex"))
    if api_key == ApiKey.DESCRIBE_CONFIGS:
        return M(S(("Resources",), "ResourceName"), S(("Results",), "ResourceName"))
    if api_key in (ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS):
        return M(S(("Resources",), "ResourceName"), S(("Responses",), "ResourceName"))
    if api_key == ApiKey.ALTER_REPLICA_LOG_DIRS:
        return M(S(("Dirs", "Topics"), "Name", "Partitions"),
                 S(("Results",), "TopicName", "Partitions", "PartitionIndex"))
    if api_key == ApiKey.CREATE_PARTITIONS:
        return M(S(("Topics",), "Name"), S(("Results",), "Name"))
    if api_key == ApiKey.DELETE_GROUPS:
        return M(S(("GroupsNames",), None), S(("Results",), "GroupId"))
    if api_key == ApiKey.ELECT_LEADERS:
        return M(S(("TopicPartitions",), "Topic", "Partitions"),
                 S(("ReplicaElectionResults",), "Topic", "PartitionResult", "PartitionId"))
    if api_key == ApiKey.ALTER_PARTITION_REASSIGNMENTS:
        return M(S(("Topics",), "Name", "Partitions", "PartitionIndex"),
                 S(("Responses",), "Name", "Partitions", "PartitionIndex"))
    if api_key == ApiKey.OFFSET_DELETE:
        return M(S(("Topics",), "Name", "Partitions", "PartitionIndex"),
                 S(("Topics",), "Name", "Partitions", "PartitionIndex"), False)
    if api_key == ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS:
        return M(S(("Users",), "Name"), S(("Results",), "User"))
    if api_key == ApiKey.DESCRIBE_PRODUCERS:
        return M(S(("Topics",), "Name", "PartitionIndexes"),
                 S(("Topics",), "Name", "Partitions", "PartitionIndex"))
    if api_key == ApiKey.DESCRIBE_TRANSACTIONS:
        return M(S(("TransactionalIds",), None), S(("TransactionStates",), "TransactionalId"))
    if api_key in (ApiKey.CONSUMER_GROUP_DESCRIBE, ApiKey.SHARE_GROUP_DESCRIBE):
        return M(S(("GroupIds",), None), S(("Groups",), "GroupId"))
    if api_key == ApiKey.DESCRIBE_TOPIC_PARTITIONS:
        return M(S(("Topics",), "Name"), S(("Topics",), "Name"))
    if api_key == ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS:
        return M(S(("Groups", "Topics"), "TopicName", "Partitions"),
                 S(("Groups", "Topics"), "TopicName", "Partitions", "PartitionIndex"), False)
    if api_key == ApiKey.ALTER_SHARE_GROUP_OFFSETS:
        return M(S(("Topics",), "TopicName", "Partitions", "PartitionIndex"),
                 S(("Responses",), "TopicName", "Partitions", "PartitionIndex"))
    if api_key == ApiKey.DELETE_SHARE_GROUP_OFFSETS:
        return M(S(("Topics",), "TopicName"), S(("Responses",), "TopicName"))
    return None


GROUPED_TOPICS = frozenset({ApiKey.OFFSET_FETCH, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS})


def test_every_partial_api_has_a_mirror() -> None:
    for api_key, v in PARTIAL_VERSIONS:
        assert mirror(api_key, v) is not None, (api_key, v)


# --- error_response: every API with a builder, every version ----------------------------


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS)
def test_error_response(api_key: int, version: int) -> None:
    request = request_for(api_key, version)
    body = error_response(api_key, version, request, ERROR, MESSAGE, throttle_time_ms=THROTTLE)
    assert_fields_of_version(api_key, version, body)
    decoded = roundtrip(api_key, version, body)
    assert_subset(body, decoded)

    codes = error_codes(decoded)
    # DescribeLogDirs before v3 has nowhere to put an error: Kafka answers "no dirs".
    assert codes or (api_key == ApiKey.DESCRIBE_LOG_DIRS and version < 3), "no error code at all"
    assert all(code == ERROR for _, code in codes), codes
    for _, key, value in walk(decoded):
        if key == "ErrorMessage":
            assert value == MESSAGE
        elif key == "ThrottleTimeMs":
            assert value == THROTTLE

    m = mirror(api_key, version)
    if m is not None:
        expected = m.request.pairs(request) if m.in_error_response else []
        assert m.response.pairs(decoded) == expected
        assert not m.in_error_response or expected, "the sample request has no topics"


@pytest.mark.parametrize("api_key", sorted(ERROR_RESPONSE_APIS))
def test_builders_name_only_schema_fields(api_key: int) -> None:
    """Builders may name fields of any version of either schema file, but nothing else."""
    rng = kw.supported_versions(api_key)
    assert rng is not None
    names: dict[tuple[str, ...], set[str]] = {}

    def collect(struct: StructSpec, path: tuple[str, ...]) -> None:
        names.setdefault(path, set()).update(f.name for f in struct.fields)
        for f in struct.fields:
            if f.struct is not None:
                collect(f.struct, (*path, f.name))

    for f in registry().key_files(api_key, "response"):
        collect(f.spec().struct, ())
    for v in range(rng[0], rng[1] + 1):
        raw = _BUILDERS[api_key](_Ctx(v, ERROR, MESSAGE, 0), request_for(api_key, v))
        for path, key, _ in walk(raw):
            assert key in names.get(path, set()), f"{'/'.join(path)}: {key}"


# --- Kafka's shapes, API by API -------------------------------------------------------------


def test_produce_partitions() -> None:
    request = request_for(ApiKey.PRODUCE, 9)
    body = roundtrip(ApiKey.PRODUCE, 9, error_response(ApiKey.PRODUCE, 9, request, ERROR, MESSAGE))
    part = body["Responses"][1]["PartitionResponses"][1]
    assert part["Index"] == 1 and part["ErrorCode"] == ERROR
    assert (part["BaseOffset"], part["LogAppendTimeMs"], part["LogStartOffset"]) == (-1, -1, -1)
    assert part["ErrorMessage"] == MESSAGE and part["RecordErrors"] == []
    old = error_response(ApiKey.PRODUCE, 0, request_for(ApiKey.PRODUCE, 0), ERROR, MESSAGE)
    assert set(old) == {"Responses"}
    assert set(old["Responses"][0]["PartitionResponses"][0]) == {"Index", "ErrorCode", "BaseOffset"}
    v13 = error_response(ApiKey.PRODUCE, 13, request_for(ApiKey.PRODUCE, 13), ERROR)
    assert [t["TopicId"] for t in v13["Responses"]] == [topic_uuid(0), topic_uuid(1)]
    assert "Name" not in v13["Responses"][0]


def test_produce_acks_zero_expects_no_response() -> None:
    request = request_for(ApiKey.PRODUCE, 9)
    assert expects_response(ApiKey.PRODUCE, 9, request)
    assert not expects_response(ApiKey.PRODUCE, 9, {**request, "Acks": 0})
    assert expects_response(ApiKey.FETCH, 12, request_for(ApiKey.FETCH, 12))


def test_fetch_shapes() -> None:
    request = request_for(ApiKey.FETCH, 12)
    body = roundtrip(ApiKey.FETCH, 12, error_response(ApiKey.FETCH, 12, request, ERROR))
    assert body["ErrorCode"] == ERROR and body["SessionId"] == request["SessionId"]
    part = body["Responses"][0]["Partitions"][1]
    assert part["PartitionIndex"] == 1 and part["ErrorCode"] == ERROR
    assert (part["HighWatermark"], part["LastStableOffset"], part["LogStartOffset"]) == (-1, -1, -1)
    assert bytes(part["Records"]) == b""
    # v13+: the top-level error alone, as Kafka does.
    v13 = error_response(ApiKey.FETCH, 13, request_for(ApiKey.FETCH, 13), ERROR)
    assert v13["ErrorCode"] == ERROR and v13["Responses"] == []
    # Before v7 there is no top-level error: the partitions carry it.
    v6 = error_response(ApiKey.FETCH, 6, request_for(ApiKey.FETCH, 6), ERROR)
    assert "ErrorCode" not in v6 and "SessionId" not in v6
    assert v6["Responses"][0]["Partitions"][0]["ErrorCode"] == ERROR


def test_metadata_shapes() -> None:
    body = error_response(ApiKey.METADATA, 12, request_for(ApiKey.METADATA, 12), ERROR)
    assert body["Brokers"] == [] and "ErrorCode" not in body
    topic = body["Topics"][0]
    assert (topic["Name"], topic["ErrorCode"], topic["IsInternal"], topic["Partitions"]) == (
        "topic-0", ERROR, False, [])
    assert topic["TopicId"] == topic_uuid(0)
    # All topics (null): no topics in the answer; v13 adds the top-level error.
    assert error_response(ApiKey.METADATA, 1, {"Topics": None}, ERROR)["Topics"] == []
    v13 = error_response(ApiKey.METADATA, 13, {"Topics": None}, ERROR)
    assert v13["ErrorCode"] == ERROR and v13["Topics"] == []
    # A topic asked by id only: Kafka answers with name "".
    by_id = error_response(
        ApiKey.METADATA, 12, {"Topics": [{"TopicId": topic_uuid(3), "Name": None}]}, ERROR
    )
    assert by_id["Topics"][0]["Name"] == ""
    roundtrip(ApiKey.METADATA, 12, by_id)


def test_offset_fetch_shapes() -> None:
    v1 = error_response(ApiKey.OFFSET_FETCH, 1, request_for(ApiKey.OFFSET_FETCH, 1), ERROR)
    assert v1["Topics"][0]["Partitions"][0] == {
        "PartitionIndex": 0, "CommittedOffset": -1, "Metadata": "", "ErrorCode": ERROR}
    for v in (2, 7):
        body = error_response(ApiKey.OFFSET_FETCH, v, request_for(ApiKey.OFFSET_FETCH, v), ERROR)
        assert body["ErrorCode"] == ERROR and body["Topics"] == []
    v8 = error_response(ApiKey.OFFSET_FETCH, 8, request_for(ApiKey.OFFSET_FETCH, 8), ERROR)
    assert v8["Groups"] == [
        {"GroupId": "groupid-0", "ErrorCode": ERROR, "Topics": []},
        {"GroupId": "groupid-1", "ErrorCode": ERROR, "Topics": []},
    ]


def test_find_coordinator_shapes() -> None:
    v3 = error_response(
        ApiKey.FIND_COORDINATOR, 3, request_for(ApiKey.FIND_COORDINATOR, 3), ERROR, MESSAGE
    )
    assert v3 == {"ThrottleTimeMs": 0, "ErrorCode": ERROR, "ErrorMessage": MESSAGE,
                  "NodeId": -1, "Host": "", "Port": -1}
    assert "ErrorMessage" not in error_response(
        ApiKey.FIND_COORDINATOR, 0, request_for(ApiKey.FIND_COORDINATOR, 0), ERROR
    )
    v4 = error_response(ApiKey.FIND_COORDINATOR, 4, {"CoordinatorKeys": ["g1", "g2"]}, ERROR)
    assert [(c["Key"], c["NodeId"], c["ErrorCode"]) for c in v4["Coordinators"]] == [
        ("g1", -1, ERROR), ("g2", -1, ERROR)]


def test_join_group_protocol_name() -> None:
    assert (
        error_response(ApiKey.JOIN_GROUP, 6, request_for(ApiKey.JOIN_GROUP, 6), 30)["ProtocolName"]
        == ""
    )
    v7 = error_response(ApiKey.JOIN_GROUP, 7, request_for(ApiKey.JOIN_GROUP, 7), 30)
    assert v7["ProtocolName"] is None and v7["GenerationId"] == -1 and v7["MemberId"] == ""
    roundtrip(ApiKey.JOIN_GROUP, 7, v7)


def test_api_versions_unsupported_version_lists_its_range() -> None:
    body = error_response(ApiKey.API_VERSIONS, 0, {}, 35)
    lo, hi = kw.supported_versions(ApiKey.API_VERSIONS) or (0, 0)
    assert body["ApiKeys"] == [{"ApiKey": 18, "MinVersion": lo, "MaxVersion": hi}]
    assert error_response(ApiKey.API_VERSIONS, 3, {}, ERROR)["ApiKeys"] == []


def test_add_partitions_to_txn_shapes() -> None:
    v3 = error_response(
        ApiKey.ADD_PARTITIONS_TO_TXN, 3, request_for(ApiKey.ADD_PARTITIONS_TO_TXN, 3), 53
    )
    assert v3["ResultsByTopicV3AndBelow"][0]["ResultsByPartition"][1] == {
        "PartitionIndex": 1, "PartitionErrorCode": 53}
    v4 = error_response(
        ApiKey.ADD_PARTITIONS_TO_TXN, 4, request_for(ApiKey.ADD_PARTITIONS_TO_TXN, 4), 53
    )
    assert v4 == {"ThrottleTimeMs": 0, "ErrorCode": 53, "ResultsByTransaction": []}


def test_broker_to_broker_apis_with_topics_are_answered_per_partition() -> None:
    """WriteTxnMarkers and the share-group state APIs carry topics a rule may deny: their
    refusal closed the connection (no builder)."""
    markers = {"Markers": [{"ProducerId": 7, "ProducerEpoch": 0, "TransactionResult": True,
                            "Topics": [{"Name": "t", "PartitionIndexes": [0, 2]}],
                            "CoordinatorEpoch": 1}]}
    body = error_response(ApiKey.WRITE_TXN_MARKERS, 1, markers, 29)
    assert body == {"Markers": [{"ProducerId": 7, "Topics": [{"Name": "t", "Partitions": [
        {"PartitionIndex": 0, "ErrorCode": 29}, {"PartitionIndex": 2, "ErrorCode": 29}]}]}]}
    roundtrip(ApiKey.WRITE_TXN_MARKERS, 1, body)
    topic = uuid.uuid4()
    state = {"GroupId": "g", "Topics": [{"TopicId": topic, "Partitions": [{"Partition": 3}]}]}
    for api_key in (ApiKey.INITIALIZE_SHARE_GROUP_STATE, ApiKey.READ_SHARE_GROUP_STATE,
                    ApiKey.WRITE_SHARE_GROUP_STATE, ApiKey.DELETE_SHARE_GROUP_STATE,
                    ApiKey.READ_SHARE_GROUP_STATE_SUMMARY):
        body = error_response(api_key, 0, state, 29, MESSAGE)
        [result] = body["Results"]
        assert result["TopicId"] == topic
        assert [(p["Partition"], p["ErrorCode"], p["ErrorMessage"]) for p in
                result["Partitions"]] == [(3, 29, MESSAGE)]
        roundtrip(api_key, 0, body)


def test_count_mirrors() -> None:
    """One result per ACL creation / filter / quota entry / SCRAM user, as Kafka answers."""
    for api_key, v in versions(
        {ApiKey.CREATE_ACLS, ApiKey.DELETE_ACLS, ApiKey.ALTER_CLIENT_QUOTAS}
    ):
        request = request_for(api_key, v)
        body = error_response(api_key, v, request, 31, MESSAGE)
        field, results = {30: ("Creations", "Results"), 31: ("Filters", "FilterResults"),
                          49: ("Entries", "Entries")}[api_key]
        assert len(body[results]) == len(request[field]) == 2
    scram = {"Deletions": [{"Name": "b"}], "Upsertions": [{"Name": "a"}, {"Name": "b"}]}
    users = error_response(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, scram, 31)["Results"]
    assert [u["User"] for u in users] == ["a", "b"]


def test_unsupported_apis_raise() -> None:
    for api_key in (
        ApiKey.LEADER_AND_ISR,
        ApiKey.STOP_REPLICA,
        ApiKey.UPDATE_METADATA,
        ApiKey.CONTROLLED_SHUTDOWN,
        ApiKey.VOTE,
        999,
    ):
        with pytest.raises(UnsupportedErrorResponse) as exc:
            error_response(api_key, 0, {}, ERROR)
        assert exc.value.api_key == api_key
        assert isinstance(exc.value, kw.KafkaWireError)
    with pytest.raises(UnsupportedErrorResponse):
        partial_error_entries(ApiKey.HEARTBEAT, 0, {}, {"t"}, ERROR)
    with pytest.raises(UnsupportedErrorResponse):
        remove_topics(ApiKey.JOIN_GROUP, 0, {}, {"t"})


# --- partial_error_entries / remove_topics ----------------------------------------------------


def _uses_ids(m: Mirror) -> bool:
    return m.request.key == "TopicId"


@pytest.mark.parametrize(("api_key", "version"), PARTIAL_VERSIONS)
def test_partial_split(api_key: int, version: int) -> None:
    m = mirror(api_key, version)
    assert m is not None
    request = request_for(api_key, version)
    before = kw.encode_body(api_key, version, "request", request)
    pairs = m.request.pairs(request)
    refs = list(dict.fromkeys(ref for ref, _ in pairs))
    assert len(refs) == 2
    refused_ref, kept_ref = refs
    denied: set[str | uuid.UUID] = {"topic-0"}
    ids: dict[uuid.UUID, str] | None = None
    if _uses_ids(m):
        assert refused_ref == topic_uuid(0)
        ids = {topic_uuid(0): "topic-0", topic_uuid(1): "topic-1"}
        # By name alone an id-only request matches nothing...
        assert partial_error_entries(api_key, version, request, denied, ERROR) == []
    else:
        assert refused_ref == "topic-0"

    entries = partial_error_entries(
        api_key, version, request, denied, ERROR, MESSAGE, topic_ids=ids)
    root = m.response.path[0]
    body = roundtrip(api_key, version, {root: entries})
    assert_fields_of_version(api_key, version, {root: entries})
    assert m.response.pairs(body) == [p for p in pairs if p[0] == refused_ref]
    for path, code in error_codes(body[root]):
        path = (root, *path)
        # OffsetFetch v8+ and DescribeShareGroupOffsets groups: the group itself is fine,
        # its refused topics are not.
        grouped = api_key in GROUPED_TOPICS and path == ("Groups",)
        assert code == (0 if grouped else ERROR), path
    assert all(v == MESSAGE for path, k, v in walk(body[root])
               if k == "ErrorMessage" and not (api_key in GROUPED_TOPICS and path == ()))

    rest = remove_topics(api_key, version, request, denied, topic_ids=ids)
    assert m.request.pairs(rest) == [p for p in pairs if p[0] == kept_ref]
    kw.encode_body(api_key, version, "request", rest)
    assert kw.encode_body(api_key, version, "request", request) == before  # not mutated

    # ...and by uuid directly.
    if _uses_ids(m):
        by_id = partial_error_entries(api_key, version, request, {topic_uuid(0)}, ERROR, MESSAGE)
        assert by_id == entries
        assert remove_topics(api_key, version, request, {topic_uuid(0)}) == rest

    # Refusing every topic gives the entries error_response lists.
    every = partial_error_entries(api_key, version, request, {*refs, "topic-0", "topic-1"},
                                  ERROR, MESSAGE)
    assert m.response.pairs({root: every}) == pairs
    if m.in_error_response and m.response.path == (root,):
        whole = error_response(api_key, version, request, ERROR, MESSAGE)
        assert whole[root] == every
    assert m.request.pairs(remove_topics(api_key, version, request, set(refs))) == []


def test_fetch_remove_topics_also_forgets() -> None:
    request = request_for(ApiKey.FETCH, 12)
    rest = remove_topics(ApiKey.FETCH, 12, request, {"topic-1"})
    assert [t["Topic"] for t in rest["Topics"]] == ["topic-0"]
    assert [t["Topic"] for t in rest["ForgottenTopicsData"]] == ["topic-0"]
    assert [t["Topic"] for t in request["ForgottenTopicsData"]] == ["topic-0", "topic-1"]


def test_fetch_v13_partial_entries_list_partitions() -> None:
    request = request_for(ApiKey.FETCH, 13)
    entries = partial_error_entries(ApiKey.FETCH, 13, request, {"topic-1"}, ERROR,
                                    topic_ids={topic_uuid(1): "topic-1"})
    assert [e["TopicId"] for e in entries] == [topic_uuid(1)]
    assert [p["PartitionIndex"] for p in entries[0]["Partitions"]] == [0, 1]
    assert entries[0]["Partitions"][0]["HighWatermark"] == -1


def test_all_topics_requests_match_nothing() -> None:
    cases: list[tuple[int, int, dict[str, Any]]] = [
        (3, 4, {"Topics": None}), (9, 7, {"GroupId": "g", "Topics": None}),
        (43, 1, {"TopicPartitions": None}),
    ]
    for api_key, v, request in cases:
        assert partial_error_entries(api_key, v, request, {"topic-0"}, ERROR) == []
        rest = remove_topics(api_key, v, request, {"topic-0"})
        assert rest == request and rest is not request


def test_config_resources_match_topic_resources_only() -> None:
    request = {"Resources": [
        {"ResourceType": 4, "ResourceName": "topic-0", "ConfigurationKeys": None},  # a broker
        {"ResourceType": 2, "ResourceName": "topic-0", "ConfigurationKeys": None},
    ]}
    entries = partial_error_entries(ApiKey.DESCRIBE_CONFIGS, 4, request, {"topic-0"}, ERROR)
    assert [(e["ResourceType"], e["ResourceName"]) for e in entries] == [(2, "topic-0")]
    assert (
        remove_topics(ApiKey.DESCRIBE_CONFIGS, 4, request, {"topic-0"})["Resources"]
        == request["Resources"][:1]
    )


def test_offset_fetch_v8_groups() -> None:
    request: dict[str, Any] = {"Groups": [
        {"GroupId": "a", "Topics": [{"Name": "x", "PartitionIndexes": [0]}]},
        {"GroupId": "b", "Topics": [{"Name": "y", "PartitionIndexes": [1]},
                                     {"Name": "x", "PartitionIndexes": [2]}]},
        {"GroupId": "c", "Topics": None},
    ]}
    entries = partial_error_entries(ApiKey.OFFSET_FETCH, 8, request, {"x"}, ERROR)
    assert [(g["GroupId"], [t["Name"] for t in g["Topics"]]) for g in entries] == [
        ("a", ["x"]), ("b", ["x"])]
    rest = remove_topics(ApiKey.OFFSET_FETCH, 8, request, {"x"})
    assert [g["Topics"] for g in rest["Groups"]] == [[], [{"Name": "y", "PartitionIndexes": [1]}],
                                                      None]
    assert len(request["Groups"][0]["Topics"]) == 1


def test_partial_apis_have_whole_request_builders() -> None:
    assert PARTIAL_APIS <= ERROR_RESPONSE_APIS


GROUP_ERROR = 30  # GROUP_AUTHORIZATION_FAILED


@pytest.mark.parametrize("api_key, version, field, response_field, entry", [
    (ApiKey.FIND_COORDINATOR, 4, "CoordinatorKeys", "Coordinators", lambda g: g),
    (ApiKey.DESCRIBE_GROUPS, 5, "Groups", "Groups", lambda g: g),
    (ApiKey.DELETE_GROUPS, 2, "GroupsNames", "Results", lambda g: g),
    (ApiKey.OFFSET_FETCH, 8, "Groups", "Groups", lambda g: {"GroupId": g, "Topics": None}),
    (ApiKey.CONSUMER_GROUP_DESCRIBE, 1, "GroupIds", "Groups", lambda g: g),
    (ApiKey.SHARE_GROUP_DESCRIBE, 1, "GroupIds", "Groups", lambda g: g),
    (ApiKey.STREAMS_GROUP_DESCRIBE, 0, "GroupIds", "Groups", lambda g: g),
    (ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, "Groups", "Groups",
     lambda g: {"GroupId": g, "Topics": None}),
])
def test_a_request_naming_several_groups_splits_by_group(
        api_key: int, version: int, field: str, response_field: str, entry: Any) -> None:
    request: dict[str, Any] = {field: [entry("a"), entry("b"), entry("c")], "KeyType": 0}
    split = split_groups(api_key, version, request, {"b", "c"}, GROUP_ERROR, MESSAGE)
    assert split is not None
    rest, entries = split
    assert rest[field] == [entry("a")] and len(request[field]) == 3
    key = "Key" if api_key == ApiKey.FIND_COORDINATOR else "GroupId"
    assert [(e[key], e["ErrorCode"]) for e in entries] == [("b", GROUP_ERROR), ("c", GROUP_ERROR)]
    kw.encode_response(1, api_key, version, {response_field: entries})
    answer = {response_field: [{key: "a", "ErrorCode": 0}]}
    assert merge_group_entries(api_key, version, rest, answer, entries)
    assert [e[key] for e in answer[response_field]] == ["a", "b", "c"]


@pytest.mark.parametrize("api_key, version, request_body", [
    (ApiKey.FIND_COORDINATOR, 3, {"Key": "a", "KeyType": 0}),  # one key per request
    (ApiKey.FIND_COORDINATOR, 4, {"KeyType": 1, "CoordinatorKeys": ["t"]}),  # transactions
    (ApiKey.OFFSET_FETCH, 7, {"GroupId": "a", "Topics": None}),
    (ApiKey.JOIN_GROUP, 9, {"GroupId": "a"}),
])
def test_requests_naming_one_group_or_none_do_not_split(
        api_key: int, version: int, request_body: dict[str, Any]) -> None:
    assert not answers_groups_apart(api_key, version, request_body)
    assert split_groups(api_key, version, request_body, {"a"}, GROUP_ERROR) is None

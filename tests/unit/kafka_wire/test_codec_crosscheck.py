"""Differential tests against kafka-python 3.x's own codec (an independent implementation).

- bytes kafka-python writes decode with ours to the same values, and re-encode to the
  same bytes (Metadata request/response at every version, Produce, ApiVersions,
  whole frames with headers);
- for every API and version kafka-python ships, bytes we write with every field set
  are read and written back identically by kafka-python.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

import kafka_wire as kw
from kafka_wire import ApiKey, _catalog
from kafka_wire._schema import FieldSpec, StructSpec, in_versions

kp_api = pytest.importorskip("kafka.protocol.api_message")
from kafka.protocol import admin, consumer, metadata, producer  # noqa: E402
from kafka.protocol.metadata import (  # noqa: E402
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest  # noqa: E402

ApiMessage = kp_api.ApiMessage


def kp_classes() -> dict[tuple[int, str], Any]:
    """kafka-python's message classes by (api key, kind)."""
    found: dict[tuple[int, str], Any] = {}
    for module in (metadata, producer, consumer, admin):
        for name in module.__all__:
            cls: Any = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, ApiMessage) and cls is not ApiMessage:
                message: Any = cls
                found[(message.API_KEY, message.type)] = message
    return found


KP_CLASSES = kp_classes()


def _authorized(key: str) -> bool:
    """kafka-python renames some *AuthorizedOperations fields and reads them as sets."""
    return key.endswith("authorized_operations")


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])|(?<=[A-Z])([A-Z][a-z])", r"_\1\2", name).lower()


def to_snake(value: Any) -> Any:
    """Our CamelCase dict in kafka-python's to_dict(json=False) shape."""
    if isinstance(value, dict):
        return {
            snake(k): to_snake(v)
            for k, v in value.items()
            if not _authorized(snake(k)) and k != "_unknown_tags"
        }
    if isinstance(value, list):
        return [to_snake(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    if value == uuid.UUID(int=0):
        return None  # kafka-python reads the zero uuid as None
    return value


def kp_dict(obj: Any) -> Any:
    d = obj.to_dict(json=False)

    def drop(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: drop(v) for k, v in x.items() if not _authorized(k)}
        if isinstance(x, list):
            return [drop(v) for v in x]
        return x

    return drop(d)


def kp_encode(obj: Any) -> bytes:
    if not hasattr(obj, "_header"):
        obj._header = None
    return bytes(obj.encode())


def check_kp_bytes(api_key: int, version: int, kind: str, kp_obj: Any) -> dict[str, Any]:
    """kafka-python's bytes -> our value (same as theirs) -> our bytes (same as theirs)."""
    raw = bytes(kp_obj.encode(version=version))
    value, end = kw.decode_body(api_key, version, kind, raw)
    assert end == len(raw)
    assert kw.encode_body(api_key, version, kind, value) == raw
    theirs = type(kp_obj).decode(raw, version=version)
    assert to_snake(value) == kp_dict(theirs)
    return value


MR = MetadataResponse


def metadata_response(version: int) -> Any:
    partition = MR.MetadataResponseTopic.MetadataResponsePartition(
        error_code=0,
        partition_index=3,
        leader_id=1,
        leader_epoch=7,
        replica_nodes=[1, 2, 3],
        isr_nodes=[1, 2],
        offline_replicas=[3],
    )
    topic = MR.MetadataResponseTopic(
        error_code=0,
        name="orders",
        topic_id=uuid.UUID(int=99),
        is_internal=False,
        partitions=[partition],
    )
    brokers = [
        MR.MetadataResponseBroker(
            node_id=i, host=f"b{i}.example", port=9092, rack="r1" if i else None
        )
        for i in range(3)
    ]
    kwargs: dict[str, Any] = {"brokers": brokers, "topics": [topic]}
    if version >= 1:
        kwargs["controller_id"] = 2
    if version >= 2:
        kwargs["cluster_id"] = "cluster-x"
    if version >= 3:
        kwargs["throttle_time_ms"] = 5
    return MR(version=version, **kwargs)


@pytest.mark.parametrize("version", range(0, 14))
def test_metadata_response_from_kafka_python(version: int) -> None:
    value = check_kp_bytes(ApiKey.METADATA, version, "response", metadata_response(version))
    assert value["Brokers"][1]["Host"] == "b1.example"
    assert value["Topics"][0]["Partitions"][0]["ReplicaNodes"] == [1, 2, 3]
    if version >= 10:
        assert value["Topics"][0]["TopicId"] == uuid.UUID(int=99)


@pytest.mark.parametrize("version", range(0, 14))
def test_metadata_request_from_kafka_python(version: int) -> None:
    topic = MetadataRequest.MetadataRequestTopic(name="orders")
    kwargs: dict[str, Any] = {"topics": [topic]}
    if version >= 4:
        kwargs["allow_auto_topic_creation"] = False
    value = check_kp_bytes(
        ApiKey.METADATA, version, "request", MetadataRequest(version=version, **kwargs)
    )
    assert value["Topics"][0]["Name"] == "orders"


@pytest.mark.parametrize("version", [3, 7, 9, 11, 12, 13])
def test_produce_request_from_kafka_python(version: int) -> None:
    T = ProduceRequest.TopicProduceData
    PD = T.PartitionProduceData
    topic: dict[str, Any] = {
        "partition_data": [PD(index=0, records=b"batch-bytes"), PD(index=1, records=None)]
    }
    if version >= 13:
        topic["topic_id"] = uuid.UUID(int=5)
    else:
        topic["name"] = "orders"
    req = ProduceRequest(
        version=version, transactional_id="tx", acks=-1, timeout_ms=1500, topic_data=[T(**topic)]
    )
    value = check_kp_bytes(ApiKey.PRODUCE, version, "request", req)
    records = value["TopicData"][0]["PartitionData"][0]["Records"]
    assert bytes(records) == b"batch-bytes"
    # Whole frames, header included: kafka-python's framed encoding is ours.
    req.with_header(correlation_id=41, client_id="producer-1")
    frame = bytes(req.encode(header=True, framed=True))
    header, body = kw.decode_request(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        0,
        version,
        41,
        "producer-1",
    )
    assert kw.encode_request(header, body) == frame


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_response_from_kafka_python(version: int) -> None:
    K = ApiVersionsResponse.ApiVersion
    keys = [K(api_key=k, min_version=0, max_version=v) for k, v in ((0, 11), (3, 12), (18, 4))]
    kwargs: dict[str, Any] = {"error_code": 0, "api_keys": keys}
    if version >= 1:
        kwargs["throttle_time_ms"] = 3
    if version >= 3:
        kwargs["finalized_features_epoch"] = 12  # a tagged field
    resp = ApiVersionsResponse(version=version, **kwargs)
    value = check_kp_bytes(ApiKey.API_VERSIONS, version, "response", resp)
    assert [k["ApiKey"] for k in value["ApiKeys"]] == [0, 3, 18]
    if version >= 3:
        assert value["FinalizedFeaturesEpoch"] == 12
    resp.with_header(correlation_id=8)
    frame = bytes(resp.encode(header=True, framed=True))
    cid, body = kw.decode_response(frame[4:], ApiKey.API_VERSIONS, version)
    assert cid == 8 and kw.encode_response(cid, ApiKey.API_VERSIONS, version, body) == frame


# -- every API and version kafka-python knows: our bytes survive its decode + encode ------


def build(s: StructSpec, version: int, nulls: bool, counter: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in s.fields:
        if f.present(version):
            out[f.name] = build_field(f, version, nulls, counter)
    return out


def build_field(f: FieldSpec, version: int, nulls: bool, counter: list[int]) -> Any:
    if nulls and in_versions(version, f.nullable):
        return None
    if f.is_array:
        return [build_scalar(f.elem_type, f, version, nulls, counter) for _ in range(2)]
    return build_scalar(f.type, f, version, nulls, counter)


def build_scalar(t: str, f: FieldSpec, version: int, nulls: bool, counter: list[int]) -> Any:
    counter[0] += 1
    i = counter[0]
    if t in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return i % 100 + 1
    if t == "bool":
        return True
    if t == "float64":
        return i / 4
    if t == "string":
        return f"s{i}"
    if t in ("bytes", "records"):
        return bytes([i % 256, 1, 2])
    if t == "uuid":
        return uuid.UUID(int=i)
    assert f.struct is not None
    return build(f.struct, version, nulls, counter)


@pytest.mark.parametrize(("api_key", "kind"), sorted(KP_CLASSES))
def test_kafka_python_rewrites_our_bytes_identically(api_key: int, kind: str) -> None:
    cls = KP_CLASSES[(api_key, kind)]
    lo, hi = cls._valid_versions
    for version in range(lo, hi + 1):
        s = _catalog.message_file(api_key, version, kind).spec().struct
        for nulls in (False, True):
            value = build(s, version, nulls, [0])
            if (api_key, kind) == (18, "response"):
                value["ErrorCode"] = 0  # kafka-python reads error responses at v0
            ours = kw.encode_body(api_key, version, kind, value)
            theirs = cls.decode(ours, version=version)
            assert kp_encode(theirs) == ours, (cls.__name__, version, nulls)
            assert to_snake(kw.decode_body(api_key, version, kind, ours)[0]) == kp_dict(theirs)

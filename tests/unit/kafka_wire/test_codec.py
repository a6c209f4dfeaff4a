"""The message codec: every (api key, version, kind) of the merged schema set round-trips.

Values are built from the schemas themselves, deterministically (every field set, once
with nullables null) and by hypothesis strategies; decode then encode must give the
same bytes and the same value, unknown tagged fields included.
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kafka_wire as kw
from kafka_wire import ApiKey, _catalog
from kafka_wire._schema import (
    FieldSpec,
    StructSpec,
    in_versions,
    parse_versions,
    registry,
    strip_comments,
)
from kafka_wire.errors import DecodeError, EncodeError, UnknownApiError

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


def all_messages() -> list[tuple[int, int, str]]:
    reg = registry()
    out = []
    for api_key, kind in sorted(reg.by_key):
        lo, hi = reg.key_range(api_key, kind)
        out += [(api_key, v, kind) for v in range(lo, hi + 1)]
    return out


ALL = all_messages()
APIS = sorted({(k, kind) for k, _, kind in ALL})


def spec_of(api_key: int, version: int, kind: str) -> tuple[StructSpec, bool]:
    f = _catalog.message_file(api_key, version, kind)
    return f.spec().struct, in_versions(version, f.flexible)


# -- deterministic values: every field set, distinct from its default ---------------------


class Builder:
    def __init__(self, version: int, flexible: bool, nulls: bool) -> None:
        self.version = version
        self.flexible = flexible
        self.nulls = nulls
        self.n = 0

    def tick(self) -> int:
        self.n += 1
        return self.n

    def struct(self, s: StructSpec, top: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in s.fields:
            if f.present(self.version):
                d[f.name] = self.field(f)
        if self.flexible and top:
            known = {f.tag for f in s.fields if f.is_tagged(self.version)}
            # Interleave with the known tags so the merge order is exercised.
            d["_unknown_tags"] = {999: b"future", **({} if 1 in known else {1: b""})}
        return d

    def field(self, f: FieldSpec) -> Any:
        nullable = in_versions(self.version, f.nullable)
        if self.nulls and nullable:
            return None
        if f.is_array:
            return [self.scalar(f.elem_type, f) for _ in range(2)]
        return self.scalar(f.type, f)

    def scalar(self, t: str, f: FieldSpec) -> Any:
        i = self.tick()
        if t in INT_RANGES:
            lo, hi = INT_RANGES[t]
            return lo + (i * 7919 + 1) % (hi - lo)
        if t == "bool":
            return True  # every bool default is false, except a few "true" ones
        if t == "float64":
            return i + 0.5
        if t == "string":
            return f"{f.name}-{i}-é"
        if t == "bytes":
            return bytes([i % 256]) * 3
        if t == "records":
            return memoryview(b"rec" + bytes([i % 256]))
        if t == "uuid":
            return uuid.UUID(int=i * 0x1234567)
        assert f.struct is not None
        return self.struct(f.struct)


def roundtrip(api_key: int, version: int, kind: str, value: dict[str, Any]) -> dict[str, Any]:
    raw = kw.encode_body(api_key, version, kind, value)
    decoded, end = kw.decode_body(api_key, version, kind, raw)
    assert end == len(raw)
    again = kw.encode_body(api_key, version, kind, decoded)
    assert again == raw, (api_key, version, kind)
    # Every input shape decodes alike.
    assert kw.decode_body(api_key, version, kind, memoryview(raw))[0] == decoded
    assert kw.decode_body(api_key, version, kind, bytearray(raw))[0] == decoded
    return decoded


@pytest.mark.parametrize(("api_key", "kind"), APIS, ids=[f"{k}-{kind}" for k, kind in APIS])
def test_every_version_roundtrips_with_every_field_set(api_key: int, kind: str) -> None:
    for key, version, k in ALL:
        if (key, k) != (api_key, kind):
            continue
        s, flexible = spec_of(api_key, version, kind)
        for nulls in (False, True):
            value = Builder(version, flexible, nulls).struct(s, top=True)
            decoded = roundtrip(api_key, version, kind, value)
            assert decoded == value, (version, nulls)


@pytest.mark.parametrize(("api_key", "kind"), APIS[:: max(1, len(APIS) // 12)])
def test_missing_fields_take_defaults(api_key: int, kind: str) -> None:
    lo, hi = kw.supported_versions(api_key) or (0, 0)
    for version in (lo, hi):
        raw = kw.encode_body(api_key, version, kind, {})
        decoded, _ = kw.decode_body(api_key, version, kind, raw)
        assert kw.encode_body(api_key, version, kind, decoded) == raw


def test_defaults_follow_the_schema() -> None:
    raw = kw.encode_body(ApiKey.METADATA, 12, "response", {})
    value, _ = kw.decode_body(ApiKey.METADATA, 12, "response", raw)
    assert value == {
        "ThrottleTimeMs": 0,
        "Brokers": [],
        "ClusterId": None,
        "ControllerId": -1,
        "Topics": [],
    }
    topic: dict[str, Any] = {"Partitions": [{}]}
    raw = kw.encode_body(ApiKey.METADATA, 12, "response", {"Topics": [topic]})
    value, _ = kw.decode_body(ApiKey.METADATA, 12, "response", raw)
    t = value["Topics"][0]
    assert t["Name"] == "" and t["TopicId"] == uuid.UUID(int=0)
    assert t["TopicAuthorizedOperations"] == -(2**31)
    assert t["Partitions"][0]["LeaderEpoch"] == -1
    req, _ = kw.decode_body(
        ApiKey.METADATA, 12, "request", kw.encode_body(ApiKey.METADATA, 12, "request", {})
    )
    assert req == {
        "Topics": [],
        "AllowAutoTopicCreation": True,
        "IncludeTopicAuthorizedOperations": False,
    }


def test_known_tagged_fields_written_only_when_not_default() -> None:
    # ApiVersionsResponse v3: SupportedFeatures (tag 0), FinalizedFeaturesEpoch (tag 1),
    # FinalizedFeatures (tag 2), ZkMigrationReady (tag 3).
    base = {"ErrorCode": 0, "ApiKeys": [], "ThrottleTimeMs": 0}
    plain = kw.encode_body(ApiKey.API_VERSIONS, 3, "response", base)
    assert plain.endswith(b"\x00")  # no tags
    value, _ = kw.decode_body(ApiKey.API_VERSIONS, 3, "response", plain)
    assert value["FinalizedFeaturesEpoch"] == -1 and value["SupportedFeatures"] == []
    with_epoch = kw.encode_body(
        ApiKey.API_VERSIONS, 3, "response", {**base, "FinalizedFeaturesEpoch": 5}
    )
    assert with_epoch.endswith(b"\x01\x01\x08" + struct.pack(">q", 5))
    unknown = {**base, "FinalizedFeaturesEpoch": 5, "_unknown_tags": {0x7F: b"a", 0: b""}}
    with pytest.raises(EncodeError):
        kw.encode_body(ApiKey.API_VERSIONS, 3, "response", unknown)  # tag 0 is SupportedFeatures
    unknown["_unknown_tags"] = {7: b"z", 4: b"y"}
    raw = kw.encode_body(ApiKey.API_VERSIONS, 3, "response", unknown)
    assert raw.endswith(b"\x03" + b"\x01\x08" + struct.pack(">q", 5) + b"\x04\x01y\x07\x01z")
    decoded, _ = kw.decode_body(ApiKey.API_VERSIONS, 3, "response", raw)
    assert decoded["_unknown_tags"] == {4: b"y", 7: b"z"}


def test_non_ignorable_field_missing_from_version_is_refused() -> None:
    # MetadataResponse TopicAuthorizedOperations (8+) is not ignorable.
    value = {"Topics": [{"Name": "t", "TopicAuthorizedOperations": 3}]}
    with pytest.raises(EncodeError, match="not ignorable"):
        kw.encode_body(ApiKey.METADATA, 7, "response", value)
    value["Topics"][0]["TopicAuthorizedOperations"] = -(2**31)
    kw.encode_body(ApiKey.METADATA, 7, "response", value)
    kw.encode_body(ApiKey.METADATA, 0, "response", {"ControllerId": 5})  # ignorable: dropped


def test_bad_values_raise_encode_error() -> None:
    for value in (
        {"Brokers": [{"NodeId": "x"}]},
        {"Brokers": [{"Host": None}]},
        {"Brokers": None},
        {"Brokers": [{"Port": 2**40}]},
        {"Topics": [{"TopicId": b"short"}]},
        {"Topics": [5]},
        {"_unknown_tags": {"x": b""}},
    ):
        with pytest.raises(EncodeError):
            kw.encode_body(ApiKey.METADATA, 12, "response", value)


def test_uuid_accepts_bytes_and_records_accept_any_buffer() -> None:
    u = uuid.UUID(int=42)
    a = kw.encode_body(ApiKey.METADATA, 12, "response", {"Topics": [{"TopicId": u}]})
    b = kw.encode_body(ApiKey.METADATA, 12, "response", {"Topics": [{"TopicId": u.bytes}]})
    assert a == b
    partition: dict[str, Any] = {"Index": 0, "Records": b"xyz"}
    req = {"Acks": -1, "TimeoutMs": 5, "TopicData": [{"Name": "t", "PartitionData": [partition]}]}
    raw = kw.encode_body(ApiKey.PRODUCE, 9, "request", req)
    partition["Records"] = memoryview(b"xyz")
    assert kw.encode_body(ApiKey.PRODUCE, 9, "request", req) == raw
    partition["Records"] = bytearray(b"xyz")
    assert kw.encode_body(ApiKey.PRODUCE, 9, "request", req) == raw


def test_records_are_zero_copy_views_over_bytes() -> None:
    topic = {"Name": "t", "PartitionData": [{"Index": 0, "Records": b"r" * 100}]}
    raw = kw.encode_body(ApiKey.PRODUCE, 9, "request", {"TopicData": [topic]})
    records = kw.decode_body(ApiKey.PRODUCE, 9, "request", raw)[0]["TopicData"][0]["PartitionData"][
        0
    ]["Records"]
    assert isinstance(records, memoryview) and records.obj is raw and bytes(records) == b"r" * 100
    # Over a mutable buffer the records are copied, so the buffer stays resizable.
    buf = bytearray(raw)
    value, _ = kw.decode_body(ApiKey.PRODUCE, 9, "request", buf)
    buf += b"more"
    assert bytes(value["TopicData"][0]["PartitionData"][0]["Records"]) == b"r" * 100


def test_nullable_struct_marker() -> None:
    # ConsumerGroupHeartbeatResponse.Assignment is a nullable struct: int8 -1 or 1.
    null = kw.encode_body(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, "response", {"Assignment": None})
    full = kw.encode_body(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, "response", {"Assignment": {"TopicPartitions": []}}
    )
    assert len(full) == len(null) + 2  # marker 1 + empty array + empty tags, vs marker -1
    bad = bytearray(null)
    marker = bad.rindex(b"\xff")
    bad[marker] = 2
    with pytest.raises(DecodeError, match="null marker"):
        kw.decode_body(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, "response", bytes(bad))


# -- hypothesis: values drawn from strategies built from the schemas --------------------


def scalar_strategy(t: str, f: FieldSpec, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    if t in INT_RANGES:
        return st.integers(*INT_RANGES[t])
    if t == "bool":
        return st.booleans()
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "string":
        return st.text(max_size=6)
    if t == "bytes":
        return st.binary(max_size=6)
    if t == "records":
        return st.binary(max_size=8).map(memoryview)
    if t == "uuid":
        return st.uuids()
    assert f.struct is not None
    return struct_strategy(f.struct, version, flexible)


def field_strategy(f: FieldSpec, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    inner = scalar_strategy(f.elem_type, f, version, flexible)
    if f.is_array:
        inner = st.lists(inner, max_size=2)
    if in_versions(version, f.nullable):
        return st.none() | inner
    return inner


def struct_strategy(
    s: StructSpec, version: int, flexible: bool
) -> st.SearchStrategy[dict[str, Any]]:
    fields = {f.name: field_strategy(f, version, flexible) for f in s.fields if f.present(version)}
    if not flexible:
        return st.fixed_dictionaries(fields)
    # Unknown tags at any level, among the known ones.
    known = {f.tag for f in s.fields if f.is_tagged(version)}
    tags = st.integers(0, 40).filter(lambda t: t not in known)
    unknown = st.dictionaries(tags, st.binary(max_size=3), min_size=1, max_size=2)
    return st.fixed_dictionaries(fields, optional={"_unknown_tags": unknown})


@st.composite
def message(draw: st.DrawFn) -> tuple[int, int, str, dict[str, Any]]:
    api_key, version, kind = draw(st.sampled_from(ALL))
    s, flexible = spec_of(api_key, version, kind)
    return api_key, version, kind, draw(struct_strategy(s, version, flexible))


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(message())
def test_property_roundtrip(msg: tuple[int, int, str, dict[str, Any]]) -> None:
    api_key, version, kind, value = msg
    decoded = roundtrip(api_key, version, kind, value)
    assert decoded == value


# -- hostile input -----------------------------------------------------------------------


def sample_frames() -> Iterator[tuple[int, int, str, bytes]]:
    for api_key, version, kind in ALL[::7]:
        s, flexible = spec_of(api_key, version, kind)
        value = Builder(version, flexible, nulls=False).struct(s, top=True)
        yield api_key, version, kind, kw.encode_body(api_key, version, kind, value)


def test_every_truncation_raises_decode_error() -> None:
    for api_key, version, kind, raw in sample_frames():
        for cut in range(len(raw) - 1, -1, -max(1, len(raw) // 40)):
            with pytest.raises(DecodeError):
                kw.decode_body(api_key, version, kind, raw[:cut])


def test_hostile_lengths_do_not_allocate() -> None:
    # MetadataResponse v0: Brokers is an int32-counted array.
    with pytest.raises(DecodeError, match="cannot fit"):
        kw.decode_body(ApiKey.METADATA, 0, "response", struct.pack(">i", 2**31 - 1) + b"\x00" * 8)
    # Flexible: a 5-byte varint count.
    with pytest.raises(DecodeError):
        kw.decode_body(ApiKey.METADATA, 12, "response", b"\x00" * 4 + b"\xff\xff\xff\xff\x07")
    with pytest.raises(DecodeError, match="longer than 5"):
        kw.decode_body(ApiKey.METADATA, 12, "response", b"\x00" * 4 + b"\xff" * 9)
    # Strings and bytes cannot read past the end.
    with pytest.raises(DecodeError):
        kw.decode_body(ApiKey.METADATA, 1, "request", struct.pack(">ih", 1, 30000) + b"ab")
    # A tagged-field count of 2**31 with nothing behind it.
    with pytest.raises(DecodeError):
        kw.decode_body(ApiKey.API_VERSIONS, 3, "request", b"\x01\x01\xff\xff\xff\xff\x07")


def test_bad_lengths_and_markers_raise_decode_error() -> None:
    with pytest.raises(DecodeError, match="non-nullable"):
        kw.decode_body(ApiKey.METADATA, 0, "request", struct.pack(">ih", 1, -1))
    with pytest.raises(DecodeError, match="bad length"):
        # Brokers: [NodeId 1, Host "h", Port 9, Rack with length -2]
        broker = struct.pack(">ih", 1, 1) + b"h" + struct.pack(">ih", 9, -2)
        kw.decode_body(ApiKey.METADATA, 1, "response", struct.pack(">i", 1) + broker)
    with pytest.raises(DecodeError, match="utf-8"):
        kw.decode_body(ApiKey.METADATA, 0, "request", struct.pack(">ih", 1, 2) + b"\xff\xfe")
    with pytest.raises(DecodeError, match="offset"):
        kw.decode_body(ApiKey.METADATA, 0, "request", b"", offset=5)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_requests_raise_only_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        kw.decode_request(data)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.sampled_from(ALL), st.binary(max_size=48))
def test_garbage_bodies_raise_only_decode_error(msg: tuple[int, int, str], data: bytes) -> None:
    api_key, version, kind = msg
    try:
        value, _ = kw.decode_body(api_key, version, kind, data)
    except DecodeError:
        return
    # Whatever decodes is a value the codec can write again.
    kw.encode_body(api_key, version, kind, value)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.sampled_from(ALL), st.data())
def test_bit_flips_raise_only_decode_error(msg: tuple[int, int, str], data: st.DataObject) -> None:
    api_key, version, kind = msg
    s, flexible = spec_of(api_key, version, kind)
    value = Builder(version, flexible, False).struct(s)
    raw = bytearray(kw.encode_body(api_key, version, kind, value))
    if not raw:
        return
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255))
    with contextlib.suppress(DecodeError):
        kw.decode_body(api_key, version, kind, bytes(raw))


# -- headers and frames -----------------------------------------------------------------


def test_header_versions_follow_kafka() -> None:
    request, response = kw.request_header_version, kw.response_header_version
    for header_version, api_key, version, expected in [
        (request, ApiKey.METADATA, 8, 1),
        (request, ApiKey.METADATA, 9, 2),
        (request, ApiKey.CONTROLLED_SHUTDOWN, 0, 0),
        (request, ApiKey.CONTROLLED_SHUTDOWN, 1, 1),
        (response, ApiKey.METADATA, 8, 0),
        (response, ApiKey.METADATA, 9, 1),
        (response, ApiKey.API_VERSIONS, 3, 0),
        (request, ApiKey.API_VERSIONS, 3, 2),
    ]:
        assert header_version(api_key, version) == expected, (header_version, api_key, version)
    # A version newer than the schemas still has a header version (flexible is "N+").
    assert kw.request_header_version(ApiKey.PRODUCE, 99) == 2
    with pytest.raises(UnknownApiError):
        kw.request_header_version(9999, 0)
    with pytest.raises(UnknownApiError):
        kw.request_header_version(ApiKey.METADATA, -1)


@pytest.mark.parametrize("version", [0, 3, 8, 9, 13])
def test_request_frames_roundtrip(version: int) -> None:
    tagged = {5: b"t"} if version >= 9 else {}
    header = kw.RequestHeader(ApiKey.METADATA, version, 77, "client-é", tagged)
    body: dict[str, Any] = {"Topics": [{"Name": "a"}]}
    if version >= 4:
        body["AllowAutoTopicCreation"] = False
    frame = kw.encode_request(header, body)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    h, value = kw.decode_request(frame[4:])
    assert h == header
    assert kw.encode_request(h, value) == frame
    h2, off = kw.read_request_header(frame[4:])
    assert kw.write_request_header(h2) == frame[4 : 4 + off]


def test_request_header_variants() -> None:
    h = kw.RequestHeader(ApiKey.CONTROLLED_SHUTDOWN, 0, 1, "ignored")
    assert kw.write_request_header(h) == struct.pack(">hhi", 7, 0, 1)
    h = kw.RequestHeader(ApiKey.API_VERSIONS, 3, 1, None)
    raw = kw.write_request_header(h)
    assert raw == struct.pack(">hhih", 18, 3, 1, -1) + b"\x00"  # ClientId is never compact
    assert kw.read_request_header(raw) == (h, len(raw))
    with pytest.raises(EncodeError):
        kw.write_request_header(kw.RequestHeader(ApiKey.METADATA, 1, 1, None, {1: b""}))
    with pytest.raises(DecodeError):
        kw.read_request_header(struct.pack(">hhih", 3, 1, 1, 5) + b"ab")


def test_response_frames_roundtrip() -> None:
    body = {"ErrorCode": 0, "ApiKeys": [{"ApiKey": 0, "MinVersion": 0, "MaxVersion": 11}]}
    frame = kw.encode_response(9, ApiKey.API_VERSIONS, 3, body)
    # ApiVersionsResponse: header v0 (no tag section) even though the body is flexible.
    assert frame[4:8] == struct.pack(">i", 9) and frame[8:10] == b"\x00\x00"
    cid, value = kw.decode_response(frame[4:], ApiKey.API_VERSIONS, 3)
    assert cid == 9 and kw.encode_response(cid, ApiKey.API_VERSIONS, 3, value) == frame
    frame = kw.encode_response(10, ApiKey.METADATA, 12, {}, tagged={3: b"x"})
    cid, tags, off = kw.read_response_header(frame[4:], ApiKey.METADATA, 12)
    assert (cid, tags) == (10, {3: b"x"})
    assert kw.write_response_header(cid, ApiKey.METADATA, 12, tags) == frame[4 : 4 + off]
    with pytest.raises(DecodeError, match="trailing"):
        kw.decode_response(frame[4:] + b"\x00", ApiKey.METADATA, 12)


# -- catalog and schemas ----------------------------------------------------------------


def test_catalog() -> None:
    assert kw.api_name(ApiKey.METADATA) == "Metadata" and kw.api_name(ApiKey.PRODUCE) == "Produce"
    assert kw.api_name(12345) is None and kw.supported_versions(12345) is None
    keys = kw.known_api_keys()
    assert keys == sorted(keys) and {0, 1, 3, 18, 74} <= set(keys)
    assert kw.supported_versions(ApiKey.PRODUCE) == (0, 13)  # 2024: 0-11, kafka-python: 3-13
    assert kw.supported_versions(ApiKey.METADATA) == (0, 13)
    assert kw.supported_versions(ApiKey.FETCH) == (0, 18)
    with pytest.raises(UnknownApiError):
        kw.decode_body(ApiKey.PRODUCE, 14, "request", b"")
    with pytest.raises(UnknownApiError):
        kw.encode_body(ApiKey.METADATA, 0, "reply", {})
    with pytest.raises(DecodeError):  # UnknownApiError is a DecodeError ...
        kw.decode_body(9999, 0, "request", b"")
    with pytest.raises(EncodeError):  # ... and an EncodeError
        kw.encode_body(9999, 0, "request", {})


def test_the_brokers_schemas_win_then_the_newer_then_the_older() -> None:
    reg = registry()
    assert reg.file_for("ProduceRequest", 2).source == "2024"  # removed by Kafka 4.0
    assert reg.file_for("ProduceRequest", 3).source == "kafka-4.1.1"
    assert reg.file_for("ProduceRequest", 13).source == "kafka-4.1.1"
    assert reg.file_for("MetadataResponse", 12).source == "kafka-4.1.1"
    assert reg.file_for("ShareFetchRequest", 1).source == "kafka-4.1.1"
    assert reg.file_for("ListOffsetsRequest", 11).source == "newer"  # past Kafka 4.1.1
    assert reg.file_for("FetchRequest", 3).source == "2024"
    # Api key 74 was renamed: v0 exists under both names, v1 only under the new one.
    assert (
        reg.file_for_key(ApiKey.LIST_CONFIG_RESOURCES, "request", 0).name
        == "ListConfigResourcesRequest"
    )
    assert reg.file_for("ListClientMetricsResourcesRequest", 0).source == "2024"
    assert kw.api_name(
        ApiKey.LIST_CONFIG_RESOURCES
    ) == "ListConfigResources" and kw.supported_versions(ApiKey.LIST_CONFIG_RESOURCES) == (0, 1)
    # Every version between min and max resolves (no gap between the two sets).
    for api_key, version, kind in ALL:
        _catalog.message_file(api_key, version, kind)


def test_heads_match_full_parse() -> None:
    for files in registry().by_name.values():
        for f in files:
            spec = f.spec()
            assert (spec.name, spec.kind, spec.api_key, spec.valid, spec.flexible) == (
                f.name,
                f.kind,
                f.api_key,
                f.valid,
                f.flexible,
            )


def test_comment_stripping_keeps_slashes_in_strings() -> None:
    text = '{ "a": "http://x//y", // comment "b": 1\n "c": "q\\"//" } // end'
    assert strip_comments(text) == '{ "a": "http://x//y", \n "c": "q\\"//" } '


def test_parse_versions() -> None:
    assert parse_versions("3+")[0] == 3 and parse_versions("3+")[1] >= 2**15 - 1
    assert parse_versions("0-11") == (0, 11)
    assert parse_versions("5") == (5, 5)
    assert not in_versions(0, parse_versions("none"))


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_data_schemas_by_name(version: int) -> None:
    sub = {
        "Topics": ["a", "b"],
        "UserData": b"u",
        "OwnedPartitions": [{"Topic": "a", "Partitions": [0, 1]}],
        "GenerationId": 4,
        "RackId": "r",
    }
    raw = kw.encode_struct("ConsumerProtocolSubscription", version, sub)
    value, end = kw.decode_struct("ConsumerProtocolSubscription", version, raw)
    assert end == len(raw)
    assert kw.encode_struct("ConsumerProtocolSubscription", version, value) == raw
    assert value["Topics"] == ["a", "b"] and value["UserData"] == b"u"
    if version == 0:  # v0 is Topics + UserData: int16 + strings, int32 + bytes, not compact
        assert raw == b"\x00\x00\x00\x02\x00\x01a\x00\x01b\x00\x00\x00\x01u"
    with pytest.raises(UnknownApiError):
        kw.decode_struct("NoSuchThing", 0, raw)


def test_lazy_compile_is_cached() -> None:
    a = _catalog.reader_for(ApiKey.METADATA, 12, "response")
    assert _catalog.reader_for(ApiKey.METADATA, 12, "response") is a

"""Answers reach the client in request order, whatever filters hold, answer or forward.

A request's slot in the answer order is taken when its head is read. These property
tests mix held requests (decided after later requests passed), requests the gateway
answers itself, acks=0 Produce requests (no answer, forwarded or refused) and plain
pass-through requests, split the streams at every offset, and check the client sees
exactly one answer per answerable request, in order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import BaseFilter, Direction, RequestContext, RequestVerdict
from ext_proc.session import KafkaSession
from kafka_wire import ApiKey
from kafka_wire.error_responses import error_response

CONN = ConnectionInfo(gateway_address="gw:19092", routes={1: ("gw", 19092)})
# What happens to each request: the API it is, and what the filter decides.
FATES = ("pass", "held-forward", "held-answer", "acks0-pass", "acks0-held-refuse")
HELD_API = ApiKey.METADATA  # the filter holds Metadata and acks=0 Produce requests it refuses
LIST_OFFSETS_VERSION, METADATA_VERSION, PRODUCE_VERSION = 7, 12, 9


@dataclass
class Plan(BaseFilter):
    """A filter deciding each held request by its correlation id."""

    fates: dict[int, str]

    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        return direction == "request" and api_key in (HELD_API, ApiKey.PRODUCE)

    def on_request(self, ctx: RequestContext) -> None:
        ctx.decide(self.judge(ctx.header, ctx.body))

    def judge(self, header: kafka_wire.RequestHeader,
              body: dict[str, Any]) -> RequestVerdict | None:
        fate = self.fates[header.correlation_id]
        if fate in ("held-answer", "acks0-held-refuse"):
            answer = error_response(header.api_key, header.api_version, body, 29)
            return RequestVerdict(answer=answer, expects_response=fate == "held-answer")
        if fate == "acks0-pass":
            return RequestVerdict(expects_response=False)
        return None


def request_frame(cid: int, fate: str) -> bytes:
    if fate.startswith("acks0"):
        api_key, version = ApiKey.PRODUCE, PRODUCE_VERSION
        body: dict[str, Any] = {"Acks": 0, "TimeoutMs": 1000, "TopicData": [
            {"Name": "t", "PartitionData": [{"Index": 0, "Records": None}]}]}
    elif fate == "pass":
        api_key, version = ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION
        body = {"ReplicaId": -1, "Topics": [{"Name": "t", "Partitions": [
            {"PartitionIndex": 0, "Timestamp": -1}]}]}
    else:
        api_key, version = ApiKey.METADATA, METADATA_VERSION
        body = {"Topics": [{"Name": "t"}]}
    header = kafka_wire.RequestHeader(api_key, version, cid, "order-test", {})
    return kafka_wire.encode_request(header, body)


def broker_answers(forwarded: bytes) -> bytes:
    """What the broker sends back for the requests it got: an answer each, in order,
    none for acks=0 Produce."""
    out = bytearray()
    pos = 0
    while pos < len(forwarded):
        size = int.from_bytes(forwarded[pos:pos + 4], "big", signed=True)
        header, body = kafka_wire.decode_request(forwarded[pos + 4:pos + 4 + size])
        pos += 4 + size
        if header.api_key == ApiKey.PRODUCE and body["Acks"] == 0:
            continue
        answer = error_response(header.api_key, header.api_version, body, 0)
        out += kafka_wire.encode_response(header.correlation_id, header.api_key,
                                          header.api_version, answer)
    return bytes(out)


def client_order(stream: bytes) -> list[int]:
    cids, pos = [], 0
    while pos < len(stream):
        size = int.from_bytes(stream[pos:pos + 4], "big", signed=True)
        cids.append(int.from_bytes(stream[pos + 4:pos + 8], "big", signed=True))
        pos += 4 + size
    return cids


def run(fates: list[str], request_cuts: list[int], response_cuts: list[int]) -> list[int]:
    plan = Plan(dict(enumerate(fates, start=1)))
    session = KafkaSession(CONN, [plan])
    requests = b"".join(request_frame(cid, fate) for cid, fate in plan.fates.items())
    to_broker, to_client = bytearray(), bytearray()
    for piece in cut(requests, request_cuts):
        to_broker += session.from_client(piece)
        to_client += session.take_client_bytes()  # what the adapter sends unsolicited
    for piece in cut(broker_answers(bytes(to_broker)), response_cuts):
        to_client += session.from_broker(piece)
    to_client += session.take_client_bytes()
    return client_order(bytes(to_client))


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def expected(fates: list[str]) -> list[int]:
    return [cid for cid, fate in enumerate(fates, start=1) if not fate.startswith("acks0")]


@settings(max_examples=300, deadline=None)
@given(fates=st.lists(st.sampled_from(FATES), min_size=1, max_size=12),
       request_cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
       response_cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6))
def test_answers_follow_request_order(fates: list[str], request_cuts: list[int],
                                      response_cuts: list[int]) -> None:
    assert run(fates, request_cuts, response_cuts) == expected(fates)


def test_every_split_of_a_held_request_before_a_passing_one() -> None:
    """The shape users hit: a held Metadata (rate rule) then a ListOffsets that passes."""
    fates = ["held-forward", "pass", "held-answer", "pass", "acks0-held-refuse", "pass"]
    requests = b"".join(request_frame(cid, f) for cid, f in enumerate(fates, start=1))
    for request_cut in range(len(requests) + 1):
        assert run(fates, [request_cut], []) == expected(fates)
    for response_cut in range(400):  # the answers are shorter: every cut falls inside
        assert run(fates, [], [response_cut]) == expected(fates)

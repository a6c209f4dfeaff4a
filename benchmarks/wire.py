"""Kafka frames on a bare socket, for benchmarks whose point is the exact answer to one
request (no client library's retries or cached topic state in between)."""

from __future__ import annotations

import socket
import struct

import cramjam
import google_crc32c

import kafka_wire
from kafka_wire import ApiKey
from kafka_wire.compression import Compression
from kafka_wire.records import BatchHeader, Record, encode_batch

PRODUCE_VERSION = 9


def exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from `sock`; ConnectionError when the peer closes before them."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the gateway closed the connection")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> bytes:
    """One Kafka frame, without its size prefix."""
    return exactly(sock, int.from_bytes(exactly(sock, 4), "big"))


def produce_frame(cid: int, topic: str, records: bytes, client_id: str = "bomber") -> bytes:
    """A Produce v9 request (acks=all) of one batch to partition 0 of `topic`."""
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 10000, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": 0, "Records": records}]}]}
    return kafka_wire.encode_request(
        kafka_wire.RequestHeader(ApiKey.PRODUCE, PRODUCE_VERSION, cid, client_id, {}), body)


def produce_answer(sock: socket.socket, cid: int, topic: str, records: bytes,
                   client_id: str = "bomber") -> tuple[int, str | None]:
    """Send a Produce of `records` on `sock` and read its answer: (error code, message)."""
    sock.sendall(produce_frame(cid, topic, records, client_id))
    correlation, answer = kafka_wire.decode_response(read_frame(sock), ApiKey.PRODUCE,
                                                     PRODUCE_VERSION)
    if correlation != cid:
        raise ConnectionError(f"answer {correlation} to request {cid}")
    partition = answer["Responses"][0]["PartitionResponses"][0]
    return int(partition["ErrorCode"]), partition["ErrorMessage"]


def record_count_bomb(records: int = 1_000_000) -> bytes:
    """A zstd batch claiming `records` records whose payload is a few hundred bytes of
    zstd expanding to `records` minimal records (7 bytes each)."""
    one = encode_batch(BatchHeader(base_timestamp=1_700_000_000_000),
                       [Record(0, 0, None, b"", [])])
    record = one[61:]  # a 7-byte record: length, attributes, deltas, null key, empty value
    payload = bytes(cramjam.zstd.compress(record * records, level=19))
    data = bytearray(one[:61]) + payload
    struct.pack_into(">h", data, 21, int(Compression.ZSTD))  # attributes
    struct.pack_into(">i", data, 23, records - 1)  # last offset delta
    struct.pack_into(">i", data, 57, records)  # records count
    struct.pack_into(">i", data, 8, len(data) - 12)  # batch length
    struct.pack_into(">I", data, 17, google_crc32c.value(bytes(data[21:])))
    return bytes(data)

"""Kafka frames over a bare socket, through kafka_wire: for tests that check the exact
protocol (a raw connection) or sit between a client and the gateway (relays)."""

from __future__ import annotations

import socket
import struct
from typing import Any

import kafka_wire
from kafka_wire.records import BatchHeader, Record, encode_batch

SIZE = struct.Struct(">i")


# Metadata v12 for every topic: with a topic rule the service judges each answer too.
ALL_TOPICS_METADATA = {"Topics": None, "AllowAutoTopicCreation": False,
                       "IncludeTopicAuthorizedOperations": False}


def pipelined_metadata(count: int, client_id: str) -> bytes:
    """`count` Metadata v12 requests for every topic, correlation ids 1..count, as one
    run of bytes a client pipelines."""
    return b"".join(
        kafka_wire.encode_request(
            kafka_wire.RequestHeader(kafka_wire.ApiKey.METADATA, 12, correlation, client_id,
                                     {}), ALL_TOPICS_METADATA)
        for correlation in range(1, count + 1))


def produce_frame(topic: str, correlation: int, client_id: str, value: bytes) -> bytes:
    """Produce v9 (acks=all) of one record, `value`, to partition 0 of `topic`."""
    record = Record(0, 0, f"k{correlation}".encode(), value, [])
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 30_000, "TopicData": [
        {"Name": topic, "PartitionData": [
            {"Index": 0, "Records": encode_batch(BatchHeader(base_timestamp=1), [record])}]}]}
    return kafka_wire.encode_request(
        kafka_wire.RequestHeader(kafka_wire.ApiKey.PRODUCE, 9, correlation, client_id, {}), body)


def read_exact(sock: socket.socket, n: int) -> bytes | None:
    """`n` bytes, or None once the peer has closed (or the socket failed) before them."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket) -> bytes | None:
    """One frame without its size prefix, or None at the end of the stream."""
    head = read_exact(sock, 4)
    if head is None:
        return None
    return read_exact(sock, SIZE.unpack(head)[0])


class RawConnection:
    """A bare Kafka connection speaking through kafka_wire, for exact protocol checks."""

    def __init__(self, bootstrap: str, client_id: str = "raw-test", timeout: float = 10) -> None:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.client_id = client_id
        self.correlation = 0

    def request(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        self.correlation += 1
        header = kafka_wire.RequestHeader(api_key, version, self.correlation, self.client_id, {})
        self.sock.sendall(kafka_wire.encode_request(header, body))
        frame = read_frame(self.sock)
        if frame is None:
            raise ConnectionError("closed")
        correlation, response = kafka_wire.decode_response(frame, api_key, version)
        assert correlation == self.correlation
        return response

    def close(self) -> None:
        self.sock.close()

"""A recording relay: a mini gateway in front of the gateway, for tests that must see
the exact frames real clients and the gateway exchanged.

It forwards bytes to one gateway listener, records every frame, and (like the gateway
itself) rewrites the broker addresses in Metadata/FindCoordinator/DescribeCluster
answers to point at itself, so every connection of a client keeps going through it.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import kafka_wire as kw
from kafka_wire import ApiKey
from keg.gateway import Gateway
from tests.integration.raw_kafka import SIZE, read_frame

# -- the recording relay ----------------------------------------------------------------


@dataclass
class Recorded:
    seq: int
    direction: str  # "request" or "response"
    api_key: int
    api_version: int
    correlation_id: int
    frame: bytes  # as the client sent it / as the gateway answered (before any rewrite)


@dataclass
class Connection:
    number: int
    frames: list[Recorded] = field(default_factory=list)
    client_id: str | None = None


def _send(sock: socket.socket, frame: bytes) -> bool:
    try:
        sock.sendall(SIZE.pack(len(frame)) + frame)
    except OSError:
        return False
    return True


class RecordingRelay:
    """Listens on one port, forwards to `upstream` frame by frame, records every frame."""

    REWRITE = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER})

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = "127.0.0.1", self.listener.getsockname()[1]
        self.connections: list[Connection] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def snapshot(self) -> list[Connection]:
        with self._lock:
            return [Connection(c.number, list(c.frames), c.client_id) for c in self.connections]

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream, timeout=None)
            with self._lock:
                conn = Connection(len(self.connections))
                self.connections.append(conn)
                self._sockets += [client, upstream]
            in_flight: dict[int, tuple[int, int]] = {}
            threading.Thread(target=self._requests, args=(conn, client, upstream, in_flight),
                             daemon=True).start()
            threading.Thread(target=self._responses, args=(conn, client, upstream, in_flight),
                             daemon=True).start()

    def _record(self, conn: Connection, direction: str, api_key: int, version: int,
                correlation_id: int, frame: bytes) -> None:
        with self._lock:
            conn.frames.append(
                Recorded(next(self._seq), direction, api_key, version, correlation_id, frame))

    def _requests(self, conn: Connection, client: socket.socket, upstream: socket.socket,
                  in_flight: dict[int, tuple[int, int]]) -> None:
        while (frame := read_frame(client)) is not None:
            header, _ = kw.read_request_header(frame)
            conn.client_id = header.client_id
            # Recorded (and remembered) before it is sent: its answer cannot come first.
            in_flight[header.correlation_id] = (header.api_key, header.api_version)
            self._record(conn, "request", header.api_key, header.api_version,
                         header.correlation_id, frame)
            if not _send(upstream, frame):
                break
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def _responses(self, conn: Connection, client: socket.socket, upstream: socket.socket,
                   in_flight: dict[int, tuple[int, int]]) -> None:
        while (frame := read_frame(upstream)) is not None:
            (correlation_id,) = SIZE.unpack_from(frame)
            api_key, version = in_flight.pop(correlation_id)
            self._record(conn, "response", api_key, version, correlation_id, frame)
            if api_key in self.REWRITE:
                frame = self._point_at_relay(frame, api_key, version)
            if not _send(client, frame):
                break  # the client left before its answer: nothing to deliver it to
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def _point_at_relay(self, frame: bytes, api_key: int, version: int) -> bytes:
        """The single broker's address, wherever an answer names it, becomes the relay's."""
        correlation_id, tags, off = kw.read_response_header(frame, api_key, version)
        body, _ = kw.decode_body(api_key, version, "response", frame, off)
        entries: list[dict[str, Any]] = []
        if api_key in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
            entries = body.get("Brokers") or []
        elif "Coordinators" in body:
            entries = body["Coordinators"] or []
        elif body.get("NodeId", -1) >= 0:
            entries = [body]
        for entry in entries:
            entry["Host"], entry["Port"] = self.host, self.port
        header = kw.write_response_header(correlation_id, api_key, version, tags)
        return header + kw.encode_body(api_key, version, "response", body)


def gateway_listener(gateway: Gateway) -> tuple[str, int]:
    assert gateway.control_plane is not None and gateway.control_plane.plan is not None
    plan = gateway.control_plane.plan
    assert len(plan.routes) == 1, "the relay fronts a single-broker cluster"
    return plan.advertised_host, plan.routes[0].listen_port

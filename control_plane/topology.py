"""Broker discovery: ask the bootstrap servers for the cluster's brokers (Metadata)."""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass, field
from typing import Any

import kafka_wire
from kafka_wire import ApiKey

log = logging.getLogger(__name__)

_METADATA_VERSION = 12  # the newest the codec and Kafka 2.8+ share; older brokers get less
_SIZE = struct.Struct(">i")
_CLIENT_ID = "keg-control-plane"


class DiscoveryError(RuntimeError):
    """No bootstrap server answered a Metadata request."""


@dataclass(frozen=True)
class Broker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class Topology:
    cluster_id: str | None
    brokers: tuple[Broker, ...]

    def broker(self, node_id: int) -> Broker | None:
        return next((b for b in self.brokers if b.node_id == node_id), None)


async def _round_trip(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    header: kafka_wire.RequestHeader,
    body: dict[str, Any],
) -> dict[str, Any]:
    writer.write(kafka_wire.encode_request(header, body))
    await writer.drain()
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    frame = await reader.readexactly(size)
    _, response = kafka_wire.decode_response(frame, header.api_key, header.api_version)
    return response


@dataclass(frozen=True)
class SaslPlain:
    """Credentials for a SASL/PLAIN listener (never logged: repr hides the password)."""

    username: str
    password: str = field(repr=False)


async def fetch_topology(bootstrap: str, timeout: float = 10.0,
                         sasl: SaslPlain | None = None) -> Topology:
    """Metadata from the first bootstrap server that answers."""
    errors: list[str] = []
    for server in filter(None, (s.strip() for s in bootstrap.split(","))):
        host, _, port = server.rpartition(":")
        try:
            return await asyncio.wait_for(_fetch_from(host.strip("[]"), int(port), sasl),
                                          timeout)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as err:
            errors.append(f"{server}: {err or type(err).__name__}")
    raise DiscoveryError("no bootstrap server answered: " + "; ".join(errors))


async def _authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        sasl: SaslPlain) -> None:
    handshake = await _round_trip(
        reader, writer, kafka_wire.RequestHeader(ApiKey.SASL_HANDSHAKE, 1, 10, _CLIENT_ID, {}),
        {"Mechanism": "PLAIN"},
    )
    if handshake["ErrorCode"]:
        raise DiscoveryError(f"SASL PLAIN refused (error {handshake['ErrorCode']}); "
                             f"broker offers {handshake.get('Mechanisms')}")
    token = b"\0" + sasl.username.encode() + b"\0" + sasl.password.encode()
    answer = await _round_trip(
        reader, writer, kafka_wire.RequestHeader(ApiKey.SASL_AUTHENTICATE, 1, 11, _CLIENT_ID, {}),
        {"AuthBytes": token},
    )
    if answer["ErrorCode"]:
        raise DiscoveryError(f"SASL authentication as {sasl.username} failed: "
                             f"{answer.get('ErrorMessage')}")


async def _fetch_from(host: str, port: int, sasl: SaslPlain | None = None) -> Topology:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        versions = await _round_trip(
            reader, writer, kafka_wire.RequestHeader(ApiKey.API_VERSIONS, 0, 1, _CLIENT_ID, {}), {},
        )
        if sasl is not None:
            await _authenticate(reader, writer, sasl)
        ranges = {e["ApiKey"]: e["MaxVersion"] for e in versions["ApiKeys"]}
        version = min(_METADATA_VERSION, ranges.get(ApiKey.METADATA, 1))
        metadata = await _round_trip(
            reader, writer, kafka_wire.RequestHeader(ApiKey.METADATA, version, 2, _CLIENT_ID, {}),
            {"Topics": []},
        )
    finally:
        writer.close()
    brokers = tuple(sorted(
        (Broker(b["NodeId"], b["Host"], b["Port"], b.get("Rack")) for b in metadata["Brokers"]),
        key=lambda b: b.node_id,
    ))
    cluster_id = metadata.get("ClusterId")
    return Topology(cluster_id if isinstance(cluster_id, str) else None, brokers)

"""Broker discovery: ask the bootstrap servers for the cluster's brokers (Metadata)."""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass

import kafka_wire
from kafka_wire.api_keys import API_VERSIONS, METADATA

log = logging.getLogger(__name__)

_METADATA_VERSION = 12  # the newest the codec and Kafka 2.8+ share; older brokers get less
_SIZE = struct.Struct(">i")


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
    body: dict[str, object],
) -> dict[str, object]:
    writer.write(kafka_wire.encode_request(header, body))
    await writer.drain()
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    frame = await reader.readexactly(size)
    _, response = kafka_wire.decode_response(frame, header.api_key, header.api_version)
    return response


async def fetch_topology(bootstrap: str, timeout: float = 10.0) -> Topology:
    """Metadata from the first bootstrap server that answers."""
    errors: list[str] = []
    for server in filter(None, (s.strip() for s in bootstrap.split(","))):
        host, _, port = server.rpartition(":")
        try:
            return await asyncio.wait_for(_fetch_from(host.strip("[]"), int(port)), timeout)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as err:
            errors.append(f"{server}: {err or type(err).__name__}")
    raise DiscoveryError("no bootstrap server answered: " + "; ".join(errors))


async def _fetch_from(host: str, port: int) -> Topology:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        versions = await _round_trip(
            reader, writer, kafka_wire.RequestHeader(API_VERSIONS, 0, 1, "keg-control-plane", {}),
            {},
        )
        ranges = {e["ApiKey"]: e["MaxVersion"] for e in versions["ApiKeys"]}  # type: ignore[attr-defined]
        version = min(_METADATA_VERSION, ranges.get(METADATA, 1))
        body: dict[str, object] = {"Topics": []}
        metadata = await _round_trip(
            reader, writer,
            kafka_wire.RequestHeader(METADATA, version, 2, "keg-control-plane", {}), body,
        )
    finally:
        writer.close()
    brokers = tuple(
        sorted(
            (Broker(b["NodeId"], b["Host"], b["Port"], b.get("Rack"))
             for b in metadata["Brokers"]),  # type: ignore[attr-defined]
            key=lambda b: b.node_id,
        )
    )
    cluster_id = metadata.get("ClusterId")
    return Topology(cluster_id if isinstance(cluster_id, str) else None, brokers)

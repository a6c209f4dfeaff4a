"""Broker discovery: ask the bootstrap servers for the cluster's brokers (Metadata).

The control plane's admin connection speaks to the brokers as the gateway does: over
TLS with the upstream settings (control_plane.tls.UpstreamTls: CA, client certificate,
hostname verification), logged in with SASL (PLAIN, SCRAM, OAUTHBEARER) when given
credentials."""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Final

import kafka_wire
from control_plane.tls import UpstreamTls
from ext_proc.sasl.login import BrokerLogin, LoginFailed, SaslCredentials
from kafka_wire import ApiKey

log = logging.getLogger(__name__)

_METADATA_VERSION = 12  # the newest the codec and Kafka 2.8+ share; older brokers get less
_SIZE = struct.Struct(">i")
_CLIENT_ID = "keg-control-plane"


class DiscoveryError(RuntimeError):
    """No bootstrap server answered a Metadata request."""


class BrokerRefused(DiscoveryError):
    """A broker refused keg's login or showed an untrusted certificate: waiting for the
    brokers to start will not fix it."""


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


# Kept for callers of the PLAIN-only days: SaslPlain(user, password) is PLAIN.
SaslPlain = SaslCredentials


# How long discovery waits for one server before asking the next one too: a server that
# hangs (a stopped process, a black-holed address) held every refresh for the whole
# timeout before the next was asked.
NEXT_SERVER_AFTER_S: Final = 1.0


async def fetch_topology(bootstrap: str, timeout: float = 10.0,
                         sasl: SaslCredentials | None = None,
                         tls: UpstreamTls | None = None) -> Topology:
    """Metadata from the first of the servers (in order) that answers: each is asked
    when the one before failed or has not answered for NEXT_SERVER_AFTER_S, and each
    has `timeout`. A refused login or an untrusted certificate is a DiscoveryError at
    once (retrying will not fix it)."""
    errors: list[str] = []
    context = tls.client_context() if tls is not None else None
    servers = [s for s in (s.strip() for s in bootstrap.split(",")) if s]

    async def ask(server: str) -> Topology:
        host, _, port = server.rpartition(":")
        try:
            return await asyncio.wait_for(
                _fetch_from(host.strip("[]"), int(port), sasl, context, tls), timeout)
        except LoginFailed as err:
            raise BrokerRefused(f"{server}: {err}") from None
        except ssl.SSLCertVerificationError as err:
            raise BrokerRefused(f"{server}: the broker's TLS certificate is not trusted: "
                                f"{err.verify_message}") from None

    asking: dict[asyncio.Task[Topology], str] = {}
    try:
        while servers or asking:
            if servers:
                server = servers.pop(0)
                asking[asyncio.create_task(ask(server))] = server
            done, _ = await asyncio.wait(
                asking, timeout=NEXT_SERVER_AFTER_S if servers else None,
                return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                server = asking.pop(task)
                try:
                    return task.result()
                except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as err:
                    errors.append(f"{server}: {err or type(err).__name__}")
    finally:
        for task in asking:
            task.cancel()
    raise DiscoveryError("no bootstrap server answered: " + "; ".join(errors))


async def _authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        sasl: SaslCredentials) -> None:
    login = BrokerLogin(sasl, _CLIENT_ID, correlation_base=10)
    request: bytes | None = login.start()
    while request is not None:
        writer.write(request)
        await writer.drain()
        size = await reader.readexactly(4)
        request = login.on_response(size + await reader.readexactly(_SIZE.unpack(size)[0]))


async def _fetch_from(host: str, port: int, sasl: SaslCredentials | None = None,
                      context: ssl.SSLContext | None = None,
                      tls: UpstreamTls | None = None) -> Topology:
    server_name = (tls.server_name if tls is not None else None) or host
    reader, writer = await asyncio.open_connection(
        host, port, ssl=context, server_hostname=server_name if context is not None else None)
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

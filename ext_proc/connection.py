"""Who is on a connection, as Envoy tells the processor in the stream's initial metadata.

Network ext_proc requests carry only bytes; the control plane configures each
listener's `grpc_service.initial_metadata` with Envoy substitutions (peer
addresses, connection id) and with the listener's broker routes, so the processor
needs no other channel to know where clients must be sent back to.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

# Metadata keys, shared with control_plane's listener compiler through this module.
CLIENT_ADDRESS = "x-keg-client-address"
GATEWAY_ADDRESS = "x-keg-gateway-address"
CONNECTION_ID = "x-keg-connection-id"
BROKER_ID = "x-keg-broker-id"
BROKER_ROUTES = "x-keg-broker-routes"
# TLS listeners (control_plane.tls): "1" on a TLS connection; with mutual TLS the client
# certificate's subject (RFC 2253) and URI SANs as Envoy substitutes them, and how to map
# them to a principal (Kafka's ssl.principal.mapping.rules, base64url: the text may hold
# characters Envoy's substitution formatter would read as commands).
TLS = "x-keg-tls"
PEER_SUBJECT = "x-keg-peer-subject"
PEER_URI_SAN = "x-keg-peer-uri-san"
PRINCIPAL_RULES = "x-keg-principal-rules"
PRINCIPAL_FROM = "x-keg-principal-from"
# "1": the listener authenticates clients itself (ext_proc.sasl.termination).
SASL_TERMINATION = "x-keg-sasl-termination"
# What Envoy substitutes for a certificate field that is absent.
_ABSENT = ("", "-")


def encode_rules(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_rules(text: str) -> str | None:
    """The rule text of PRINCIPAL_RULES; None when it is not valid base64 of UTF-8."""
    try:
        return base64.urlsafe_b64decode(text.encode()).decode()
    except (binascii.Error, ValueError):
        return None


def split_host_port(address: str) -> tuple[str, int]:
    """'1.2.3.4:9092' or '[::1]:9092' -> (host, port); a bad value raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"not a host:port address: {address!r}")
    return host.strip("[]"), int(port)


def format_routes(routes: Mapping[int, tuple[str, int]]) -> str:
    return ",".join(f"{node}={host}:{port}" for node, (host, port) in sorted(routes.items()))


@lru_cache(maxsize=64)
def parse_routes(text: str) -> Mapping[int, tuple[str, int]]:
    """Parse 'id=host:port,...'; cached because every connection of a listener repeats it."""
    routes: dict[int, tuple[str, int]] = {}
    for item in filter(None, text.split(",")):
        node, _, address = item.partition("=")
        routes[int(node)] = split_host_port(address)
    return routes


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    client_host: str = "unknown"
    client_port: int = 0
    gateway_address: str = ""
    connection_id: str = ""
    broker_id: int | None = None
    routes: Mapping[int, tuple[str, int]] = field(default_factory=dict)
    tls: bool = False  # the client connected over TLS (terminated by Envoy)
    peer_subject: str | None = None  # mutual TLS: the client certificate's subject
    peer_uri_san: str | None = None  # ... and its URI SANs, comma-separated
    principal_rules: str | None = None  # ssl.principal.mapping.rules for those names
    principal_from: str = "subject"  # which name the rules apply to
    sasl_termination: bool = False  # the gateway authenticates the client itself

    @property
    def gateway_route(self) -> tuple[str, int] | None:
        """The listener this client connected to, as (host, port)."""
        try:
            return split_host_port(self.gateway_address)
        except ValueError:
            return None

    @classmethod
    def from_metadata(cls, metadata: Iterable[tuple[str, str | bytes]]) -> ConnectionInfo:
        values = {key: v if isinstance(v, str) else v.decode() for key, v in metadata}
        client_host, client_port = "unknown", 0
        if CLIENT_ADDRESS in values:
            try:
                client_host, client_port = split_host_port(values[CLIENT_ADDRESS])
            except ValueError:
                client_host = values[CLIENT_ADDRESS]
        broker = values.get(BROKER_ID, "")
        return cls(
            client_host=client_host,
            client_port=client_port,
            gateway_address=values.get(GATEWAY_ADDRESS, ""),
            connection_id=values.get(CONNECTION_ID, ""),
            broker_id=int(broker) if broker.lstrip("-").isdigit() else None,
            routes=parse_routes(values.get(BROKER_ROUTES, "")),
            tls=values.get(TLS) == "1",
            peer_subject=_present(values.get(PEER_SUBJECT)),
            peer_uri_san=_present(values.get(PEER_URI_SAN)),
            principal_rules=decode_rules(values[PRINCIPAL_RULES])
            if PRINCIPAL_RULES in values else None,
            principal_from=values.get(PRINCIPAL_FROM) or "subject",
            sasl_termination=values.get(SASL_TERMINATION) == "1",
        )

    def describe(self) -> str:
        return f"conn={self.connection_id} client={self.client_host}:{self.client_port} " \
            f"gateway={self.gateway_address} broker={self.broker_id}"


def _present(value: str | None) -> str | None:
    return None if value is None or value in _ABSENT else value

"""Who is on a connection, as Envoy tells the processor in the stream's initial metadata.

Network ext_proc requests carry only bytes; the control plane configures each
listener's `grpc_service.initial_metadata` with Envoy substitutions (peer
addresses, connection id) and with the listener's broker routes, so the processor
needs no other channel to know where clients must be sent back to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

# Metadata keys, shared with control_plane's listener compiler through this module.
CLIENT_ADDRESS = "x-keg-client-address"
GATEWAY_ADDRESS = "x-keg-gateway-address"
CONNECTION_ID = "x-keg-connection-id"
BROKER_ID = "x-keg-broker-id"
BROKER_ROUTES = "x-keg-broker-routes"


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
        )

    def describe(self) -> str:
        return f"conn={self.connection_id} client={self.client_host}:{self.client_port} " \
            f"gateway={self.gateway_address} broker={self.broker_id}"

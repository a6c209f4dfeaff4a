"""keg's gRPC servers listen on ports that are theirs alone.

gRPC sets SO_REUSEPORT on its listening sockets by default, and so does Envoy on its
listeners. Two SO_REUSEPORT sockets of one user bind the same port without an error and
the kernel splits new connections between them: an xDS or ext_proc port that an Envoy
listener already holds came up "fine" while Envoys' ADS streams landed on a Kafka
listener (seen in CI: a fleet of Envoys with no listeners, the ext_proc service closing
"frames" of size 0x50524920, the HTTP/2 preface "PRI "). A port in use is an error here.
"""

from __future__ import annotations

from typing import Any, Final

import grpc

EXCLUSIVE_PORT: Final = ("grpc.so_reuseport", 0)


class PortInUse(RuntimeError):
    """The address could not be bound: another socket holds the port, or the host is
    not one of this machine's addresses."""


def exclusive_server(options: list[tuple[str, Any]]) -> grpc.aio.Server:
    """A grpc.aio server whose ports no other socket may share."""
    return grpc.aio.server(options=[*options, EXCLUSIVE_PORT])


def listen(server: grpc.aio.Server, address: str, role: str,
           credentials: grpc.ServerCredentials | None = None) -> int:
    """Bind `server` to `address` ("host:port"); the port bound (for port 0, the one
    picked). Raises PortInUse naming `role` ("the xDS server") when the bind fails."""
    try:
        if credentials is not None:
            return server.add_secure_port(address, credentials)
        return server.add_insecure_port(address)
    except RuntimeError as error:
        raise PortInUse(f"{role} cannot listen on {address}: the port is in use by another "
                        f"process (or the host is not an address of this machine)") from error

"""Learn who is on the connection from the SASL exchange (KIP-559 makes it parseable)."""

from __future__ import annotations

from typing import Any

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.identity import IdentityTracker
from kafka_wire.api_keys import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE

_SASL = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})


class IdentityObserver:
    """Feeds one connection's IdentityTracker; never changes a frame."""

    api_keys = frozenset({SASL_AUTHENTICATE})

    def __init__(self, identity: IdentityTracker) -> None:
        self.identity = identity

    def wants_request(self, api_key: int, api_version: int) -> bool:
        # ApiVersions opens every connection: its header names the client.
        return api_key in _SASL or api_key == API_VERSIONS

    def observe_request(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                        conn: ConnectionInfo) -> None:
        self.identity.observe_client_id(header.client_id)
        if header.api_key in _SASL:
            self.identity.observe_request(header.api_key, header.api_version, body)

    def wants(self, api_key: int, api_version: int) -> bool:
        return api_key == SASL_AUTHENTICATE

    def filter_response(self, api_key: int, api_version: int, body: dict[str, Any],
                        conn: ConnectionInfo) -> bool:
        self.identity.observe_response(api_key, api_version, body)
        return False

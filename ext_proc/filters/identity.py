"""Learn who is on the connection from the SASL exchange (KIP-559 makes it parseable)."""

from __future__ import annotations

from ext_proc.filters import REQUEST, BaseFilter, Direction, RequestContext, ResponseContext
from ext_proc.identity import IdentityTracker
from kafka_wire import ApiKey

_SASL = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


class IdentityObserver(BaseFilter):
    """Feeds one connection's IdentityTracker; never changes a frame."""

    def __init__(self, identity: IdentityTracker) -> None:
        self.identity = identity

    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        if direction == REQUEST:
            # ApiVersions opens every connection: its header names the client.
            return api_key in _SASL or api_key == ApiKey.API_VERSIONS
        return api_key == ApiKey.SASL_AUTHENTICATE

    def on_request(self, ctx: RequestContext) -> None:
        header = ctx.header
        self.identity.observe_client_id(header.client_id)
        if header.api_key in _SASL:
            self.identity.observe_request(header.api_key, header.api_version, ctx.body)

    def on_response(self, ctx: ResponseContext) -> None:
        self.identity.observe_response(ctx.api_key, ctx.api_version, ctx.body)

"""Send clients back through the gateway: rewrite broker addresses in responses.

What Envoy's contrib kafka_broker filter does with `id_based_broker_address_rewrite_spec`,
for every answer that can carry an address (kafka_wire.endpoints finds them in the
schemas): Metadata, FindCoordinator and DescribeCluster brokers, the KIP-951 leader
hints of Produce, Fetch and the share-group APIs, become the gateway listener that
fronts that broker; controller endpoints (DescribeQuorum) and address-valued broker
configs (DescribeConfigs) are redacted.

A broker the gateway has no listener for yet (a new node before the control plane's
next topology refresh) is pointed at the listener the client is on, never at the
broker itself: the client then gets NOT_LEADER errors and refreshes metadata,
instead of silently bypassing the gateway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache, partial

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import RESPONSE, BaseFilter, Direction, ResponseContext
from kafka_wire.endpoints import (
    carries_endpoints,
    hide_streamed_endpoints,
    rewrite_endpoints,
    streamed_endpoints_tag,
)
from kafka_wire.framing import Inspector

log = logging.getLogger(__name__)


@cache
def endpoint_api_keys() -> frozenset[int]:
    """The API keys some version of which carries endpoints in its answers."""
    def versions(api_key: int) -> range:
        low, high = kafka_wire.supported_versions(api_key) or (0, -1)
        return range(low, high + 1)

    return frozenset(key for key in kafka_wire.known_api_keys()
                     if any(carries_endpoints(key, v) for v in versions(key)))


class BrokerAddressRewriter(BaseFilter):
    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        return direction == RESPONSE and carries_endpoints(api_key, api_version)

    def stream_response(self, api_key: int, api_version: int) -> Callable[[], Inspector] | None:
        """Produce v10+ and Fetch v16+ answers carry addresses only in their trailing
        leader hints: they pass as they arrive, the hints hidden as the bytes go by."""
        if streamed_endpoints_tag(api_key, api_version) is None:
            return None
        return partial(hide_streamed_endpoints, api_key, api_version)

    def on_response(self, ctx: ResponseContext) -> None:
        conn = ctx.conn
        ctx.changed(rewrite_endpoints(ctx.api_key, ctx.api_version, ctx.body,
                                      lambda node: self._route(node, conn)))

    def _route(self, node: int, conn: ConnectionInfo) -> tuple[str, int]:
        route = conn.routes.get(node)
        if route is not None:
            return route
        log.warning("broker %s has no gateway listener yet; %s sent to its own listener",
                    node, conn.describe())
        if conn.gateway_route is None:
            raise LookupError(f"no gateway route for broker {node} and no listener address")
        return conn.gateway_route

"""Send clients back through the gateway: rewrite broker addresses in responses.

This is what Envoy's contrib kafka_broker filter does with
`id_based_broker_address_rewrite_spec`: every broker address a client learns
(Metadata, FindCoordinator, DescribeCluster) becomes the gateway listener that
fronts that broker. A broker the gateway has no listener for yet (a new node
before the control plane's next topology refresh) is pointed at the listener the
client is on, never at the broker itself: the client then gets NOT_LEADER errors
and refreshes metadata, instead of silently bypassing the gateway.
"""

from __future__ import annotations

import logging
from typing import Any

from ext_proc.connection import ConnectionInfo
from kafka_wire.api_keys import DESCRIBE_CLUSTER, FIND_COORDINATOR, METADATA

log = logging.getLogger(__name__)


class BrokerAddressRewriter:
    api_keys = frozenset({METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER})

    def __init__(self) -> None:
        self.unknown_brokers = 0

    def wants(self, api_key: int, api_version: int) -> bool:
        return api_key in self.api_keys

    def filter_response(
        self, api_key: int, api_version: int, body: dict[str, Any], conn: ConnectionInfo
    ) -> bool:
        if api_key == METADATA:
            return self._rewrite_all(body.get("Brokers") or [], "NodeId", conn)
        if api_key == DESCRIBE_CLUSTER:
            return self._rewrite_all(body.get("Brokers") or [], "BrokerId", conn)
        if "Coordinators" in body:  # FindCoordinator v4+: one entry per key
            return self._rewrite_all(body["Coordinators"] or [], "NodeId", conn)
        if body.get("NodeId", -1) < 0:  # an error answer carries no coordinator
            return False
        return self._rewrite(body, "NodeId", conn)

    def _rewrite_all(self, entries: list[dict[str, Any]], id_field: str,
                     conn: ConnectionInfo) -> bool:
        changed = False
        for entry in entries:
            changed |= self._rewrite(entry, id_field, conn)
        return changed

    def _rewrite(self, entry: dict[str, Any], id_field: str, conn: ConnectionInfo) -> bool:
        node = entry[id_field]
        route = conn.routes.get(node)
        if route is None:
            route = conn.gateway_route
            self.unknown_brokers += 1
            log.warning("broker %s has no gateway listener yet; %s sent to its own listener",
                        node, conn.describe())
            if route is None:
                raise LookupError(f"no gateway route for broker {node} and no listener address")
        host, port = route
        if entry["Host"] == host and entry["Port"] == port:
            return False
        entry["Host"], entry["Port"] = host, port
        return True

"""Version negotiation: the broker's ApiVersions answer reaches clients as it was sent.

keg never hides or downgrades an API, a version or a feature the broker offers because
keg cannot read it: a frame the gateway does not need to read passes untouched, and
the codec follows the broker (kafka_wire reads Kafka 4.1.1's own schemas, share groups
and the KIP-890 transaction protocol included). Clipping a version while the broker's
finalized features (transaction.version, group.version, share.version) stay advertised
would make clients mix protocols the broker then refuses.

One exception keeps clients on the gateway: an API whose answers carry broker
addresses (Metadata, FindCoordinator, DescribeCluster, the KIP-951 leader hints of
Produce and Fetch, ...) must be read to rewrite them. A broker newer than keg's schemas
may offer versions of those that keg cannot decode yet; only those are clipped to what
keg reads, with a warning, since a client on such a version would learn the brokers'
own addresses. With the brokers keg is built for, nothing is changed.
"""

from __future__ import annotations

import logging
from typing import Any

import kafka_wire
from ext_proc.filters import RESPONSE, BaseFilter, Direction, ResponseContext
from ext_proc.filters.broker_address import endpoint_api_keys
from kafka_wire import ApiKey

log = logging.getLogger(__name__)


class ApiVersionsNarrower(BaseFilter):
    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        return api_key == ApiKey.API_VERSIONS and direction == RESPONSE

    def on_response(self, ctx: ResponseContext) -> None:
        ctx.changed(self.narrow(ctx.body))

    @staticmethod
    def narrow(body: dict[str, Any]) -> bool:
        changed = False
        for entry in body.get("ApiKeys") or ():
            key = entry["ApiKey"]
            if key not in endpoint_api_keys():
                continue
            known = kafka_wire.supported_versions(key)
            if known is None or entry["MaxVersion"] <= known[1]:
                continue
            log.warning("the broker offers %s up to v%d, keg reads up to v%d: clients are "
                        "kept at v%d so broker addresses in its answers can be rewritten",
                        kafka_wire.api_name(key), entry["MaxVersion"], known[1], known[1])
            entry["MaxVersion"] = max(known[1], entry["MinVersion"])
            changed = True
        return changed

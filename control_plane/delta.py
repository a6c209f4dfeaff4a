"""Aggregated Discovery Service, delta (incremental) variant: only what changed is sent.

Per stream and type the server keeps what it believes the node has (resource name
-> version), seeded from the request's `initial_resource_versions` when a node
reconnects. A change sends the resources whose version differs and names the ones
gone in `removed_resources`. The belief is updated when a response is sent, as
go-control-plane does: a NACKed resource is not sent again until it changes, and
the node keeps its last accepted config. Each response has its own nonce; a request
naming a known nonce is its verdict (ACK, or NACK with error_detail).

Subscriptions: an empty first subscription or "*" is a wildcard (Envoy's CDS and
LDS); otherwise only the named resources are sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from control_plane.fleet import Fleet, NodeStatus
from control_plane.snapshot import TYPE_ORDER, Snapshot, SnapshotCache, pack
from control_plane.xds_stream import (
    RequestPump,
    end_stream,
    next_nonce,
    node_of,
    refused_as_too_large,
)

WILDCARD = "*"


@dataclass
class TypeState:
    """One type on one delta stream."""

    wildcard: bool = False
    names: set[str] = field(default_factory=set)
    known: dict[str, str] = field(default_factory=dict)  # what the node has, we believe
    pending: dict[str, tuple[str, Snapshot]] = field(default_factory=dict)  # nonce -> sent
    reported: bool = False  # the fleet has heard of this type from this stream

    def subscribe(self, request: discovery_pb2.DeltaDiscoveryRequest, first: bool) -> None:
        added = set(request.resource_names_subscribe)
        if first:
            self.known.update(request.initial_resource_versions)
            if not added:
                self.wildcard = True
        if WILDCARD in added:
            self.wildcard = True
            added.discard(WILDCARD)
        self.names |= added
        for name in request.resource_names_unsubscribe:
            if name == WILDCARD:
                self.wildcard = False
            self.names.discard(name)
            self.known.pop(name, None)

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names


def delta_response(state: TypeState, type_url: str,
                   snapshot: Snapshot) -> discovery_pb2.DeltaDiscoveryResponse | None:
    """The resources the node lacks or has in another version, and those it should drop;
    None when it is up to date. Pure: the caller records what was sent."""
    versions = snapshot.resource_versions.get(type_url, {})
    messages = snapshot.resources.get(type_url, {})
    changed = [name for name, version in versions.items()
               if state.wants(name) and state.known.get(name) != version]
    removed = [name for name in state.known if name not in versions and state.wants(name)]
    if not changed and not removed:
        return None
    return discovery_pb2.DeltaDiscoveryResponse(
        system_version_info=snapshot.version(type_url),
        type_url=type_url,
        resources=[discovery_pb2.Resource(name=name, version=versions[name],
                                          resource=pack(messages[name]))
                   for name in sorted(changed)],
        removed_resources=sorted(removed),
        nonce=next_nonce(),
    )


class DeltaStream:
    def __init__(self, cache: SnapshotCache, fleet: Fleet) -> None:
        self._cache = cache
        self._fleet = fleet
        self._types: dict[str, TypeState] = {}
        self._status: NodeStatus | None = None

    async def serve(
        self, requests: AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]
    ) -> AsyncIterator[discovery_pb2.DeltaDiscoveryResponse]:
        pump = RequestPump(requests, self._cache)
        try:
            async for request in pump.requests():
                if request is not None:
                    self._status = node_of(pump, self._fleet, self._status, request.node,
                                           "delta")
                    self._on_request(self._status, request)
                if self._status is None:
                    continue
                for response in self._responses(self._status):
                    yield response
        finally:
            await end_stream(pump, self._fleet, self._status)

    def _on_request(self, status: NodeStatus,
                    request: discovery_pb2.DeltaDiscoveryRequest) -> None:
        first = request.type_url not in self._types
        state = self._types.setdefault(request.type_url, TypeState())
        state.subscribe(request, first)
        if first:  # unknown until it ACKs, or resumes with everything current (below)
            self._fleet.runs(status, request.type_url, "")
        if not request.response_nonce:
            return
        sent = state.pending.pop(request.response_nonce, None)
        if sent is None:
            return  # stale or unknown nonce
        version, snapshot = sent
        if request.HasField("error_detail"):
            self._fleet.nack(status, request.type_url, version, request.error_detail.message)
        else:
            self._fleet.ack(status, request.type_url, version, snapshot)

    def _responses(self, status: NodeStatus) -> list[discovery_pb2.DeltaDiscoveryResponse]:
        snapshot = self._cache.get(status.node_id)
        if snapshot is None:
            return []
        out = []
        for type_url in TYPE_ORDER:
            state = self._types.get(type_url)
            if state is None or not snapshot.has(type_url):
                continue
            response = delta_response(state, type_url, snapshot)
            if response is not None and refused_as_too_large(
                    self._fleet, status, type_url, response.system_version_info, response):
                for resource in response.resources:  # answered: not sent again
                    state.known[resource.name] = resource.version
                state.reported = True
                continue
            if response is None:
                if state.known and not state.reported:
                    # Resumed with everything current: the node runs this version.
                    state.reported = True
                    self._fleet.sent(status, type_url, snapshot.version(type_url))
                    self._fleet.ack(status, type_url, snapshot.version(type_url), snapshot)
                continue
            for resource in response.resources:
                state.known[resource.name] = resource.version
            for name in response.removed_resources:
                state.known.pop(name, None)
            state.pending[response.nonce] = (response.system_version_info, snapshot)
            state.reported = True
            self._fleet.sent(status, type_url, response.system_version_info)
            out.append(response)
        return out

"""Aggregated Discovery Service: the cache's snapshots to Envoys and ext_proc instances.

State of the world here, delta in `control_plane.delta`; one servicer serves both.
Per stream and type: a response carries the snapshot's version and a fresh nonce;
the next request naming that nonce is the node's verdict, an ACK (version_info =
the new version) or a NACK (error_detail set, version_info = the old one). A NACK
is recorded and the version is not sent again: the node keeps its last accepted
config until the snapshot changes. Requests naming an older nonce are stale and
ignored, as the xDS protocol prescribes. A (re)subscription that already names
the current version is a node resuming after a reconnect: it is recorded as
applied and nothing is resent (go-control-plane does the same).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from control_plane.delta import DeltaStream
from control_plane.fleet import Fleet, NodeStatus
from control_plane.snapshot import TYPE_ORDER, Snapshot, SnapshotCache, pack
from control_plane.xds_stream import (
    RequestPump,
    end_stream,
    next_nonce,
    node_of,
    refused_as_too_large,
)


@dataclass
class _Sent:
    version: str
    nonce: str
    snapshot: Snapshot
    names: frozenset[str] = frozenset()  # the resource names subscribed when sent


class AggregatedDiscovery(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, cache: SnapshotCache, fleet: Fleet) -> None:
        self._cache = cache
        self._fleet = fleet

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        pump = RequestPump(request_iterator, self._cache)
        status: NodeStatus | None = None
        subscribed: set[str] = set()
        sent: dict[str, _Sent] = {}
        names: dict[str, frozenset[str]] = {}  # type -> resource names last asked for
        try:
            async for request in pump.requests():
                if request is not None:
                    status = node_of(pump, self._fleet, status, request.node, "sotw")
                    self._on_request(status, request, sent, names)
                    subscribed.add(request.type_url)
                if status is None:
                    continue
                for type_url in TYPE_ORDER:
                    if type_url in subscribed:
                        response = self._response(status, type_url, sent,
                                                  names.get(type_url, frozenset()))
                        if response is not None:
                            yield response
        finally:
            await end_stream(pump, self._fleet, status)

    async def DeltaAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DeltaDiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[discovery_pb2.DeltaDiscoveryResponse]:
        stream = DeltaStream(self._cache, self._fleet)
        async for response in stream.serve(request_iterator):
            yield response

    def _on_request(self, status: NodeStatus, request: discovery_pb2.DiscoveryRequest,
                    sent: dict[str, _Sent], names: dict[str, frozenset[str]]) -> None:
        type_url = request.type_url
        names[type_url] = frozenset(request.resource_names)
        if not request.response_nonce:
            # A (re)subscription wants a reply, unless it already has the current version.
            sent.pop(type_url, None)
            snapshot = self._cache.get(status.node_id)
            if (snapshot is not None and snapshot.has(type_url) and request.version_info
                    and request.version_info == snapshot.version(type_url)):
                sent[type_url] = _Sent(request.version_info, "", snapshot, names[type_url])
                self._fleet.sent(status, type_url, request.version_info)
                self._fleet.ack(status, type_url, request.version_info, snapshot)
            else:
                self._fleet.runs(status, type_url, request.version_info)
            return
        last = sent.get(type_url)
        if last is None or request.response_nonce != last.nonce:
            return  # stale
        if request.HasField("error_detail"):
            self._fleet.nack(status, type_url, last.version, request.error_detail.message)
        else:
            self._fleet.ack(status, type_url, request.version_info, last.snapshot)
        if frozenset(request.resource_names) != last.names:
            # A named type (SDS) whose subscription grew: a new listener names another
            # secret. Envoy keeps only what it had subscribed to when a response came,
            # so the current resources go again.
            del sent[type_url]

    def _response(self, status: NodeStatus, type_url: str, sent: dict[str, _Sent],
                  names: frozenset[str]) -> discovery_pb2.DiscoveryResponse | None:
        snapshot = self._cache.get(status.node_id)
        if snapshot is None or not snapshot.has(type_url):
            return None  # no opinion: the node keeps what it has
        version = snapshot.version(type_url)
        if type_url in sent and sent[type_url].version == version:
            return None
        nonce = next_nonce()
        resources = [pack(m) for m in snapshot.resources[type_url].values()]
        response = discovery_pb2.DiscoveryResponse(
            version_info=version, resources=resources, type_url=type_url, nonce=nonce
        )
        if refused_as_too_large(self._fleet, status, type_url, version, response):
            sent[type_url] = _Sent(version, "", snapshot, names)  # no nonce will match
            return None
        sent[type_url] = _Sent(version, nonce, snapshot, names)
        self._fleet.sent(status, type_url, version)
        return response


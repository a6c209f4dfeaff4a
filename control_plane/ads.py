"""Aggregated Discovery Service, state of the world: the cache's snapshots to Envoys.

Per stream and type: a response carries the snapshot's version and a fresh nonce;
the next request naming that nonce is the node's verdict, an ACK (version_info =
the new version) or a NACK (error_detail set, version_info = the old one). A NACK
is recorded and the version is not sent again: the node keeps its last accepted
config until the snapshot changes. Requests naming an older nonce are stale and
ignored, as the xDS protocol prescribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2

from control_plane.fleet import Fleet, NodeStatus
from control_plane.snapshot import TYPE_ORDER, SnapshotCache

log = logging.getLogger(__name__)

_nonces = itertools.count(1)


@dataclass
class _Sent:
    version: str
    nonce: str


class AggregatedDiscovery(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, cache: SnapshotCache, fleet: Fleet) -> None:
        self._cache = cache
        self._fleet = fleet

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await requests.put(request)
            finally:
                await requests.put(None)

        reader = asyncio.create_task(read())
        status: NodeStatus | None = None
        subscribed: set[str] = set()
        sent: dict[str, _Sent] = {}
        generation = self._cache.generation
        change = asyncio.create_task(self._cache.wait_for_change(generation))
        next_request = asyncio.create_task(requests.get())
        try:
            while True:
                done, _ = await asyncio.wait(
                    {next_request, change}, return_when=asyncio.FIRST_COMPLETED
                )
                if change in done:
                    generation = change.result()
                    change = asyncio.create_task(self._cache.wait_for_change(generation))
                if next_request in done:
                    request = next_request.result()
                    if request is None:
                        return
                    next_request = asyncio.create_task(requests.get())
                    if status is None:
                        status = self._hello(request)
                    status.last_seen = time.time()
                    self._verdict(status, request, sent)
                    subscribed.add(request.type_url)
                    if not request.response_nonce:
                        sent.pop(request.type_url, None)  # a (re)subscription wants a reply
                if status is None:
                    continue
                for type_url in TYPE_ORDER:
                    if type_url in subscribed:
                        response = self._response(status, type_url, sent)
                        if response is not None:
                            yield response
        finally:
            for task in (reader, change, next_request):
                task.cancel()
            with contextlib.suppress(BaseException):
                await reader
            if status is not None:
                self._fleet.disconnected(status.node_id)
                log.info("node %s disconnected", status.node_id)

    def _hello(self, request: discovery_pb2.DiscoveryRequest) -> NodeStatus:
        node = request.node
        extensions = frozenset(e.name for e in node.extensions)
        log.info("node %s (cluster %s) connected, %d extensions",
                 node.id, node.cluster, len(extensions))
        return self._fleet.connected(node.id, node.cluster, extensions)

    def _verdict(self, status: NodeStatus, request: discovery_pb2.DiscoveryRequest,
                 sent: dict[str, _Sent]) -> None:
        last = sent.get(request.type_url)
        if not request.response_nonce or last is None or request.response_nonce != last.nonce:
            return
        type_status = status.of(request.type_url)
        if request.HasField("error_detail"):
            type_status.last_nack = request.error_detail.message
            type_status.last_nack_version = last.version
            log.warning("node %s NACKed %s version %s: %s", status.node_id,
                        request.type_url.rsplit(".", 1)[-1], last.version,
                        request.error_detail.message)
        else:
            type_status.acked_version = request.version_info
            log.info("node %s ACKed %s version %s", status.node_id,
                     request.type_url.rsplit(".", 1)[-1], request.version_info)

    def _response(self, status: NodeStatus, type_url: str,
                  sent: dict[str, _Sent]) -> discovery_pb2.DiscoveryResponse | None:
        snapshot = self._cache.get(status.node_id)
        if snapshot is None:
            return None
        version = snapshot.version(type_url)
        if type_url in sent and sent[type_url].version == version:
            return None
        nonce = str(next(_nonces))
        sent[type_url] = _Sent(version, nonce)
        status.of(type_url).sent_version = version
        resources = []
        for message in snapshot.resources.get(type_url, {}).values():
            packed = any_pb2.Any()
            packed.Pack(message)
            resources.append(packed)
        return discovery_pb2.DiscoveryResponse(
            version_info=version, resources=resources, type_url=type_url, nonce=nonce
        )

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

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf.message import Message

from control_plane.fleet import Fleet, NodeInfo, NodeStatus
from control_plane.snapshot import TYPE_ORDER, Snapshot, SnapshotCache, pack
from ext_proc.rule_subscription import MAX_RULE_SET_BYTES_KEY

log = logging.getLogger(__name__)

_nonces = itertools.count(1)

Request = TypeVar("Request")


def next_nonce() -> str:
    return str(next(_nonces))


@dataclass
class _Sent:
    version: str
    nonce: str
    snapshot: Snapshot


class RequestPump(Generic[Request]):
    """Requests of one stream and cache changes of its node, as one sequence of wake-ups.

    grpc.aio cancels a call when a read is cancelled, so one task reads for good."""

    def __init__(self, request_iterator: AsyncIterator[Request], cache: SnapshotCache) -> None:
        self._cache = cache
        self._queue: asyncio.Queue[Request | None] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(request_iterator))
        self._next: asyncio.Task[Request | None] = asyncio.create_task(self._queue.get())
        self._change: asyncio.Task[int] | None = None
        self._node = ""

    async def _read(self, requests: AsyncIterator[Request]) -> None:
        try:
            async for request in requests:
                await self._queue.put(request)
        finally:
            await self._queue.put(None)

    def watch(self, node_id: str) -> None:
        self._node = node_id
        self._change = asyncio.create_task(
            self._cache.wait_for_change(node_id, self._cache.generation(node_id)))

    async def wait(self) -> tuple[bool, Request | None]:
        """(the cache changed, the next request or None); raises EOFError at stream end."""
        waiting: set[asyncio.Task[Any]] = {self._next}
        if self._change is not None:
            waiting.add(self._change)
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        changed = False
        if self._change is not None and self._change in done:
            changed = True
            self._change = asyncio.create_task(
                self._cache.wait_for_change(self._node, self._change.result()))
        request = None
        if self._next in done:
            request = self._next.result()
            if request is None:
                raise EOFError
            self._next = asyncio.create_task(self._queue.get())
        return changed, request

    async def close(self) -> None:
        for task in (self._reader, self._change, self._next):
            if task is not None:
                task.cancel()
        with contextlib.suppress(BaseException):
            await self._reader


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
        try:
            while True:
                try:
                    _, request = await pump.wait()
                except EOFError:
                    return
                if request is not None:
                    if status is None:
                        status = self._fleet.connected(NodeInfo.from_proto(request.node), "sotw")
                        log.info("node %s (%s, cluster %s) connected over SotW ADS",
                                 status.node_id, status.role, status.cluster)
                        pump.watch(status.node_id)
                    status.last_seen = time.time()
                    self._on_request(status, request, sent)
                    subscribed.add(request.type_url)
                if status is None:
                    continue
                for type_url in TYPE_ORDER:
                    if type_url in subscribed:
                        response = self._response(status, type_url, sent)
                        if response is not None:
                            yield response
        finally:
            await pump.close()
            if status is not None:
                self._fleet.disconnected(status.node_id)
                log.info("node %s disconnected", status.node_id)

    async def DeltaAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DeltaDiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[discovery_pb2.DeltaDiscoveryResponse]:
        from control_plane.delta import DeltaStream

        stream = DeltaStream(self._cache, self._fleet)
        async for response in stream.serve(request_iterator):
            yield response

    def _on_request(self, status: NodeStatus, request: discovery_pb2.DiscoveryRequest,
                    sent: dict[str, _Sent]) -> None:
        type_url = request.type_url
        if not request.response_nonce:
            # A (re)subscription wants a reply, unless it already has the current version.
            sent.pop(type_url, None)
            snapshot = self._cache.get(status.node_id)
            if (snapshot is not None and snapshot.has(type_url) and request.version_info
                    and request.version_info == snapshot.version(type_url)):
                sent[type_url] = _Sent(request.version_info, "", snapshot)
                self._fleet.sent(status, type_url, request.version_info)
                self._fleet.ack(status, type_url, request.version_info, snapshot)
            return
        last = sent.get(type_url)
        if last is None or request.response_nonce != last.nonce:
            return  # stale
        if request.HasField("error_detail"):
            self._fleet.nack(status, type_url, last.version, request.error_detail.message)
        else:
            self._fleet.ack(status, type_url, request.version_info, last.snapshot)

    def _response(self, status: NodeStatus, type_url: str,
                  sent: dict[str, _Sent]) -> discovery_pb2.DiscoveryResponse | None:
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
            sent[type_url] = _Sent(version, "", snapshot)  # answered; no nonce will match
            return None
        sent[type_url] = _Sent(version, nonce, snapshot)
        self._fleet.sent(status, type_url, version)
        return response


def refused_as_too_large(fleet: Fleet, status: NodeStatus, type_url: str, version: str,
                         response: Message) -> bool:
    """A response larger than the node accepts (`max_message_bytes`) would be dropped by
    its gRPC stack without a word, and the node would never answer: the control plane
    records a NACK for it instead -- visible in the fleet, to `keg apply --wait` and to
    the store -- and sends nothing. True when it did so."""
    limit = status.max_message_bytes
    if limit is None:
        return False
    size = response.ByteSize()
    if size <= limit:
        return False
    fleet.sent(status, type_url, version)
    fleet.nack(status, type_url, version,
               f"not sent: version {version} is {size} bytes, more than the {limit} this "
               f"node accepts (ext_proc --max-rule-set-bytes, {MAX_RULE_SET_BYTES_KEY})")
    return True

"""What both ADS variants (state of the world, delta) share: nonces and the request pump.

`control_plane.ads` serves state of the world, `control_plane.delta` delta; both read
their stream through a `RequestPump` and stamp responses with `next_nonce()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from control_plane.fleet import Fleet, NodeInfo, NodeStatus
from control_plane.snapshot import SnapshotCache
from ext_proc.rule_subscription import MAX_RULE_SET_BYTES_KEY

log = logging.getLogger(__name__)

_nonces = itertools.count(1)

Request = TypeVar("Request")


def next_nonce() -> str:
    return str(next(_nonces))


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

    async def requests(self) -> AsyncIterator[Request | None]:
        """Each wake-up: the stream's next request, or None when only the node's
        snapshot changed. Ends with the stream."""
        while True:
            try:
                _, request = await self.wait()
            except EOFError:
                return
            yield request

    async def close(self) -> None:
        for task in (self._reader, self._change, self._next):
            if task is not None:
                task.cancel()
        with contextlib.suppress(BaseException):
            await self._reader


def node_of(pump: RequestPump[Any], fleet: Fleet, status: NodeStatus | None, node: Any,
            variant: str) -> NodeStatus:
    """The stream's node, connected to the fleet on its first request (and its snapshot
    watched from then on); seen now."""
    if status is None:
        status = fleet.connected(NodeInfo.from_proto(node), variant)
        log.info("node %s (%s, cluster %s) connected over %s ADS", status.node_id,
                 status.role, status.cluster, "SotW" if variant == "sotw" else variant)
        pump.watch(status.node_id)
    status.last_seen = time.time()
    return status


async def end_stream(pump: RequestPump[Any], fleet: Fleet, status: NodeStatus | None) -> None:
    await pump.close()
    if status is not None:
        fleet.disconnected(status.node_id)
        log.info("node %s disconnected", status.node_id)


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

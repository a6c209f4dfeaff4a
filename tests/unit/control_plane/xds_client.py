"""A scripted xDS client for the ADS tests: an in-process gRPC server and a stream
whose requests the test sends one by one and whose responses it reads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, Self, TypeVar

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc
from google.rpc import status_pb2

from control_plane.ads import AggregatedDiscovery
from control_plane.fleet import Fleet
from control_plane.snapshot import SnapshotCache

Request = TypeVar("Request")
Response = TypeVar("Response")


async def start_ads(cache: SnapshotCache, fleet: Fleet) -> tuple[grpc.aio.Server, int]:
    """keg's ADS servicer on a free loopback port."""
    server = grpc.aio.server()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
        AggregatedDiscovery(cache, fleet), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@contextlib.asynccontextmanager
async def ads_stub(
    cache: SnapshotCache, fleet: Fleet
) -> AsyncIterator[ads_pb2_grpc.AggregatedDiscoveryServiceStub]:
    """keg's ADS servicer on a free loopback port and a client stub to it, both closed
    on the way out."""
    server, port = await start_ads(cache, fleet)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(0)


class ScriptedStream(Generic[Request, Response]):
    """Sends requests when told; collects responses."""

    def __init__(self, open_stream: Callable[[AsyncIterator[Request]], Any]) -> None:
        self._out: asyncio.Queue[Request] = asyncio.Queue()
        self._call = open_stream(self._requests())
        # Cancelling a grpc.aio read cancels the call, so one task reads for good.
        self._in: asyncio.Queue[Response] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for response in self._call:
            await self._in.put(response)

    async def _requests(self) -> AsyncIterator[Request]:
        while True:
            yield await self._out.get()

    async def put(self, request: Request, error: str | None = None) -> None:
        """Send `request`; with `error`, as a NACK saying so (INVALID_ARGUMENT)."""
        if error is not None:
            request.error_detail.CopyFrom(  # type: ignore[attr-defined]
                status_pb2.Status(code=3, message=error))
        await self._out.put(request)

    async def receive(self, timeout: float = 5.0) -> Response:
        return await asyncio.wait_for(self._in.get(), timeout)

    async def nothing_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._in.get(), seconds)
        except TimeoutError:
            return True
        return False

    def close(self) -> None:
        self._reader.cancel()
        self._call.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

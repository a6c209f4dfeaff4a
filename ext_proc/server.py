"""The grpc.aio adapter: Envoy's network ext_proc stream in, KafkaSession in between.

Facts this adapter is built on (measured, see DESIGN.md): Envoy sends every TCP
read as `read_data` (client -> broker) and every write as `write_data` (broker ->
client) without waiting for replies; replies are injected in arrival order, so
every chunk gets exactly one reply, an empty one while a frame is being held; a
reply without data would lose the chunk. Half-close arrives as an empty chunk
with end_of_stream and is echoed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2 as pb
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2_grpc as pb_grpc

from ext_proc.connection import ConnectionInfo
from ext_proc.filters import ResponseFilter
from ext_proc.filters.api_versions import ApiVersionsNarrower
from ext_proc.filters.broker_address import BrokerAddressRewriter
from ext_proc.filters.group_protocol import GroupProtocolObserver
from ext_proc.session import KafkaSession, ProtocolViolation
from kafka_wire.framing import DEFAULT_MAX_FRAME_SIZE

log = logging.getLogger(__name__)

_CLOSE_RST = pb.ProcessingResponse(connection_status=pb.ProcessingResponse.CLOSE_RST)


@dataclass(frozen=True)
class ProcessorSettings:
    host: str = "127.0.0.1"
    port: int = 0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE


def default_filters() -> list[ResponseFilter]:
    return [ApiVersionsNarrower(), BrokerAddressRewriter(), GroupProtocolObserver()]


class NetworkProcessor(pb_grpc.NetworkExternalProcessorServicer):
    def __init__(
        self,
        settings: ProcessorSettings,
        filters: Callable[[], Sequence[ResponseFilter]] = default_filters,
    ) -> None:
        self._settings = settings
        self._filters = filters
        self.active_connections = 0

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        conn = ConnectionInfo.from_metadata(context.invocation_metadata() or ())
        session = KafkaSession(conn, self._filters(), self._settings.max_frame_size)
        self.active_connections += 1
        log.debug("connection opened %s", conn.describe())
        try:
            async for request in request_iterator:
                if request.HasField("read_data"):
                    data = request.read_data
                    out = session.from_client(data.data) if data.data else b""
                    yield pb.ProcessingResponse(
                        read_data=pb.Data(data=out, end_of_stream=data.end_of_stream)
                    )
                    # A request the gateway answered itself: the answer goes to the
                    # client unsolicited, once nothing the broker owes comes first.
                    answers = session.take_client_bytes()
                    if answers:
                        yield pb.ProcessingResponse(write_data=pb.Data(data=answers))
                elif request.HasField("write_data"):
                    data = request.write_data
                    out = session.from_broker(data.data) if data.data else b""
                    yield pb.ProcessingResponse(
                        write_data=pb.Data(data=out, end_of_stream=data.end_of_stream)
                    )
        except ProtocolViolation as err:
            log.warning("closing connection: %s (%s)", err, conn.describe())
            yield _CLOSE_RST
        except Exception:
            # A bug in a filter must cost one connection, never the service.
            log.exception("closing connection after an internal error (%s)", conn.describe())
            yield _CLOSE_RST
        finally:
            self.active_connections -= 1
            if session.pending_bytes():
                log.debug("connection ended mid-frame %s", conn.describe())


class ExtProcServer:
    """Owns the grpc.aio server; `start()` binds and returns the port."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings
        self.processor = NetworkProcessor(settings)
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 256 * 1024 * 1024),
                ("grpc.max_send_message_length", 256 * 1024 * 1024),
            ]
        )
        pb_grpc.add_NetworkExternalProcessorServicer_to_server(self.processor, server)
        self.port = server.add_insecure_port(f"{self.settings.host}:{self.settings.port}")
        await server.start()
        self._server = server
        log.info("ext_proc listening on %s:%d", self.settings.host, self.port)
        return self.port

    async def stop(self, grace: float = 2.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def serve_forever(self) -> None:
        await self.start()
        assert self._server is not None
        try:
            await self._server.wait_for_termination()
        except asyncio.CancelledError:
            await self.stop()
            raise

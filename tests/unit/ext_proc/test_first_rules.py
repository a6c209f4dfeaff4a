"""A service that takes its rules from a control plane serves no connection before it
runs them: the empty rule set its engine starts with would let everything through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2 as pb
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2_grpc as pb_grpc

import kafka_wire
from control_plane.service import free_port
from ext_proc import ExtProcServer, ProcessorSettings
from ext_proc.frames import FRAMES_MODE, MODE_HEADER
from ext_proc.rule_subscription import encode_rule_set
from ext_proc.server import NO_RULES_YET
from filter_rules import load_rule_text
from kafka_wire import ApiKey

DENY = """
rules:
  - id: no-secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
"""


def produce(topic: str) -> bytes:
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": 0, "Records": None}]}]}
    return kafka_wire.encode_request(
        kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 7, "app", {}), body)


def unanswered_plane(wait_s: float) -> ExtProcServer:
    """A service subscribed to a control plane that is not there, with nothing kept."""
    return ExtProcServer(ProcessorSettings(
        port=0, control_plane=f"127.0.0.1:{free_port()}", node_id="xp",
        first_rules_wait_s=wait_s))


async def connection(port: int, chunk: bytes, *, frames: bool = False
                     ) -> list[pb.ProcessingResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.NetworkExternalProcessorStub(channel)

        async def requests() -> AsyncIterator[pb.ProcessingRequest]:
            yield pb.ProcessingRequest(read_data=pb.Data(data=chunk))

        metadata = ((MODE_HEADER, FRAMES_MODE),) if frames else ()
        return [reply async for reply in stub.Process(requests(), metadata=metadata)]


def test_without_rules_a_connection_is_refused_after_the_wait() -> None:
    async def run() -> None:
        server = unanswered_plane(0.2)
        port = await server.start()
        try:
            replies = await connection(port, produce("secret.x"))
            assert [r.connection_status for r in replies] == [pb.ProcessingResponse.CLOSE_RST]
            with pytest.raises(grpc.aio.AioRpcError) as refused:  # keg's module: fail mode
                await connection(port, produce("secret.x"), frames=True)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert refused.value.details() == NO_RULES_YET
            metrics = server.data_path.metrics
            assert metrics.registry.get_sample_value("keg_no_rules_refusals_total") == 2
        finally:
            await server.stop()

    asyncio.run(run())


def test_a_connection_waiting_is_served_with_the_rules_that_arrive() -> None:
    async def run() -> None:
        server = unanswered_plane(30.0)
        port = await server.start()
        try:
            waiting = asyncio.create_task(connection(port, produce("secret.x")))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            assert server.subscription is not None
            server.subscription.apply("v1", [encode_rule_set(load_rule_text(DENY, "r.yaml"))])
            replies = await asyncio.wait_for(waiting, 10)
            # The deny answered it: nothing to the broker, an answer to the client.
            assert replies[0].read_data.data == b""
            assert replies[1].write_data.data
        finally:
            await server.stop()

    asyncio.run(run())

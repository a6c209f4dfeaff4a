"""ADS state of the world over a real gRPC channel, with a scripted Envoy as the client."""

from __future__ import annotations

import asyncio

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from control_plane.envoy_resources import BrokerRoute, GatewayPlan, compile_snapshot
from control_plane.fleet import Fleet
from control_plane.snapshot import ANY_NODE, CLUSTER, LISTENER, RULES, SnapshotCache
from tests.unit.control_plane.xds_client import ScriptedStream, ads_stub


def plan(port: int) -> GatewayPlan:
    return GatewayPlan((BrokerRoute(1, "127.0.0.1", 9092, port),), "127.0.0.1", "127.0.0.1",
                       "127.0.0.1", 50051)


class ScriptedEnvoy(ScriptedStream[discovery_pb2.DiscoveryRequest,
                                   discovery_pb2.DiscoveryResponse]):
    def __init__(self, stub: ads_pb2_grpc.AggregatedDiscoveryServiceStub) -> None:
        super().__init__(stub.StreamAggregatedResources)
        self.node = base_pb2.Node(id="envoy-a", cluster="keg")
        self.node.extensions.add(name="envoy.filters.network.ext_proc")

    async def send(self, type_url: str, version: str = "", nonce: str = "",
                   error: str | None = None, names: tuple[str, ...] = ()) -> None:
        request = discovery_pb2.DiscoveryRequest(type_url=type_url, version_info=version,
                                                 response_nonce=nonce, node=self.node,
                                                 resource_names=list(names))
        await self.put(request, error)


async def scenario() -> None:
    cache, fleet = SnapshotCache(), Fleet()
    cache.set(ANY_NODE, compile_snapshot(plan(19092)))
    async with ads_stub(cache, fleet) as stub, ScriptedEnvoy(stub) as envoy:
        await envoy.send(CLUSTER)
        clusters = await envoy.receive()
        assert clusters.type_url == CLUSTER and len(clusters.resources) == 2
        await envoy.send(CLUSTER, clusters.version_info, clusters.nonce)  # ACK
        await envoy.send(LISTENER)
        listeners = await envoy.receive()
        assert listeners.type_url == LISTENER and len(listeners.resources) == 1
        await envoy.send(LISTENER, listeners.version_info, listeners.nonce)
        await asyncio.sleep(0.1)
        status = fleet.nodes["envoy-a"]
        assert status.connected and status.has_extension("envoy.filters.network.ext_proc")
        assert status.of(CLUSTER).acked_version == clusters.version_info
        assert status.of(LISTENER).acked_version == listeners.version_info

        # A topology change that moves only the listener port: only LDS is pushed.
        cache.set(ANY_NODE, compile_snapshot(plan(19999)))
        pushed = await envoy.receive()
        assert pushed.type_url == LISTENER and pushed.version_info != listeners.version_info
        # NACK it: recorded with the error; the same version is not sent again.
        await envoy.send(LISTENER, listeners.version_info, pushed.nonce, error="port in use")
        assert await envoy.nothing_within(0.5)
        assert status.of(LISTENER).last_nack == "port in use"
        assert status.of(LISTENER).last_nack_version == pushed.version_info
        assert status.of(LISTENER).acked_version == listeners.version_info

        # A stale nonce is ignored; a new snapshot is pushed again.
        await envoy.send(LISTENER, listeners.version_info, "stale-nonce")
        cache.set(ANY_NODE, compile_snapshot(plan(19100)))
        again = await envoy.receive()
        assert again.type_url == LISTENER and again.nonce != pushed.nonce
    await asyncio.sleep(0.1)
    assert not fleet.nodes["envoy-a"].connected


def test_ads_ack_nack_push() -> None:
    asyncio.run(scenario())


async def resume_scenario() -> None:
    cache, fleet = SnapshotCache(), Fleet()
    snapshot = compile_snapshot(plan(19092))
    cache.set("envoy-a", snapshot)
    async with ads_stub(cache, fleet) as stub, ScriptedEnvoy(stub) as envoy:
        # A node back after a control-plane restart names the version it runs: no resend.
        await envoy.send(CLUSTER, snapshot.version(CLUSTER))
        assert await envoy.nothing_within(0.5)
        assert fleet.nodes["envoy-a"].of(CLUSTER).acked_version == snapshot.version(CLUSTER)
        # A type its snapshot does not have (rules, for an Envoy): no opinion, no answer.
        await envoy.send(RULES)
        assert await envoy.nothing_within(0.3)
        # An older version is answered with the current one.
        await envoy.send(LISTENER, "an-old-version")
        listeners = await envoy.receive()
        assert listeners.version_info == snapshot.version(LISTENER)


def test_ads_resume_and_unknown_types() -> None:
    asyncio.run(resume_scenario())


def test_a_named_subscription_that_grows_is_answered_again() -> None:
    """SDS: Envoy first asks for the secrets its clusters name, then, with the ACK of
    that response, for those and the listeners' too. It keeps only the resources it had
    subscribed to when a response came, so the server must send the type again (it
    did not: the listener's TLS secret never arrived and the listener never warmed)."""
    from control_plane.snapshot import SECRET, Snapshot

    async def run() -> None:
        cache, fleet = SnapshotCache(), Fleet()
        secrets = {name: base_pb2.DataSource(inline_string=name) for name in ("ca", "cert")}
        cache.set(ANY_NODE, Snapshot({SECRET: secrets}))
        async with ads_stub(cache, fleet) as stub, ScriptedEnvoy(stub) as envoy:
            await envoy.send(SECRET, names=("ca",))
            first = await envoy.receive()
            await envoy.send(SECRET, first.version_info, first.nonce, names=("ca", "cert"))
            again = await envoy.receive()
            assert again.version_info == first.version_info and again.nonce != first.nonce
            await envoy.send(SECRET, again.version_info, again.nonce, names=("ca", "cert"))
            assert await envoy.nothing_within(0.3)  # an unchanged subscription: no resend

    asyncio.run(run())

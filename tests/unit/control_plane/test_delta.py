"""Delta ADS: pure response computation, then a scripted Envoy over a real gRPC channel."""

from __future__ import annotations

import asyncio

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from control_plane.delta import TypeState, delta_response
from control_plane.envoy_resources import BrokerRoute, GatewayPlan, compile_snapshot
from control_plane.fleet import Fleet
from control_plane.snapshot import CLUSTER, LISTENER, Snapshot, SnapshotCache
from tests.unit.control_plane.xds_client import ScriptedStream, ads_stub


def snapshot(*brokers: int, port_shift: int = 0) -> Snapshot:
    routes = tuple(BrokerRoute(b, f"10.0.0.{b}", 9092, 19091 + b + port_shift) for b in brokers)
    return compile_snapshot(GatewayPlan(routes, "127.0.0.1", "127.0.0.1", "127.0.0.1", 50051))


def wildcard() -> TypeState:
    state = TypeState()
    state.subscribe(discovery_pb2.DeltaDiscoveryRequest(type_url=CLUSTER), first=True)
    return state


def test_first_response_sends_everything_then_nothing() -> None:
    state, snap = wildcard(), snapshot(1, 2)
    response = delta_response(state, CLUSTER, snap)
    assert response is not None
    assert [r.name for r in response.resources] == ["kafka_broker_1", "kafka_broker_2",
                                                     "keg_ext_proc"]
    assert response.system_version_info == snap.version(CLUSTER)
    state.known.update({r.name: r.version for r in response.resources})
    assert delta_response(state, CLUSTER, snap) is None


def test_only_changed_resources_and_removals_are_sent() -> None:
    state, first = wildcard(), snapshot(1, 2)
    state.known.update(first.resource_versions[CLUSTER])
    response = delta_response(state, CLUSTER, snapshot(1, 3))
    assert response is not None
    assert [r.name for r in response.resources] == ["kafka_broker_3"]
    assert list(response.removed_resources) == ["kafka_broker_2"]


def test_reconnect_with_initial_versions_sends_only_the_difference() -> None:
    current = snapshot(1, 2)
    known = dict(current.resource_versions[LISTENER])
    known["kafka_broker_1"] = "an-older-version"
    state = TypeState()
    state.subscribe(discovery_pb2.DeltaDiscoveryRequest(
        type_url=LISTENER, initial_resource_versions=known), first=True)
    response = delta_response(state, LISTENER, current)
    assert response is not None
    assert [r.name for r in response.resources] == ["kafka_broker_1"]


def test_named_subscriptions_get_only_their_resources() -> None:
    state = TypeState()
    state.subscribe(discovery_pb2.DeltaDiscoveryRequest(
        type_url=CLUSTER, resource_names_subscribe=["kafka_broker_2"]), first=True)
    response = delta_response(state, CLUSTER, snapshot(1, 2))
    assert response is not None and [r.name for r in response.resources] == ["kafka_broker_2"]
    state.subscribe(discovery_pb2.DeltaDiscoveryRequest(
        type_url=CLUSTER, resource_names_unsubscribe=["kafka_broker_2"]), first=False)
    assert delta_response(state, CLUSTER, snapshot(1, 2)) is None


class DeltaEnvoy(ScriptedStream[discovery_pb2.DeltaDiscoveryRequest,
                                 discovery_pb2.DeltaDiscoveryResponse]):
    def __init__(self, stub: ads_pb2_grpc.AggregatedDiscoveryServiceStub, node_id: str) -> None:
        super().__init__(stub.DeltaAggregatedResources)
        self.node = base_pb2.Node(id=node_id, cluster="keg")

    async def send(self, type_url: str, nonce: str = "", error: str | None = None,
                   initial: dict[str, str] | None = None) -> None:
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url, response_nonce=nonce, node=self.node,
            initial_resource_versions=initial or {})
        await self.put(request, error)


async def delta_scenario() -> None:
    cache, fleet = SnapshotCache(), Fleet()
    first = snapshot(1)
    cache.set("envoy-d", first)
    async with ads_stub(cache, fleet) as stub:
        async with DeltaEnvoy(stub, "envoy-d") as envoy:
            await envoy.send(CLUSTER)
            clusters = await envoy.receive()
            assert {r.name for r in clusters.resources} == {"keg_ext_proc", "kafka_broker_1"}
            await envoy.send(CLUSTER, clusters.nonce)
            await envoy.send(LISTENER)
            listeners = await envoy.receive()
            await envoy.send(LISTENER, listeners.nonce)
            await asyncio.sleep(0.1)
            status = fleet.nodes["envoy-d"]
            assert status.transport == "delta"
            assert status.of(LISTENER).acked_version == first.version(LISTENER)

            # Broker 2 appears: only its cluster and listener travel.
            cache.set("envoy-d", snapshot(1, 2))
            clusters = await envoy.receive()
            assert [r.name for r in clusters.resources] == ["kafka_broker_2"]
            await envoy.send(CLUSTER, clusters.nonce)
            listeners = await envoy.receive()
            # Listener 1 changes too: its ext_proc metadata lists every broker's address.
            assert [r.name for r in listeners.resources] == ["kafka_broker_1", "kafka_broker_2"]
            # NACK: recorded with the error, not sent again.
            await envoy.send(LISTENER, listeners.nonce, error="cannot bind")
            assert await envoy.nothing_within(0.5)
            assert status.of(LISTENER).last_nack == "cannot bind"
            assert status.of(LISTENER).acked_version == first.version(LISTENER)

        # Reconnecting with what it has: nothing to send, recorded as running it.
        current = cache.get("envoy-d")
        assert current is not None
        async with DeltaEnvoy(stub, "envoy-d") as again:
            await again.send(CLUSTER, initial=dict(current.resource_versions[CLUSTER]))
            assert await again.nothing_within(0.5)
            assert fleet.nodes["envoy-d"].of(CLUSTER).acked_version == current.version(CLUSTER)

        # Restarted with nothing kept, and nothing for it yet: it runs nothing, whatever
        # its old process ACKed under the same id.
        cache.clear("envoy-d")
        async with DeltaEnvoy(stub, "envoy-d") as fresh:
            await fresh.send(CLUSTER)
            assert await fresh.nothing_within(0.3)
            assert fleet.nodes["envoy-d"].of(CLUSTER).acked_version == ""


def test_delta_ads_over_grpc() -> None:
    asyncio.run(delta_scenario())

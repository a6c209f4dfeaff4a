"""The compiler's Envoy resources: shape, metadata contract, consistency."""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from control_plane.envoy_resources import (
    EXT_PROC_CLUSTER,
    BrokerRoute,
    GatewayPlan,
    compile_snapshot,
)
from control_plane.snapshot import CLUSTER, LISTENER, InconsistentSnapshot, Snapshot
from ext_proc.connection import BROKER_ID, BROKER_ROUTES, ConnectionInfo

PLAN = GatewayPlan(
    routes=(BrokerRoute(1, "10.0.0.1", 9092, 19092), BrokerRoute(2, "kafka-2", 9092, 19093)),
    listen_host="0.0.0.0",
    advertised_host="gw.example",
    ext_proc_host="127.0.0.1",
    ext_proc_port=50051,
    message_timeout_s=0.3,
)


def test_one_listener_and_cluster_per_broker_plus_ext_proc() -> None:
    snap = compile_snapshot(PLAN)
    assert set(snap.resources[LISTENER]) == {"kafka_broker_1", "kafka_broker_2"}
    assert set(snap.resources[CLUSTER]) == {EXT_PROC_CLUSTER, "kafka_broker_1", "kafka_broker_2"}
    ext_proc_cluster = snap.resources[CLUSTER][EXT_PROC_CLUSTER]
    assert "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" in \
        ext_proc_cluster.typed_extension_protocol_options
    # A hostname broker needs DNS; an IP one is static.
    assert snap.resources[CLUSTER]["kafka_broker_2"].type == cluster_pb2.Cluster.STRICT_DNS
    assert snap.resources[CLUSTER]["kafka_broker_1"].type == cluster_pb2.Cluster.STATIC


def test_listener_chain_is_ext_proc_then_tcp_proxy_with_metadata() -> None:
    listener = compile_snapshot(PLAN).resources[LISTENER]["kafka_broker_2"]
    assert isinstance(listener, listener_pb2.Listener)
    assert listener.address.socket_address.port_value == 19093
    filters = listener.filter_chains[0].filters
    assert [f.name for f in filters] == ["envoy.filters.network.ext_proc",
                                         "envoy.filters.network.tcp_proxy"]
    ext_proc = ext_proc_pb2.NetworkExternalProcessor()
    filters[0].typed_config.Unpack(ext_proc)
    assert not ext_proc.failure_mode_allow
    assert ext_proc.message_timeout.ToMilliseconds() == 300
    metadata = [(h.key, h.value) for h in ext_proc.grpc_service.initial_metadata]
    info = ConnectionInfo.from_metadata(metadata)
    assert dict(metadata)[BROKER_ID] == "2" and info.broker_id == 2
    assert info.routes == {1: ("gw.example", 19092), 2: ("gw.example", 19093)}
    assert dict(metadata)[BROKER_ROUTES] == "1=gw.example:19092,2=gw.example:19093"
    tcp = tcp_proxy_pb2.TcpProxy()
    filters[1].typed_config.Unpack(tcp)
    assert tcp.cluster == "kafka_broker_2"


def test_versions_are_content_hashes() -> None:
    a, b = compile_snapshot(PLAN), compile_snapshot(PLAN)
    assert a.versions == b.versions
    moved = GatewayPlan(**{**PLAN.__dict__, "advertised_host": "other"})
    c = compile_snapshot(moved)
    assert c.version(LISTENER) != a.version(LISTENER)
    assert c.version(CLUSTER) == a.version(CLUSTER)  # clusters did not change


def test_kept_clusters_stay() -> None:
    gone = BrokerRoute(3, "10.0.0.3", 9092, 19094)
    snap = compile_snapshot(PLAN, keep_clusters=(gone,))
    assert "kafka_broker_3" in snap.resources[CLUSTER]
    assert "kafka_broker_3" not in snap.resources[LISTENER]


def test_inconsistent_snapshot_is_refused() -> None:
    snap = compile_snapshot(PLAN)
    with pytest.raises(InconsistentSnapshot, match="kafka_broker_9"):
        Snapshot(snap.resources, {"l": frozenset({"kafka_broker_9"})})

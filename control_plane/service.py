"""The control plane as a running service: topology refresh -> snapshots -> ADS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc

from control_plane.ads import AggregatedDiscovery
from control_plane.envoy_resources import (
    BrokerRoute,
    GatewayPlan,
    KafkaBrokerFilter,
    compile_snapshot,
)
from control_plane.fleet import Fleet, NodeStatus
from control_plane.kafka_broker import FILTER_NAME as KAFKA_BROKER
from control_plane.kafka_broker import global_api_lists
from control_plane.snapshot import ANY_NODE, Snapshot, SnapshotCache
from control_plane.topology import DiscoveryError, SaslPlain, Topology, fetch_topology
from filter_rules import CompiledRuleSet, RuleSetInvalid, load_rule_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlPlaneSettings:
    bootstrap_servers: str
    ext_proc_host: str
    ext_proc_port: int
    xds_host: str = "127.0.0.1"
    xds_port: int = 0
    listen_host: str = "127.0.0.1"
    advertised_host: str | None = None
    # Broker listeners get consecutive ports from here, in order of first sight;
    # 0 asks the OS for free ports (tests, several gateways on one machine).
    listen_port_base: int = 19092
    message_timeout_s: float = 2.0
    failure_mode_allow: bool = False
    refresh_interval_s: float = 30.0
    sasl: SaslPlain | None = None  # when the bootstrap servers are a SASL/PLAIN listener
    # Rules whose global API lists go into Envoy's kafka_broker filter where nodes have it.
    rules_dir: Path | None = None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ControlPlane:
    def __init__(self, settings: ControlPlaneSettings) -> None:
        self.settings = settings
        self.cache = SnapshotCache()
        self.fleet = Fleet()
        self.topology: Topology | None = None
        self.plan: GatewayPlan | None = None
        self._ports: dict[int, int] = {}
        self._routes_seen: dict[int, BrokerRoute] = {}
        self._server: grpc.aio.Server | None = None
        self._refresher: asyncio.Task[None] | None = None
        self.xds_port = 0
        self._kafka_broker_nodes: set[str] = set()
        self._last_kafka_broker: KafkaBrokerFilter | None = None
        self.fleet.on_connect.append(self._node_connected)

    async def start(self) -> None:
        server = grpc.aio.server()
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
            AggregatedDiscovery(self.cache, self.fleet), server
        )
        address = f"{self.settings.xds_host}:{self.settings.xds_port}"
        self.xds_port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        log.info("xDS (ADS) listening on %s:%d", self.settings.xds_host, self.xds_port)
        await self._first_refresh()
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def _first_refresh(self, timeout: float = 60.0) -> None:
        """The brokers may still be starting: retry until one answers."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await self.refresh()
                return
            except (DiscoveryError, OSError) as err:
                if asyncio.get_running_loop().time() > deadline:
                    raise DiscoveryError(f"no broker answered within {timeout}s: {err}") from err
                log.info("waiting for brokers: %s", err)
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._server is not None:
            await self._server.stop(1.0)

    async def refresh(self) -> bool:
        """Re-read the topology; publish new snapshots when it changed."""
        topology = await fetch_topology(self.settings.bootstrap_servers, sasl=self.settings.sasl)
        if topology == self.topology:
            self._publish()  # rules may have changed what kafka_broker nodes get
            return False
        self.topology = topology
        self.plan = self._plan(topology)
        self._publish()
        self._routes_seen.update({r.node_id: r for r in self.plan.routes})
        log.info("topology: cluster %s, brokers %s", topology.cluster_id,
                 ", ".join(f"{b.node_id}={b.host}:{b.port}" for b in topology.brokers))
        return True

    def _snapshot(self, kafka_broker: KafkaBrokerFilter | None) -> Snapshot:
        assert self.plan is not None
        current = {r.node_id for r in self.plan.routes}
        previous = tuple(r for n, r in self._routes_seen.items() if n not in current)
        return compile_snapshot(self.plan, keep_clusters=previous, kafka_broker=kafka_broker)

    def _publish(self) -> None:
        if self.plan is None:
            return
        self._set_if_changed(ANY_NODE, self._snapshot(None))
        if self._kafka_broker_nodes:
            snapshot = self._snapshot(self._kafka_broker_filter())
            for node in self._kafka_broker_nodes:
                self._set_if_changed(node, snapshot)

    def _set_if_changed(self, node: str, snapshot: Snapshot) -> None:
        current = self.cache.get(node)
        if current is None or current.versions != snapshot.versions:
            self.cache.set(node, snapshot)

    def _kafka_broker_filter(self) -> KafkaBrokerFilter:
        allowed: frozenset[int] = frozenset()
        denied: frozenset[int] = frozenset()
        if self.settings.rules_dir is not None:
            try:
                rules = CompiledRuleSet(load_rule_dir(self.settings.rules_dir)).rules
                allowed, denied = global_api_lists(rules)
            except RuleSetInvalid as err:
                log.warning("rules in %s are invalid; kafka_broker API lists unchanged: %s",
                            self.settings.rules_dir, err)
                current = self._last_kafka_broker
                return current if current is not None else KafkaBrokerFilter()
        self._last_kafka_broker = KafkaBrokerFilter(allowed, denied)
        return self._last_kafka_broker

    def _node_connected(self, status: NodeStatus) -> None:
        """Nodes whose Envoy has the contrib kafka_broker filter get a snapshot with it."""
        if status.has_extension(KAFKA_BROKER) and status.node_id not in self._kafka_broker_nodes:
            log.info("node %s has %s: compiling it in", status.node_id, KAFKA_BROKER)
            self._kafka_broker_nodes.add(status.node_id)
            self._publish()

    def _plan(self, topology: Topology) -> GatewayPlan:
        s = self.settings
        routes = []
        for broker in topology.brokers:
            if broker.node_id not in self._ports:
                self._ports[broker.node_id] = (
                    s.listen_port_base + len(self._ports) if s.listen_port_base
                    else free_port(s.listen_host)
                )
            routes.append(BrokerRoute(broker.node_id, broker.host, broker.port,
                                      self._ports[broker.node_id]))
        return GatewayPlan(
            routes=tuple(routes),
            listen_host=s.listen_host,
            advertised_host=s.advertised_host or s.listen_host,
            ext_proc_host=s.ext_proc_host,
            ext_proc_port=s.ext_proc_port,
            message_timeout_s=s.message_timeout_s,
            failure_mode_allow=s.failure_mode_allow,
        )

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refresh_interval_s)
            try:
                await self.refresh()
            except (DiscoveryError, OSError) as err:
                # Keep serving the last good snapshot; brokers may be restarting.
                log.warning("topology refresh failed, keeping the last snapshot: %s", err)

    def bootstrap_address(self) -> str:
        assert self.plan is not None
        return ",".join(f"{self.plan.advertised_host}:{r.listen_port}" for r in self.plan.routes)

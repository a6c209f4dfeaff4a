"""The control plane process: topology and rules in, per-node snapshots out, over ADS.

Two kinds of node subscribe to the same ADS server (state of the world or delta):

- Envoys get clusters and listeners for the brokers of their group. Their
  snapshots change only with the topology (and, on nodes with Envoy's contrib
  kafka_broker filter, with the rule set's global API lists, which that filter
  enforces itself), because a listener change drains live Kafka connections.
- ext_proc instances (node metadata `keg.role: ext_proc`) get the rule set.

A mesh: an Envoy's `node.cluster` names its group (`EnvoyGroup`): the brokers it
fronts, the ports and the host it advertises. Unknown clusters get the default
group (every broker, the settings' ports). docs/xds.md has the details.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
import yaml
from envoy.service.discovery.v3 import ads_pb2_grpc

from control_plane.ads import AggregatedDiscovery
from control_plane.broker_liveness import PROBE_INTERVAL_S, BrokerLiveness, refuses
from control_plane.defaults import DEFAULT_REFRESH_INTERVAL_S
from control_plane.envoy_resources import (
    BrokerRoute,
    GatewayPlan,
    KafkaBrokerFilter,
    compile_snapshot,
)
from control_plane.fleet import EXT_PROC, Fleet, NodeStatus
from control_plane.kafka_broker import FILTER_NAME as KAFKA_BROKER
from control_plane.kafka_broker import global_api_lists
from control_plane.listener_binds import UnboundListeners
from control_plane.native_filter import (
    MODULE_LOAD_FAILED,
    HandOff,
    NativeFilter,
    interest,
    module_metrics,
    runs_module,
)
from control_plane.providers import DirectoryRuleProvider, RuleProvider
from control_plane.rules_distribution import rules_snapshot
from control_plane.snapshot import LISTENER, RULES, SECRET, Snapshot, SnapshotCache
from control_plane.tls import ListenerTls, ServerTls, TlsMaterial, UpstreamTls
from control_plane.topology import (
    Broker,
    BrokerRefused,
    DiscoveryError,
    SaslCredentials,
    Topology,
    fetch_topology,
)
from ext_proc.defaults import DEFAULT_POLL_INTERVAL_S
from ext_proc.grpc_listen import exclusive_server, listen
from ext_proc.heap import building
from filter_rules import CompiledRuleSet, RuleSet

log = logging.getLogger(__name__)

# How long a starting control plane waits for the brokers to answer (they may be starting).
FIRST_REFRESH_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class EnvoyGroup:
    """Envoys whose node.cluster is `name`: which brokers they front and how.

    `brokers` None: every broker. Port of broker b: `listen_port_base` + b's position
    in the order brokers were first seen (0: a free port per broker)."""

    name: str
    brokers: frozenset[int] | None = None
    listen_host: str = "0.0.0.0"
    advertised_host: str = "127.0.0.1"
    listen_port_base: int = 19092
    sasl_termination: bool | None = None  # None: the control plane's setting

    def fronts(self, broker: int) -> bool:
        return self.brokers is None or broker in self.brokers


def load_groups(path: Path) -> tuple[EnvoyGroup, ...]:
    """Groups from YAML: `groups: [{name, brokers: [1, 2], listen_host, advertised_host,
    listen_port_base}]`; ValueError naming the entry when one is malformed."""
    data = yaml.safe_load(path.read_text())
    entries = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a mapping with a 'groups' list")
    groups = []
    allowed = {"name", "brokers", "listen_host", "advertised_host", "listen_port_base",
               "sasl_termination"}
    for i, entry in enumerate(entries):
        where = f"{path}: groups[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"{where}: needs a 'name' string")
        unknown = set(entry) - allowed
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        brokers = entry.get("brokers")
        if brokers is not None and (not isinstance(brokers, list)
                                    or not all(isinstance(b, int) for b in brokers)):
            raise ValueError(f"{where}: 'brokers' must be a list of broker ids")
        port = entry.get("listen_port_base", 19092)
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"{where}: 'listen_port_base' must be a port number")
        termination = entry.get("sasl_termination")
        if termination is not None and not isinstance(termination, bool):
            raise ValueError(f"{where}: 'sasl_termination' must be true or false")
        groups.append(EnvoyGroup(
            name=entry["name"],
            sasl_termination=termination,
            brokers=None if brokers is None else frozenset(brokers),
            listen_host=str(entry.get("listen_host", "0.0.0.0")),
            advertised_host=str(entry.get("advertised_host", "127.0.0.1")),
            listen_port_base=port,
        ))
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: group names must be unique")
    return tuple(groups)


def _address(broker: Broker) -> str:
    """host:port of a broker, an IPv6 host in brackets."""
    host = f"[{broker.host}]" if ":" in broker.host else broker.host
    return f"{host}:{broker.port}"


@dataclass(frozen=True)
class GroupPlan(GatewayPlan):
    """A group's plan; brokers it does not front are advertised where another group does."""

    elsewhere: tuple[tuple[int, str, int], ...] = ()

    def advertised_routes(self) -> dict[int, tuple[str, int]]:
        return {**{b: (h, p) for b, h, p in self.elsewhere}, **super().advertised_routes()}


@dataclass(frozen=True)
class _PreparedRules:
    """A rule set made ready off the event loop: its snapshot for ext_proc nodes (None:
    the version is already published), the kafka_broker filter's API lists and the native
    filter's interest table (None: unchanged)."""

    version: str
    snapshot: Snapshot | None
    kafka_broker: KafkaBrokerFilter | None
    native_interest: dict[str, Any] | None


NATIVE, EXT_PROC_PATH = "native", "ext-proc"
DATA_PATHS = (NATIVE, EXT_PROC_PATH)


@dataclass(frozen=True)
class ControlPlaneSettings:
    bootstrap_servers: str
    ext_proc_host: str
    ext_proc_port: int
    # More workers of the ext_proc service on that host (a pool: Envoy spreads its
    # connections over all of them, keg's native filter too).
    ext_proc_more_ports: tuple[int, ...] = ()
    xds_host: str = "127.0.0.1"
    xds_port: int = 0
    listen_host: str = "127.0.0.1"
    advertised_host: str | None = None
    # Broker listeners get consecutive ports from here, in order of first sight;
    # 0 asks the OS for free ports (tests, several gateways on one machine).
    listen_port_base: int = 19092
    message_timeout_s: float = 5.0
    failure_mode_allow: bool = False
    refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S
    # How often each broker's port is asked whether it refuses connections (a refusing
    # broker's listener is withdrawn, see control_plane.broker_liveness); 0: never.
    broker_probe_interval_s: float = PROBE_INTERVAL_S
    # The control plane's login to the brokers (PLAIN, SCRAM, OAUTHBEARER).
    sasl: SaslCredentials | None = None
    # TLS on the gateway's listeners (SDS; mutual with a client CA) and to the brokers
    # (the control plane's discovery uses the same); see control_plane.tls.
    tls: ListenerTls | None = None
    upstream_tls: UpstreamTls | None = None
    # TLS of the xDS/ADS server (it carries listener keys over SDS): with a client CA,
    # Envoys and ext_proc instances must present a certificate it signed.
    xds_tls: ServerTls | None = None
    # How often the certificate files are checked for a change (rotation).
    tls_poll_interval_s: float = 1.0
    # The listeners authenticate Kafka clients themselves (SASL termination, in the
    # ext_proc service) and reach the brokers as its service account; groups may say
    # otherwise (EnvoyGroup.sasl_termination). Such listeners run the ext_proc chain on
    # every node: the native module cannot log in to brokers (docs/production.md).
    sasl_termination: bool = False
    # A watched rule directory as the rule source (when no provider is passed), and how
    # often it is looked at.
    rules_dir: Path | None = None
    rules_poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    # Where the order brokers were first seen in is kept (JSON): a broker's listener is
    # listen_port_base + its place there, so it keeps its port across restarts, even one
    # that starts while an earlier broker is down. None: kept in memory only.
    broker_order_file: Path | None = None
    # Ports keg's own parts listen on (metrics, the REST API, xDS...): a broker's
    # listener never gets one; the brokers' ports from listen_port_base go around them.
    reserved_ports: frozenset[int] = frozenset()
    # Envoy groups of a mesh; nodes of other clusters get the default group.
    groups: tuple[EnvoyGroup, ...] = ()
    # Put the rule set's global API lists into the kafka_broker filter of nodes that
    # have it (a change of those lists is then a listener change on those nodes).
    kafka_broker_api_lists: bool = True
    # Nodes disconnected this long leave the fleet view (and the cache).
    forget_after_s: float = 3600.0
    # "native": keg's own filter (an Envoy dynamic module) on nodes whose Envoy version
    # matches the module's ABI, the network ext_proc chain on every other node;
    # "ext-proc": the ext_proc chain everywhere.
    data_path: str = "ext-proc"
    max_frame_size: int = 100 * 1024 * 1024
    # What keg's native filter may hold in frames being assembled, per Envoy process.
    max_held_bytes: int = 256 * 1024 * 1024
    # The JWT claim an OAUTHBEARER token's principal is (keg's module reads it itself).
    oauth_principal_claim: str = "sub"
    # Where keg's native filter hands frames to (host:port of the ext_proc service's
    # workers, frames mode); empty: the ext_proc service above.
    handoff_endpoints: tuple[str, ...] = ()

    @property
    def ext_proc_ports(self) -> tuple[int, ...]:
        return (self.ext_proc_port, *self.ext_proc_more_ports)

    @property
    def handoff(self) -> HandOff:
        """How native nodes hand frames to the Python service."""
        endpoints = self.handoff_endpoints or tuple(
            f"{self.ext_proc_host}:{port}" for port in self.ext_proc_ports)
        return HandOff(endpoints, failure_mode_allow=self.failure_mode_allow,
                       timeout_ms=round(self.message_timeout_s * 1000))

    def __post_init__(self) -> None:
        if self.data_path not in DATA_PATHS:
            raise ValueError(f"data_path must be one of {', '.join(DATA_PATHS)}, "
                             f"not {self.data_path!r}")


# What every group's plan takes from the control plane's settings as they are: where the
# ext_proc service is and how Envoy waits for it.
PLAN_SETTINGS: Final = ("ext_proc_host", "ext_proc_port", "ext_proc_more_ports",
                        "message_timeout_s", "failure_mode_allow")


def _loopback(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


# The kernel hands the ports of its ephemeral range to outgoing connections: a port
# picked there for a listener can be taken by some client's connection before the
# listener binds it (Envoy then NACKs the listener: "Address already in use"). Ports
# are picked below that range, where only listeners live.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED_PORT = 10000
_picked_ports: set[int] = set()  # handed out by this process: never twice
_picking = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now and not handed out before by this process, below the
    kernel's ephemeral range when there is room there (else any free port)."""
    return free_port_block(1, host)


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports as free_port picks one (listeners of a
    group of brokers): none handed out before by this process, all free on `host`."""
    try:
        ephemeral_low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = LOWEST_PICKED_PORT
    below_ephemeral = ephemeral_low - LOWEST_PICKED_PORT >= 1000
    with _picking:
        for _ in range(64 if below_ephemeral else 0):
            base = random.randrange(LOWEST_PICKED_PORT, ephemeral_low - count + 1)
            if _take(host, range(base, base + count)):
                return base
        if count == 1:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
                _picked_ports.add(port)
                return port
        for _ in range(256):
            base = random.randrange(LOWEST_PICKED_PORT, 65536 - count)
            if _take(host, range(base, base + count)):
                return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def _take(host: str, ports: range) -> bool:
    if any(p in _picked_ports or not _bindable(host, p) for p in ports):
        return False
    _picked_ports.update(ports)
    return True


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


TopologySource = Callable[[], Awaitable[Topology]]


class ControlPlane:
    def __init__(self, settings: ControlPlaneSettings, rules: RuleProvider | None = None,
                 topology_source: TopologySource | None = None) -> None:
        self.settings = settings
        self.rules = rules or (DirectoryRuleProvider(settings.rules_dir,
                                                     settings.rules_poll_interval_s)
                               if settings.rules_dir is not None else None)
        self._fetch = topology_source or (lambda: fetch_topology(
            self._discovery_servers(), sasl=settings.sasl, tls=settings.upstream_tls))
        # TlsConfigError here: a certificate that cannot serve stops the start.
        self.tls = (TlsMaterial(settings.tls, settings.upstream_tls)
                    if settings.tls is not None or settings.upstream_tls is not None else None)
        self.cache = SnapshotCache()
        self.fleet = Fleet()
        self.topology: Topology | None = None
        self.plan: GatewayPlan | None = None  # the default group's (one-gateway setups)
        self.default_group = EnvoyGroup(
            "", None, settings.listen_host, settings.advertised_host or settings.listen_host,
            settings.listen_port_base)
        self._groups = {g.name: g for g in settings.groups}
        # The cluster the kept order is of: another cluster's starts afresh.
        self._order_cluster, self._broker_order, self._kept_addresses = self._load_broker_order()
        self._ports: dict[tuple[str, int], int] = {}
        self._plans: dict[str, GroupPlan] = {}
        # (group, kafka_broker filter, native, the node's module metrics as JSON)
        self._compiled: dict[tuple[str, KafkaBrokerFilter | None, bool, str], Snapshot] = {}
        self._rules_snapshot: Snapshot | None = None
        # The native filter's interest table for the live rule set (ECDS, native nodes).
        self._native_interest: dict[str, Any] | None = None
        self._rules_update: asyncio.Task[None] | None = None
        self._rules_dirty = False
        self._verdicts: set[asyncio.Task[None]] = set()  # being recorded off the loop
        self._kafka_broker = KafkaBrokerFilter()
        self.unbound = UnboundListeners()  # listeners Envoys could not bind, tried again
        self.liveness = BrokerLiveness()  # brokers that refuse connections: no listener
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.xds_port = 0
        self.fleet.on_connect.append(self._node_connected)
        self.fleet.on_verdict.append(self._node_verdict)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.rules is not None:
            self._install_rules(await asyncio.to_thread(self._prepare_rules))
            self.rules.subscribe(self._rules_changed_threadsafe)
            watch = getattr(self.rules, "watch", None)  # providers that poll their source
            if watch is not None:
                self._tasks.append(asyncio.create_task(watch()))
        # Responses are bounded per node by what the node says it accepts (ads.py,
        # refused_as_too_large), not by a server-wide send limit.
        server = exclusive_server([("grpc.max_send_message_length", -1)])
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
            AggregatedDiscovery(self.cache, self.fleet), server
        )
        address = f"{self.settings.xds_host}:{self.settings.xds_port}"
        xds_tls = self.settings.xds_tls
        self.xds_port = listen(server, address, "the xDS server",
                               None if xds_tls is None else xds_tls.grpc_credentials())
        if xds_tls is None and self.tls is not None and self.tls.listener is not None \
                and not _loopback(self.settings.xds_host):
            log.warning("xDS on %s without TLS carries the listeners' private keys "
                            "(SDS) in plaintext: give the control plane a certificate",
                            self.settings.xds_host)
        await server.start()
        self._server = server
        log.info("xDS (ADS, SotW and delta) listening on %s:%d%s", self.settings.xds_host,
                 self.xds_port, " over TLS" if xds_tls is not None else "")
        await self._first_refresh()
        self._tasks.append(asyncio.create_task(self._refresh_forever()))
        if self.settings.broker_probe_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._probe_brokers_forever()))
        if self.tls is not None:
            self._tasks.append(asyncio.create_task(self._watch_tls()))

    async def _first_refresh(self, timeout: float = FIRST_REFRESH_TIMEOUT_S) -> None:
        """The brokers may still be starting: retry until one answers (not when one
        refused keg's login: that does not go away by waiting, it failed after a minute
        of "waiting for brokers" with an empty error)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await self.refresh()
                return
            except BrokerRefused:
                raise
            except (DiscoveryError, OSError) as err:
                if asyncio.get_running_loop().time() > deadline:
                    raise DiscoveryError(f"no broker answered within {timeout}s: {err}") from err
                log.info("waiting for brokers: %s", err)
                await asyncio.sleep(0.5)

    async def stop(self, grace: float = 1.0) -> None:
        if self._rules_update is not None:
            self._tasks.append(self._rules_update)
            self._rules_update = None
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._verdicts:  # answers being recorded: into the store before it closes
            await asyncio.wait(list(self._verdicts), timeout=10)
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(max(self.settings.refresh_interval_s, 0.1))  # never a spin
            for node_id in self.fleet.forget(self.settings.forget_after_s):
                self.cache.clear(node_id)
                self.unbound.forget(node_id)
            try:
                await self.refresh()
            except (DiscoveryError, OSError) as err:
                # Keep serving the last good snapshots; brokers may be restarting.
                log.warning("topology refresh failed, keeping the last snapshots: %s", err)

    async def _probe_brokers_forever(self) -> None:
        """Withdraw the listener of a broker that refuses connections, and give it back
        once the broker accepts one (`control_plane.broker_liveness`)."""
        while True:
            await asyncio.sleep(self.settings.broker_probe_interval_s)
            if self.topology is None:
                continue
            brokers = self.topology.brokers
            answers = await asyncio.gather(*(refuses(b.host, b.port) for b in brokers))
            before = self.liveness.down
            if self.liveness.observe({b.node_id: r for b, r in zip(brokers, answers,
                                                                   strict=True)}):
                for node_id in sorted(self.liveness.down - before):
                    log.warning("broker %d refuses connections: its listener is withdrawn "
                                "until it answers (clients are refused, as by the broker)",
                                node_id)
                for node_id in sorted(before - self.liveness.down):
                    log.info("broker %d answers again: its listener is back", node_id)
                self._replan()

    def _replan(self) -> None:
        """Compile and publish every group's plan afresh (the brokers changed)."""
        self._plans.clear()
        self._compiled.clear()
        self.plan = self._group_plan(self.default_group)
        self._publish_envoys()

    async def _watch_tls(self) -> None:
        """Certificate files replaced: their new secrets go to every Envoy (SDS); no
        listener changes, so no connection is drained or dropped."""
        assert self.tls is not None
        while True:
            await asyncio.sleep(self.settings.tls_poll_interval_s)
            if self.tls.reload():
                self._publish_envoys()

    # -- topology ----------------------------------------------------------------------

    async def refresh(self) -> bool:
        """Re-read the topology; publish new snapshots when it changed."""
        return self.set_topology(await self._fetch())

    def _discovery_servers(self) -> str:
        """Whom discovery asks: the bootstrap servers, then every broker already known,
        as Kafka's clients do. With the bootstrap servers alone, one of them down (often
        the only one given) froze the topology: a broker added meanwhile never got a
        listener, and clients sent to it timed out."""
        servers = [s.strip() for s in self.settings.bootstrap_servers.split(",") if s.strip()]
        # Before this run knows any: the brokers the last run knew (a restart while the
        # bootstrap server is down).
        servers += ([_address(b) for b in self.topology.brokers] if self.topology is not None
                    else self._kept_addresses)
        return ",".join(dict.fromkeys(servers))

    def set_topology(self, topology: Topology) -> bool:
        if topology == self.topology:
            return False
        self.topology = topology
        if topology.cluster_id != self._order_cluster:
            if self._broker_order:
                log.info("brokers of cluster %s: listener ports given afresh (the kept order "
                         "was cluster %s's)", topology.cluster_id, self._order_cluster)
            self._order_cluster, self._broker_order = topology.cluster_id, []
            self._ports.clear()
        self._broker_order += [b.node_id for b in topology.brokers
                               if b.node_id not in self._broker_order]
        self._kept_addresses = [_address(b) for b in topology.brokers]
        self._save_broker_order()
        self.liveness.keep_only(b.node_id for b in topology.brokers)
        self._replan()
        log.info("topology: cluster %s, brokers %s", topology.cluster_id,
                 ", ".join(f"{b.node_id}={b.host}:{b.port}" for b in topology.brokers))
        return True

    def _load_broker_order(self) -> tuple[str | None, list[int], list[str]]:
        """The kept cluster id, order and the brokers' last addresses ({"cluster_id": ...,
        "brokers": [node ids], "addresses": ["host:port", ...]})."""
        path = self.settings.broker_order_file
        if path is None or not path.exists():
            return None, [], []
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            log.warning("broker order in %s unreadable (%s): ports follow this run's order",
                        path, err)
            return None, [], []
        kept = kept if isinstance(kept, dict) else {}
        order, cluster = kept.get("brokers"), kept.get("cluster_id")
        addresses = kept.get("addresses", [])
        if not (isinstance(order, list) and all(type(n) is int for n in order)
                and len(set(order)) == len(order) and isinstance(cluster, str | None)
                and isinstance(addresses, list) and all(isinstance(a, str) for a in addresses)):
            log.warning("broker order in %s is not {cluster_id, brokers: distinct node ids, "
                        "addresses}: ports follow this run's order", path)
            return None, [], []
        return cluster, order, addresses

    def _save_broker_order(self) -> None:
        path = self.settings.broker_order_file
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            written = path.with_name(path.name + ".tmp")
            written.write_text(json.dumps({"cluster_id": self._order_cluster,
                                           "brokers": self._broker_order,
                                           "addresses": self._kept_addresses}) + "\n")
            written.replace(path)
        except OSError as err:
            log.warning("cannot keep the broker order in %s: %s", path, err)

    def group_of(self, status: NodeStatus) -> EnvoyGroup:
        return self._groups.get(status.cluster, self.default_group)

    def _port(self, group: EnvoyGroup, broker: int) -> int:
        key = (group.name, broker)
        if key not in self._ports:
            self._ports[key] = (self._nth_port(group.listen_port_base,
                                               self._broker_order.index(broker))
                                if group.listen_port_base else free_port(group.listen_host))
        return self._ports[key]

    def _nth_port(self, base: int, index: int) -> int:
        """The `index`-th port from `base` that keg's own parts do not use (a broker's
        listener on a port of keg's own could not bind: its clients timed out)."""
        port = base - 1
        for _ in range(index + 1):
            port += 1
            while port in self.settings.reserved_ports:
                port += 1
        return port

    def _group_plan(self, group: EnvoyGroup) -> GroupPlan:
        plan = self._plans.get(group.name)
        if plan is not None:
            return plan
        assert self.topology is not None
        s = self.settings
        routes, elsewhere = [], []
        for broker in self.topology.brokers:
            if broker.node_id in self.liveness.down and group.fronts(broker.node_id):
                continue  # no listener: advertised at its port below (`_absent`)
            if group.fronts(broker.node_id):
                routes.append(BrokerRoute(broker.node_id, broker.host, broker.port,
                                          self._port(group, broker.node_id)))
                continue
            owner = next((g for g in self._groups.values() if g.fronts(broker.node_id)),
                         self.default_group)
            elsewhere.append((broker.node_id, owner.advertised_host,
                              self._port(owner, broker.node_id)))
        elsewhere += self._absent(group)
        plan = self._plans[group.name] = GroupPlan(
            routes=tuple(routes), elsewhere=tuple(elsewhere),
            listen_host=group.listen_host, advertised_host=group.advertised_host,
            sasl_termination=self.terminates_sasl(group),
            **{name: getattr(s, name) for name in PLAN_SETTINGS})
        return plan

    def _absent(self, group: EnvoyGroup) -> list[tuple[int, str, int]]:
        """Brokers seen before and missing from the cluster's Metadata now (down, fenced),
        or refusing connections, whose port is known, advertised there: an answer naming
        one (DescribeCluster of fenced brokers, a coordinator back before the next
        refresh) names its own port, which listens again once it is back, not another
        broker's listener."""
        assert self.topology is not None
        present = {b.node_id for b in self.topology.brokers} - self.liveness.down
        return [(node_id, group.advertised_host, self._port(group, node_id))
                for node_id in self._broker_order
                if node_id not in present and group.fronts(node_id)
                and (group.listen_port_base or (group.name, node_id) in self._ports)]

    def terminates_sasl(self, group: EnvoyGroup) -> bool:
        return (self.settings.sasl_termination if group.sasl_termination is None
                else group.sasl_termination)

    # -- snapshots per node ------------------------------------------------------------

    def _envoy_snapshot(self, status: NodeStatus) -> Snapshot | None:
        if self.topology is None:
            return None
        group = self.group_of(status)
        kafka_broker = self._kafka_broker if status.has_extension(KAFKA_BROKER) else None
        native = self.runs_native(status)
        metrics = module_metrics(status.metadata) if native else None
        key = (group.name, kafka_broker, native, json.dumps(metrics, sort_keys=True))
        base = self._compiled.get(key)
        if base is None:
            filter_ = self._native_filter(group, metrics) if native else None
            base = self._compiled[key] = compile_snapshot(self._group_plan(group),
                                                          kafka_broker=kafka_broker,
                                                          native=filter_, tls=self.tls)
        if self.tls is not None:  # the current certificates (they rotate, listeners stay)
            base = base.with_resources(SECRET, self.tls.secrets)
        snapshot = base.retaining(status.of(LISTENER).accepted)
        marked = self.unbound.marked(status.node_id, snapshot.resources.get(LISTENER, {}))
        return snapshot if marked is None else snapshot.with_resources(LISTENER, marked)

    def _native_filter(self, group: EnvoyGroup,
                       metrics: Mapping[str, Any] | None = None) -> NativeFilter:
        """keg's module for `group`'s listeners; with mutual TLS it maps client
        certificates to principals itself, with the listeners' mapping rules; `metrics`:
        its labelled-metrics exporter, as the node asked (`module_metrics`)."""
        listener = self.tls.listener if self.tls is not None else None
        mutual = listener if listener is not None and listener.mutual else None
        return NativeFilter(
            route_table=f"keg/{group.name or 'default'}",
            max_frame_size=self.settings.max_frame_size,
            max_held_bytes=self.settings.max_held_bytes, interest=self.native_interest(),
            principal_mapping_rules=mutual.principal_mapping_rules if mutual else None,
            principal_from=mutual.principal_from if mutual else None, metrics=metrics,
            oauth_principal_claim=self.settings.oauth_principal_claim)

    def native_interest(self) -> dict[str, Any]:
        """The interest table native nodes get: the live rule set's (an empty rule set's
        until the rule source has one)."""
        if self._native_interest is None:
            self._native_interest = interest(RuleSet(), "", self.settings.handoff)
        return self._native_interest

    def _update_native_interest(self, table: dict[str, Any] | None) -> None:
        """A new rule set: native nodes get its interest table by ECDS (the module's
        process-wide table, so live connections follow it; listeners stay)."""
        if table is None or table == self._native_interest:
            return
        self._native_interest = table
        self._compiled = {k: v for k, v in self._compiled.items() if not k[2]}
        self._publish_envoys()

    def runs_native(self, status: NodeStatus) -> bool:
        """Whether this Envoy gets keg's own filter: native asked for, its Envoy version
        is the one the module is built for, it did not fail to load the module, and its
        listeners do not terminate SASL (keg's service-account login to the brokers lives
        in the ext_proc service)."""
        return (self.settings.data_path == NATIVE and runs_module(status.build_version)
                and status.module_error is None
                and not self.terminates_sasl(self.group_of(status)))

    def _module_failed(self, status: NodeStatus, error: str) -> None:
        """An Envoy of the module's version could not load it (not on its search path,
        built for another ABI): its listeners refused every connection. It gets the
        ext_proc data path until its stream opens again."""
        status.module_error = error
        status.data_path = EXT_PROC_PATH
        log.warning("node %s cannot load keg's Envoy filter: it gets the ext_proc data path "
                    "until it reconnects (%s)", status.node_id, error)
        self._publish_node(status)

    def _publish_node(self, status: NodeStatus) -> None:
        if status.role == EXT_PROC:
            if self._rules_snapshot is not None:
                self.cache.set_if_changed(status.node_id, self._rules_snapshot)
            return
        snapshot = self._envoy_snapshot(status)
        if snapshot is not None:
            self.cache.set_if_changed(status.node_id, snapshot)

    def _bind_again(self, status: NodeStatus) -> None:
        """The listeners `status` could not bind go again (`control_plane.listener_binds`)."""
        if self.fleet.nodes.get(status.node_id) is status and self.unbound.retry(status.node_id):
            log.info("node %s: trying its unbound listeners again", status.node_id)
            self._publish_node(status)

    def _publish_envoys(self) -> None:
        for status in list(self.fleet.nodes.values()):
            if status.role != EXT_PROC:
                self._publish_node(status)

    def _node_connected(self, status: NodeStatus) -> None:
        if status.has_extension(KAFKA_BROKER):
            log.info("node %s has %s: compiling it in", status.node_id, KAFKA_BROKER)
        if status.role != EXT_PROC:
            status.data_path = NATIVE if self.runs_native(status) else EXT_PROC_PATH
            if (self.settings.data_path == NATIVE and status.data_path != NATIVE
                    and self.terminates_sasl(self.group_of(status))):
                log.warning("node %s's listeners terminate SASL: they get the ext_proc data "
                            "path (keg's Envoy filter cannot log in to the brokers)",
                            status.node_id)
            elif self.settings.data_path == NATIVE and status.data_path != NATIVE:
                log.warning("node %s runs Envoy %s, not the version keg's filter is built for: "
                            "it gets the ext_proc data path", status.node_id,
                            status.user_agent or "of unknown version")
        self._publish_node(status)

    def _node_verdict(self, status: NodeStatus, type_url: str, version: str,
                      error: str | None) -> None:
        if (error is not None and status.role != EXT_PROC and status.data_path == NATIVE
                and MODULE_LOAD_FAILED in error):
            self._module_failed(status, error)
            return
        if type_url == LISTENER and status.role != EXT_PROC:
            if error is None:
                self.unbound.accepted(status.node_id)
            elif (delay := self.unbound.refused(status.node_id, error)) is not None:
                asyncio.get_running_loop().call_later(delay, self._bind_again, status)
            # Once new listeners are accepted, clusters only the old ones used can go.
            self._publish_node(status)
        # The rule source learns what the fleet made of its versions (the store marks
        # a refused one rejected and serves the last good one again).
        report = getattr(self.rules, "verdict", None)
        if type_url != RULES or status.role != EXT_PROC or report is None:
            return

        def record() -> None:
            try:
                report(version, status.node_id, error)
            except Exception:  # a store hiccup must not break the node's stream
                log.exception("could not record %s's answer to rules version %s",
                              status.node_id, version)

        if self._loop is None or not self._loop.is_running():
            record()
            return
        # A database write (and on a rejection the store's republication): off the loop.
        task = self._loop.create_task(asyncio.to_thread(record))
        self._verdicts.add(task)
        task.add_done_callback(self._verdicts.discard)

    # -- rules -------------------------------------------------------------------------

    def _rules_changed_threadsafe(self, *_: Any) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._rules_changed)

    def _rules_changed(self) -> None:
        """The provider has a new rule set: prepare it in a worker thread (reading,
        encoding and compiling 100,000 rules takes seconds the event loop -- xDS, the
        REST API -- must not wait), then install it here. Changes during a preparation
        are coalesced into one more."""
        if self._rules_update is not None and not self._rules_update.done():
            self._rules_dirty = True
            return
        self._rules_update = asyncio.create_task(self._update_rules())

    async def _update_rules(self) -> None:
        while True:
            self._rules_dirty = False
            try:
                self._install_rules(await asyncio.to_thread(self._prepare_rules))
            except Exception:  # a provider hiccup: the fleet keeps the last rule set
                log.exception("could not prepare the new rule set; keeping version %s",
                              self.rules_version)
            if not self._rules_dirty:
                return

    def refresh_rules(self) -> None:
        """Install the provider's current rule set now, on the calling thread (what a
        rule change does off the loop; for tests and embedders without a loop)."""
        self._install_rules(self._prepare_rules())

    def _prepare_rules(self) -> _PreparedRules:
        """What installing the provider's current rule set needs (any thread)."""
        assert self.rules is not None
        with building():  # no garbage collection walking 100,000 rules meanwhile
            number, ruleset = self.rules.current()
            version = str(number)  # the store numbers its versions
            if (self._rules_snapshot is not None
                    and self._rules_snapshot.version(RULES) == version):
                return _PreparedRules(version, None, None, None)
            native = (interest(ruleset, version, self.settings.handoff)
                      if self.settings.data_path == NATIVE else None)
            return _PreparedRules(version, rules_snapshot(version, ruleset),
                                  self._kafka_broker_lists(ruleset), native)

    def _install_rules(self, prepared: _PreparedRules) -> None:
        """Publish a prepared rule set to every ext_proc node (on the event loop)."""
        snapshot = prepared.snapshot
        if snapshot is None or (self._rules_snapshot is not None
                                and self._rules_snapshot.versions == snapshot.versions):
            return
        self._rules_snapshot = snapshot
        log.info("rule set version %s: publishing to ext_proc instances", prepared.version)
        for status in list(self.fleet.nodes.values()):
            if status.role == EXT_PROC:
                self.cache.set_if_changed(status.node_id, snapshot)
        lists = prepared.kafka_broker
        if lists is not None and lists != self._kafka_broker:
            self._kafka_broker = lists
            self._compiled = {k: v for k, v in self._compiled.items() if k[1] is None}
            self._publish_envoys()
        self._update_native_interest(prepared.native_interest)

    def _kafka_broker_lists(self, ruleset: Any) -> KafkaBrokerFilter | None:
        """The API lists the kafka_broker filter enforces; None: leave them as they are."""
        if not self.settings.kafka_broker_api_lists:
            return None
        try:
            allowed, denied = global_api_lists(CompiledRuleSet(ruleset).rules)
        except ValueError as err:
            log.warning("kafka_broker API lists unchanged: %s", err)
            return None
        return KafkaBrokerFilter(allowed, denied)

    @property
    def rules_version(self) -> str | None:
        return None if self._rules_snapshot is None else self._rules_snapshot.version(RULES)

    # -- what the API and the gateway use ----------------------------------------------

    def fleet_status(self) -> list[dict[str, Any]]:
        """Every Envoy and ext_proc node: versions per type, last ACK/NACK, last seen."""
        return self.fleet.status()

    def nodes_converged(self, role: str | None = None,
                        nodes: Iterable[str] | None = None) -> bool:
        """Whether every connected node (of `role`) has applied its current snapshot."""
        wanted = set(nodes) if nodes is not None else None
        for status in self.fleet.nodes.values():
            if (role is not None and status.role != role) or not status.connected:
                continue
            if wanted is not None and status.node_id not in wanted:
                continue
            snapshot = self.cache.get(status.node_id)
            if snapshot is None:
                continue
            for type_url, version in snapshot.versions.items():
                if status.of(type_url).acked_version != version:
                    return False
        return True

    def bootstrap_address(self) -> str:
        assert self.plan is not None
        return ",".join(f"{self.plan.advertised_host}:{r.listen_port}" for r in self.plan.routes)

"""Compile a gateway plan (brokers, the ports that front them) into Envoy resources.

Per broker: a listener and a cluster for the broker; once: the HTTP/2 cluster of the
ext_proc service. A listener's chain is `[network ext_proc -> tcp_proxy]`, or on nodes
that load keg's own filter (control_plane.native_filter) `[dynamic module ->
tcp_proxy]`. Rule changes never touch these resources (a listener change drains live
Kafka connections), so everything per-connection the processor needs rides in
`initial_metadata` (ext_proc) or in the module's route table (native).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2
from envoy.config.core.v3 import (
    address_pb2,
    base_pb2,
    config_source_pb2,
    extension_pb2,
    grpc_service_pb2,
    protocol_pb2,
)
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.network.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

from control_plane.kafka_broker import FILTER_NAME as KAFKA_BROKER
from control_plane.kafka_broker import kafka_broker_config
from control_plane.native_filter import FILTER_TYPE as NATIVE_FILTER_TYPE
from control_plane.native_filter import NativeFilter, module_config, network_filter
from control_plane.snapshot import CLUSTER, EXTENSION_CONFIG, LISTENER, SECRET, Snapshot
from control_plane.tls import TlsMaterial, is_ip
from ext_proc.connection import (
    BROKER_ID,
    BROKER_ROUTES,
    CLIENT_ADDRESS,
    CONNECTION_ID,
    GATEWAY_ADDRESS,
    PEER_SUBJECT,
    PEER_URI_SAN,
    PRINCIPAL_FROM,
    PRINCIPAL_RULES,
    SASL_TERMINATION,
    TLS,
    encode_rules,
    format_routes,
)

EXT_PROC_CLUSTER = "keg_ext_proc"
# Kafka clients keep many long-lived connections; Envoy's default circuit breaker
# (1024 requests, i.e. ext_proc streams) would cap the gateway at 1024 connections.
_UNLIMITED = 1_000_000_000


@dataclass(frozen=True)
class BrokerRoute:
    node_id: int
    broker_host: str
    broker_port: int
    listen_port: int

    @property
    def listener_name(self) -> str:
        return f"kafka_broker_{self.node_id}"

    @property
    def cluster_name(self) -> str:
        return f"kafka_broker_{self.node_id}"


@dataclass(frozen=True)
class GatewayPlan:
    routes: tuple[BrokerRoute, ...]
    listen_host: str
    advertised_host: str
    ext_proc_host: str
    ext_proc_port: int
    ext_proc_more_ports: tuple[int, ...] = ()  # the other workers of a pool, same host
    message_timeout_s: float = 5.0
    failure_mode_allow: bool = False
    # What Envoy buffers per connection before it stops reading from that peer (set on
    # every listener and cluster): a client that sends faster than the data path takes
    # its bytes is slowed at the socket, not buffered without bound.
    connection_buffer_bytes: int = 1024 * 1024
    # The listeners authenticate clients themselves (ext_proc.sasl.termination).
    sasl_termination: bool = False

    def broker_endpoints(self) -> tuple[tuple[int, str, int], ...]:
        """(node id, broker host, broker port) of the brokers this plan fronts."""
        return tuple((r.node_id, r.broker_host, r.broker_port) for r in self.routes)

    def advertised_routes(self) -> dict[int, tuple[str, int]]:
        return {r.node_id: (self.advertised_host, r.listen_port) for r in self.routes}


def _any(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def _socket_address(host: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=host, port_value=port)
    )


def _unlimited_breakers() -> circuit_breaker_pb2.CircuitBreakers:
    limit = wrappers_pb2.UInt32Value(value=_UNLIMITED)
    return circuit_breaker_pb2.CircuitBreakers(
        thresholds=[circuit_breaker_pb2.CircuitBreakers.Thresholds(
            max_connections=limit, max_pending_requests=limit, max_requests=limit,
        )]
    )


_TLS_SOCKET = "envoy.transport_sockets.tls"


def _transport_socket(context: Message | None) -> base_pb2.TransportSocket | None:
    if context is None:
        return None
    return base_pb2.TransportSocket(name=_TLS_SOCKET, typed_config=_any(context))


def _cluster(name: str, host: str, port: int, http2: bool = False,
             buffer_bytes: int = GatewayPlan.connection_buffer_bytes,
             more_ports: tuple[int, ...] = (),
             tls: TlsMaterial | None = None) -> cluster_pb2.Cluster:
    """A cluster of `host:port` (and `host` on each of `more_ports`: round robin), over
    TLS when `tls` says so."""
    cluster = cluster_pb2.Cluster(
        name=name,
        per_connection_buffer_limit_bytes=wrappers_pb2.UInt32Value(value=buffer_bytes),
        connect_timeout=_duration(5),
        type=cluster_pb2.Cluster.STATIC if is_ip(host) else cluster_pb2.Cluster.STRICT_DNS,
        circuit_breakers=_unlimited_breakers(),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[
                endpoint_components_pb2.LbEndpoint(
                    endpoint=endpoint_components_pb2.Endpoint(address=_socket_address(host, p))
                ) for p in (port, *more_ports)
            ])],
        ),
    )
    socket = _transport_socket(tls.upstream_context(host) if tls is not None else None)
    if socket is not None:
        cluster.transport_socket.CopyFrom(socket)
    if http2:
        options = http_protocol_options_pb2.HttpProtocolOptions(
            explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(
                http2_protocol_options=protocol_pb2.Http2ProtocolOptions()
            )
        )
        cluster.typed_extension_protocol_options[
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        ].CopyFrom(_any(options))
    return cluster


@dataclass(frozen=True)
class KafkaBrokerFilter:
    """Put Envoy's contrib kafka_broker filter first in every chain (nodes that have it)."""

    api_keys_allowed: frozenset[int] = frozenset()
    api_keys_denied: frozenset[int] = frozenset()


def _native_filter_config(plan: GatewayPlan, native: NativeFilter) -> Message:
    """The group's module configuration, an ECDS resource named after its route table."""
    config = module_config(native, plan.advertised_routes(), plan.broker_endpoints())
    return extension_pb2.TypedExtensionConfig(name=native.route_table,
                                              typed_config=_any(network_filter(config)))


def _filter_chain(filters: list[listener_components_pb2.Filter],
                  tls: TlsMaterial | None) -> listener_components_pb2.FilterChain:
    """The listener's one chain, behind TLS when the gateway's listeners have it (a
    plaintext client then fails the handshake: Envoy closes its connection)."""
    chain = listener_components_pb2.FilterChain(filters=filters)
    socket = _transport_socket(tls.downstream_context() if tls is not None else None)
    if socket is not None:
        chain.transport_socket.CopyFrom(socket)
    return chain


def _tls_metadata(tls: TlsMaterial | None) -> list[tuple[str, str]]:
    """What the data path learns of a TLS connection: that it is one, and with mutual TLS
    the client certificate's names (Envoy substitutes them once the handshake is done:
    the ext_proc stream opens at the first bytes) and how to map them to a principal."""
    listener = tls.listener if tls is not None else None
    if listener is None:
        return []
    metadata = [(TLS, "1")]
    if listener.mutual:
        metadata += [
            (PEER_SUBJECT, "%DOWNSTREAM_PEER_SUBJECT%"),
            (PEER_URI_SAN, "%DOWNSTREAM_PEER_URI_SAN%"),
            (PRINCIPAL_RULES, encode_rules(listener.principal_mapping_rules)),
            (PRINCIPAL_FROM, listener.principal_from),
        ]
    return metadata


def _native_listener(route: BrokerRoute, listen_host: str, native: NativeFilter,
                     buffer_bytes: int, tls: TlsMaterial | None) -> listener_pb2.Listener:
    """`[keg's module -> tcp_proxy]`; the module's config comes by ECDS, so a route change
    updates the shared resource and never this listener (a change would drain it)."""
    tcp_proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=route.listener_name, cluster=route.cluster_name)
    discovery = config_source_pb2.ExtensionConfigSource(
        config_source=config_source_pb2.ConfigSource(
            ads=config_source_pb2.AggregatedConfigSource(),
            resource_api_version=config_source_pb2.V3),
        type_urls=[NATIVE_FILTER_TYPE],
    )
    return listener_pb2.Listener(
        name=route.listener_name,
        address=_socket_address(listen_host, route.listen_port),
        per_connection_buffer_limit_bytes=wrappers_pb2.UInt32Value(value=buffer_bytes),
        filter_chains=[_filter_chain([
            listener_components_pb2.Filter(name=native.route_table, config_discovery=discovery),
            listener_components_pb2.Filter(
                name="envoy.filters.network.tcp_proxy", typed_config=_any(tcp_proxy)
            ),
        ], tls)],
    )


def _listener(plan: GatewayPlan, route: BrokerRoute, kafka_broker: KafkaBrokerFilter | None,
              native: NativeFilter | None = None,
              tls: TlsMaterial | None = None) -> listener_pb2.Listener:
    if native is not None:
        return _native_listener(route, plan.listen_host, native, plan.connection_buffer_bytes,
                                tls)
    metadata = [
        (CLIENT_ADDRESS, "%DOWNSTREAM_REMOTE_ADDRESS%"),
        (GATEWAY_ADDRESS, f"{plan.advertised_host}:{route.listen_port}"),
        (CONNECTION_ID, "%CONNECTION_ID%"),
        (BROKER_ID, str(route.node_id)),
        (BROKER_ROUTES, format_routes(plan.advertised_routes())),
        *_tls_metadata(tls),
        *([(SASL_TERMINATION, "1")] if plan.sasl_termination else []),
    ]
    ext_proc = ext_proc_pb2.NetworkExternalProcessor(
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=EXT_PROC_CLUSTER),
            initial_metadata=[base_pb2.HeaderValue(key=k, value=v) for k, v in metadata],
        ),
        failure_mode_allow=plan.failure_mode_allow,
        message_timeout=_duration(plan.message_timeout_s),
        stat_prefix=route.listener_name,
    )
    tcp_proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=route.listener_name, cluster=route.cluster_name)
    first = []
    if kafka_broker is not None:
        config = kafka_broker_config(route.listener_name, plan.advertised_routes(),
                                     kafka_broker.api_keys_allowed, kafka_broker.api_keys_denied)
        first.append(listener_components_pb2.Filter(name=KAFKA_BROKER, typed_config=_any(config)))
    return listener_pb2.Listener(
        name=route.listener_name,
        address=_socket_address(plan.listen_host, route.listen_port),
        per_connection_buffer_limit_bytes=wrappers_pb2.UInt32Value(
            value=plan.connection_buffer_bytes),
        filter_chains=[_filter_chain([
            *first,
            listener_components_pb2.Filter(
                name="envoy.filters.network.ext_proc", typed_config=_any(ext_proc)
            ),
            listener_components_pb2.Filter(
                name="envoy.filters.network.tcp_proxy", typed_config=_any(tcp_proxy)
            ),
        ], tls)],
    )


def compile_snapshot(plan: GatewayPlan, keep_clusters: tuple[BrokerRoute, ...] = (),
                     kafka_broker: KafkaBrokerFilter | None = None,
                     native: NativeFilter | None = None,
                     tls: TlsMaterial | None = None) -> Snapshot:
    """The snapshot for `plan`; `keep_clusters` are routes of earlier plans whose
    clusters must stay (a node may still run listeners that reference them);
    `kafka_broker` only for nodes whose Envoy lists that extension; `native` for nodes
    that load keg's own filter (their listeners then have no ext_proc filter); `tls`:
    listeners and broker clusters name its secrets (served with the snapshot, SDS)."""
    clusters: dict[str, Message] = {
        EXT_PROC_CLUSTER: _cluster(EXT_PROC_CLUSTER, plan.ext_proc_host, plan.ext_proc_port,
                                   http2=True, buffer_bytes=plan.connection_buffer_bytes,
                                   more_ports=plan.ext_proc_more_ports),
    }
    for route in (*keep_clusters, *plan.routes):
        clusters[route.cluster_name] = _cluster(
            route.cluster_name, route.broker_host, route.broker_port,
            buffer_bytes=plan.connection_buffer_bytes, tls=tls)
    listeners: dict[str, Message] = {
        r.listener_name: _listener(plan, r, kafka_broker, native, tls) for r in plan.routes
    }
    references = {
        r.listener_name: frozenset({EXT_PROC_CLUSTER, r.cluster_name}) for r in plan.routes
    }
    resources: dict[str, Mapping[str, Message]] = {CLUSTER: clusters, LISTENER: listeners}
    if native is not None:
        resources[EXTENSION_CONFIG] = {native.route_table: _native_filter_config(plan, native)}
    if tls is not None and tls.secrets:
        resources[SECRET] = dict(tls.secrets)
    return Snapshot(resources, references)

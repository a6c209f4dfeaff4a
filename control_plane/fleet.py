"""What the control plane knows about each node, Envoy or ext_proc: versions, ACKs, NACKs.

A node is identified by its xDS `node.id`. Its role comes from the node metadata
key `keg.role` ("ext_proc" for keg's rule subscribers, Envoy otherwise); its group
is `node.cluster` (see docs/xds.md: the group names which brokers it fronts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from envoy.config.core.v3 import base_pb2
from google.protobuf import json_format

from control_plane.snapshot import Snapshot
from ext_proc.rule_subscription import MAX_RULE_SET_BYTES_KEY

log = logging.getLogger(__name__)

ENVOY = "envoy"
EXT_PROC = "ext_proc"
ROLE_KEY = "keg.role"
# gRPC's default receive limit: what an ext_proc instance that does not state its own
# (`keg.max_rule_set_bytes`, older versions) accepts.
GRPC_DEFAULT_MAX_RECEIVE = 4 * 1024 * 1024


@dataclass
class NodeInfo:
    """What a node says about itself in its first request."""

    node_id: str
    cluster: str = ""
    locality: str = ""
    role: str = ENVOY
    extensions: frozenset[str] = frozenset()
    metadata: dict[str, Any] = field(default_factory=dict)
    user_agent: str = ""
    # (major, minor, patch) from user_agent_build_version: which Envoy ABI the node has.
    build_version: tuple[int, int, int] | None = None
    # The largest response it accepts (None: no limit known, e.g. an Envoy).
    max_message_bytes: int | None = None

    @classmethod
    def from_proto(cls, node: base_pb2.Node) -> NodeInfo:
        metadata = json_format.MessageToDict(node.metadata) if node.HasField("metadata") else {}
        role = metadata.get(ROLE_KEY)
        locality = "/".join(p for p in (node.locality.region, node.locality.zone,
                                        node.locality.sub_zone) if p)
        version = ""
        build: tuple[int, int, int] | None = None
        if node.HasField("user_agent_build_version"):
            v = node.user_agent_build_version.version
            version = f"{v.major_number}.{v.minor_number}.{v.patch}"
            build = (v.major_number, v.minor_number, v.patch)
        agent = " ".join(p for p in (node.user_agent_name,
                                     node.user_agent_version or version) if p)
        role = role if role in (ENVOY, EXT_PROC) else ENVOY
        return cls(
            node_id=node.id,
            cluster=node.cluster,
            locality=locality,
            role=role,
            extensions=frozenset(e.name for e in node.extensions),
            metadata=metadata,
            user_agent=agent,
            build_version=build,
            max_message_bytes=_max_message_bytes(role, metadata),
        )


def _max_message_bytes(role: str, metadata: dict[str, Any]) -> int | None:
    stated = metadata.get(MAX_RULE_SET_BYTES_KEY)
    if isinstance(stated, int | float) and stated > 0:
        return int(stated)
    return GRPC_DEFAULT_MAX_RECEIVE if role == EXT_PROC else None


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")


@dataclass
class TypeStatus:
    sent_version: str = ""
    acked_version: str = ""
    last_ack_at: float | None = None
    last_nack: str | None = None
    last_nack_version: str | None = None
    last_nack_at: float | None = None
    # The snapshot whose version of this type the node runs (kept for cluster retention).
    accepted: Snapshot | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "sent_version": self.sent_version,
            "applied_version": self.acked_version,
            "last_ack_at": _iso(self.last_ack_at),
            "last_nack": None if self.last_nack is None else {
                "version": self.last_nack_version, "error": self.last_nack,
                "at": _iso(self.last_nack_at),
            },
            "in_sync": bool(self.sent_version) and self.sent_version == self.acked_version,
        }


@dataclass
class NodeStatus(NodeInfo):
    """A node as the control plane sees it: what it said about itself when its latest
    stream opened (the NodeInfo fields), how it is served, what it runs."""

    data_path: str = ""  # what the control plane compiled for it: native | ext-proc
    # Why its Envoy could not load keg's module (its NACK), which put it on the ext_proc
    # path; cleared when its stream opens again (an Envoy restarted with the module).
    module_error: str | None = None
    transport: str = ""  # sotw | delta
    streams: int = 0  # a restarted node may open its new stream before the old one ends
    connected_at: float | None = None
    disconnected_at: float | None = None
    last_seen: float = field(default_factory=time.time)
    types: dict[str, TypeStatus] = field(default_factory=dict)

    @property
    def connected(self) -> bool:
        return self.streams > 0

    def update_info(self, info: NodeInfo) -> None:
        """What the node says about itself now (a restarted node may say something else)."""
        for node_field in fields(NodeInfo):
            setattr(self, node_field.name, getattr(info, node_field.name))

    def of(self, type_url: str) -> TypeStatus:
        return self.types.setdefault(type_url, TypeStatus())

    def has_extension(self, name: str) -> bool:
        return name in self.extensions

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "role": self.role,
            "cluster": self.cluster,
            "locality": self.locality,
            "user_agent": self.user_agent,
            "data_path": self.data_path,
            "module_error": self.module_error,
            "transport": self.transport,
            "connected": self.connected,
            "connected_at": _iso(self.connected_at),
            "last_seen": _iso(self.last_seen),
            "types": {t.rsplit("/", 1)[-1]: s.to_dict() for t, s in sorted(self.types.items())},
        }


# (the node, the type URL, the version it answered, its error: None for an ACK)
Verdict = Callable[[NodeStatus, str, str, str | None], None]


class Fleet:
    """Every node ever seen this run; callbacks let the service react to them."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeStatus] = {}
        # Called with a node's status when it connects, before it is served anything.
        self.on_connect: list[Callable[[NodeStatus], None]] = []
        # Called after a node ACKed or NACKed a version of a type.
        self.on_verdict: list[Verdict] = []

    def connected(self, info: NodeInfo, transport: str = "sotw") -> NodeStatus:
        status = self.nodes.get(info.node_id)
        if status is None:
            status = self.nodes[info.node_id] = NodeStatus(info.node_id)
        status.update_info(info)
        status.module_error = None
        status.transport = transport
        status.streams += 1
        status.connected_at = status.last_seen = time.time()
        for callback in self.on_connect:
            callback(status)
        return status

    def disconnected(self, node_id: str) -> None:
        status = self.nodes.get(node_id)
        if status is not None and status.streams > 0:
            status.streams -= 1
            if status.streams == 0:
                status.disconnected_at = time.time()

    def forget(self, older_than_s: float) -> list[str]:
        """Drop nodes disconnected for longer than `older_than_s` (ids change with
        restarts: without this the view grows forever); returns their ids."""
        cutoff = time.time() - older_than_s
        gone = [n.node_id for n in list(self.nodes.values())
                if not n.connected and n.disconnected_at is not None
                and n.disconnected_at <= cutoff]
        for node_id in gone:
            del self.nodes[node_id]
        return gone

    def sent(self, status: NodeStatus, type_url: str, version: str) -> None:
        status.of(type_url).sent_version = version

    def runs(self, status: NodeStatus, type_url: str, version: str) -> None:
        """What a node says it runs as it (re)subscribes ("": nothing yet). A restarted
        node keeps its id but not its config: what its old process ACKed is no longer
        true of it until it ACKs again."""
        status.of(type_url).acked_version = version

    def ack(self, status: NodeStatus, type_url: str, version: str,
            snapshot: Snapshot | None) -> None:
        type_status = status.of(type_url)
        type_status.acked_version, type_status.last_ack_at = version, time.time()
        type_status.accepted = snapshot
        log.info("node %s ACKed %s version %s", status.node_id, _short(type_url), version)
        self._verdict(status, type_url, version, None)

    def nack(self, status: NodeStatus, type_url: str, version: str, error: str) -> None:
        type_status = status.of(type_url)
        type_status.last_nack, type_status.last_nack_version = error, version
        type_status.last_nack_at = time.time()
        log.warning("node %s NACKed %s version %s: %s", status.node_id, _short(type_url),
                    version, error)
        self._verdict(status, type_url, version, error)

    def _verdict(self, status: NodeStatus, type_url: str, version: str,
                 error: str | None) -> None:
        for callback in self.on_verdict:
            callback(status, type_url, version, error)

    def status(self) -> list[dict[str, Any]]:
        """Every node, grouped by role, cluster and locality (the REST API's fleet view)."""
        # list() first: the REST API may call this from a worker thread.
        nodes = sorted(list(self.nodes.values()),
                       key=lambda n: (n.role, n.cluster, n.locality, n.node_id))
        return [n.to_dict() for n in nodes]


def _short(type_url: str) -> str:
    return type_url.rsplit(".", 1)[-1]

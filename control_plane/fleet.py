"""What the control plane knows about each connected node: versions, ACKs, NACKs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TypeStatus:
    sent_version: str = ""
    acked_version: str = ""
    last_nack: str | None = None
    last_nack_version: str | None = None


@dataclass
class NodeStatus:
    node_id: str
    cluster: str = ""
    extensions: frozenset[str] = frozenset()
    connected: bool = True
    last_seen: float = field(default_factory=time.time)
    types: dict[str, TypeStatus] = field(default_factory=dict)

    def of(self, type_url: str) -> TypeStatus:
        return self.types.setdefault(type_url, TypeStatus())

    def has_extension(self, name: str) -> bool:
        return name in self.extensions


class Fleet:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeStatus] = {}
        # Called with a node's status when it connects, before it is served anything.
        self.on_connect: list[Callable[[NodeStatus], None]] = []

    def connected(self, node_id: str, cluster: str, extensions: frozenset[str]) -> NodeStatus:
        status = self.nodes.get(node_id)
        if status is None:
            status = self.nodes[node_id] = NodeStatus(node_id)
        status.cluster, status.extensions = cluster, extensions
        status.connected, status.last_seen = True, time.time()
        for callback in self.on_connect:
            callback(status)
        return status

    def disconnected(self, node_id: str) -> None:
        if node_id in self.nodes:
            self.nodes[node_id].connected = False

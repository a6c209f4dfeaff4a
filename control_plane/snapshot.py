"""Immutable, versioned resource bundles per node, and the cache that hands them out.

Nothing here knows about gRPC (go-control-plane's split): the ADS transports, state
of the world and delta, ask the cache for a node's snapshot and wait on it for
changes; tests drive the cache directly. Envoys and ext_proc instances are both
nodes: an Envoy's snapshot holds clusters and listeners, an ext_proc instance's the
rule set, so a rule change touches only ext_proc snapshots.

The cache is not thread-safe: call it on the control plane's event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from google.protobuf import any_pb2
from google.protobuf.message import Message

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
RULES = "type.googleapis.com/keg.v1.RuleSet"
# ECDS: filter configurations listeners reference by name (keg's native filter).
EXTENSION_CONFIG = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
# SDS: TLS certificates and CAs that listeners and clusters name (control_plane.tls).
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
# Envoy must learn clusters before the listeners that reference them; secrets first,
# so that a rotation reaches Envoy before anything that might name a new one.
TYPE_ORDER = (SECRET, CLUSTER, EXTENSION_CONFIG, LISTENER, RULES)
ANY_NODE = "*"


class InconsistentSnapshot(ValueError):
    """A listener references a cluster the snapshot does not carry."""


def pack(message: Message) -> any_pb2.Any:
    """A resource as xDS sends it (resources already packed, like rule sets, stay)."""
    if isinstance(message, any_pb2.Any):
        return message
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def resource_version(message: Message) -> str:
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()[:16]


def _version_of(versions: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(versions):
        digest.update(name.encode())
        digest.update(versions[name].encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Snapshot:
    """Resources by type URL and name; `references` maps a listener to its clusters.

    A type's version is a hash of its resources unless `fixed_versions` names it
    (a rule set carries the version its source gave it)."""

    resources: Mapping[str, Mapping[str, Message]]
    references: Mapping[str, frozenset[str]] = field(default_factory=dict)
    fixed_versions: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clusters = self.resources.get(CLUSTER, {})
        for listener, needed in self.references.items():
            missing = needed - clusters.keys()
            if missing:
                raise InconsistentSnapshot(
                    f"listener {listener} references missing clusters {sorted(missing)}"
                )

    @cached_property
    def resource_versions(self) -> Mapping[str, Mapping[str, str]]:
        """type URL -> resource name -> version (what delta xDS compares)."""
        return {t: {name: resource_version(m) for name, m in r.items()}
                for t, r in self.resources.items()}

    @cached_property
    def versions(self) -> Mapping[str, str]:
        return {t: self.fixed_versions.get(t) or _version_of(self.resource_versions[t])
                for t in self.resources}

    def version(self, type_url: str) -> str:
        return self.versions.get(type_url, "")

    def has(self, type_url: str) -> bool:
        return type_url in self.resources

    def with_resources(self, type_url: str, resources: Mapping[str, Message]) -> Snapshot:
        """This snapshot with `type_url`'s resources replaced (none: the type dropped)."""
        if not resources and type_url not in self.resources:
            return self
        merged = {**self.resources, type_url: resources}
        if not resources:
            del merged[type_url]
        return Snapshot(merged, self.references, self.fixed_versions)

    def retaining(self, accepted: Snapshot | None) -> Snapshot:
        """This snapshot plus the clusters that `accepted`'s listeners still use.

        A node runs the listeners it last accepted until it accepts new ones (and
        keeps them for good if it NACKs): the clusters they name must stay."""
        if accepted is None:
            return self
        clusters = dict(self.resources.get(CLUSTER, {}))
        old_clusters = accepted.resources.get(CLUSTER, {})
        kept = False
        for needed in accepted.references.values():
            for name in needed - clusters.keys():
                if name in old_clusters:
                    clusters[name] = old_clusters[name]
                    kept = True
        if not kept:
            return self
        return Snapshot({**self.resources, CLUSTER: clusters}, self.references,
                        self.fixed_versions)


class SnapshotCache:
    """node id -> snapshot, with `ANY_NODE` for nodes that have none of their own.

    Each node has a generation that moves whenever its snapshot (or the default)
    is set; a transport waits on it to learn that there is something to push."""

    def __init__(self) -> None:
        self._snapshots: dict[str, Snapshot] = {}
        self._generations: dict[str, int] = {}
        self._default_generation = 0
        self._events: dict[str, asyncio.Event] = {}

    def set(self, node_id: str, snapshot: Snapshot) -> None:
        self._snapshots[node_id] = snapshot
        if node_id == ANY_NODE:
            self._default_generation += 1
            for node in list(self._events):
                self._wake(node)
        else:
            self._generations[node_id] = self._generations.get(node_id, 0) + 1
            self._wake(node_id)

    def set_if_changed(self, node_id: str, snapshot: Snapshot) -> bool:
        current = self._snapshots.get(node_id)
        if current is not None and (current.versions == snapshot.versions
                                    and current.references == snapshot.references):
            return False
        self.set(node_id, snapshot)
        return True

    def clear(self, node_id: str) -> None:
        """Forget a node (the fleet forgot it): its snapshot, its generation and the
        wake-up event a cancelled watch left. A watch still waiting wakes up: the node
        now gets the default snapshot."""
        self._snapshots.pop(node_id, None)
        self._generations.pop(node_id, None)
        self._wake(node_id)

    def get(self, node_id: str) -> Snapshot | None:
        return self._snapshots.get(node_id) or self._snapshots.get(ANY_NODE)

    def nodes(self) -> list[str]:
        return [n for n in self._snapshots if n != ANY_NODE]

    def generation(self, node_id: str) -> int:
        return self._generations.get(node_id, 0) + self._default_generation

    def _wake(self, node_id: str) -> None:
        event = self._events.pop(node_id, None)
        if event is not None:
            event.set()

    async def wait_for_change(self, node_id: str, generation: int) -> int:
        """Return once `node_id`'s generation has moved past `generation`."""
        while self.generation(node_id) == generation:
            event = self._events.setdefault(node_id, asyncio.Event())
            await event.wait()
        return self.generation(node_id)

"""Immutable, versioned resource bundles per node, and the cache that hands them out.

Nothing here knows about gRPC: the ADS transport asks the cache for a node's
snapshot and waits on it for changes; tests drive the cache directly.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
# Envoy must learn clusters before the listeners that reference them.
TYPE_ORDER = (CLUSTER, LISTENER)
ANY_NODE = "*"


class InconsistentSnapshot(ValueError):
    """A listener references a cluster the snapshot does not carry."""


def _version_of(resources: Mapping[str, Message]) -> str:
    digest = hashlib.sha256()
    for name in sorted(resources):
        digest.update(name.encode())
        digest.update(resources[name].SerializeToString(deterministic=True))
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Snapshot:
    """Resources by type URL and name; `references` maps a listener to its clusters."""

    resources: Mapping[str, Mapping[str, Message]]
    references: Mapping[str, frozenset[str]] = field(default_factory=dict)
    versions: Mapping[str, str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "versions", {t: _version_of(r) for t, r in self.resources.items()}
        )
        clusters = self.resources.get(CLUSTER, {})
        for listener, needed in self.references.items():
            missing = needed - clusters.keys()
            if missing:
                raise InconsistentSnapshot(
                    f"listener {listener} references missing clusters {sorted(missing)}"
                )

    def version(self, type_url: str) -> str:
        return self.versions.get(type_url, "")


class SnapshotCache:
    """node id -> snapshot, with a default for nodes that have none of their own."""

    def __init__(self) -> None:
        self._snapshots: dict[str, Snapshot] = {}
        self._changed = asyncio.Event()
        self.generation = 0

    def set(self, node_id: str, snapshot: Snapshot) -> None:
        self._snapshots[node_id] = snapshot
        self.generation += 1
        # Wake every waiter, then start a fresh event for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    def get(self, node_id: str) -> Snapshot | None:
        return self._snapshots.get(node_id) or self._snapshots.get(ANY_NODE)

    async def wait_for_change(self, generation: int) -> int:
        """Return once the cache's generation has moved past `generation`."""
        while self.generation == generation:
            await self._changed.wait()
        return self.generation

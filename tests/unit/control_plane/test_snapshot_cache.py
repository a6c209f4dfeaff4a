"""The snapshot cache: per-node snapshots, the default, and what a forgotten node leaves."""

from __future__ import annotations

import asyncio
import contextlib

from control_plane.snapshot import ANY_NODE, Snapshot, SnapshotCache


def snapshot(version: str) -> Snapshot:
    return Snapshot({}, fixed_versions={"t": version})


def test_clear_releases_everything_the_cache_kept_for_the_node() -> None:
    async def scenario() -> None:
        cache = SnapshotCache()
        cache.set("node-a", snapshot("1"))
        # A transport that watched the node and went away (its stream was cancelled).
        watch = asyncio.create_task(cache.wait_for_change("node-a", cache.generation("node-a")))
        await asyncio.sleep(0)  # the watch is waiting
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        cache.clear("node-a")
        assert cache.nodes() == [] and cache.get("node-a") is None
        # Nothing of the node stays behind: node ids change with restarts, so any
        # per-node entry kept after clear() grows without bound.
        assert "node-a" not in cache._generations
        assert "node-a" not in cache._events

    asyncio.run(scenario())


def test_clear_wakes_a_watcher_the_node_falls_back_to_the_default() -> None:
    async def scenario() -> None:
        cache = SnapshotCache()
        cache.set(ANY_NODE, snapshot("default"))
        cache.set("node-a", snapshot("own"))
        watch = asyncio.create_task(cache.wait_for_change("node-a", cache.generation("node-a")))
        await asyncio.sleep(0)
        cache.clear("node-a")
        await asyncio.wait_for(watch, timeout=5)  # its snapshot changed: the default's
        assert cache.get("node-a") == snapshot("default")

    asyncio.run(scenario())

"""Per-node snapshots without a network: groups of a mesh, kafka_broker nodes, rules only
to ext_proc nodes, cluster retention across NACKs, the fleet view."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from envoy.config.listener.v3 import listener_pb2

from control_plane.envoy_resources import BrokerRoute, GatewayPlan, compile_snapshot
from control_plane.fleet import EXT_PROC, Fleet, NodeInfo
from control_plane.kafka_broker import FILTER_NAME
from control_plane.providers import StaticRuleProvider, StoreRuleProvider
from control_plane.service import ControlPlane, ControlPlaneSettings, EnvoyGroup, load_groups
from control_plane.snapshot import ANY_NODE, CLUSTER, LISTENER, RULES, SnapshotCache
from control_plane.store import Change, open_store
from control_plane.topology import Broker, Topology
from filter_rules import Rule, load_rule_text

RULES_YAML = """
rules:
  - id: no-deletes
    action: {deny_apis: [DeleteTopics, DeleteRecords]}
"""

ONE = Topology("c", (Broker(1, "10.0.0.1", 9092),))
TWO = Topology("c", (Broker(1, "10.0.0.1", 9092), Broker(2, "10.0.0.2", 9092)))


def plane(**kwargs: object) -> tuple[ControlPlane, StaticRuleProvider]:
    rules = StaticRuleProvider()
    settings = ControlPlaneSettings(bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1",
                                    ext_proc_port=1, **kwargs)  # type: ignore[arg-type]
    cp = ControlPlane(settings, rules=rules)
    cp.refresh_rules()  # what start() does, on this thread
    rules.subscribe(lambda *_: cp.refresh_rules())
    return cp, rules


def envoy(cp: ControlPlane, node: str, cluster: str = "keg",
          extensions: frozenset[str] = frozenset()) -> None:
    cp.fleet.connected(NodeInfo(node, cluster, extensions=extensions))


def ext_proc(cp: ControlPlane, node: str) -> None:
    cp.fleet.connected(NodeInfo(node, "keg-ext-proc", role=EXT_PROC))


def listener_filters(cp: ControlPlane, node: str, name: str) -> list[str]:
    snapshot = cp.cache.get(node)
    assert snapshot is not None
    listener = snapshot.resources[LISTENER][name]
    assert isinstance(listener, listener_pb2.Listener)
    return [f.name for f in listener.filter_chains[0].filters]


def test_kafka_broker_filter_only_for_nodes_that_have_it() -> None:
    cp, _ = plane()
    cp.set_topology(ONE)
    envoy(cp, "contrib", extensions=frozenset({FILTER_NAME}))
    envoy(cp, "plain")
    assert listener_filters(cp, "contrib", "kafka_broker_1") == [
        FILTER_NAME, "envoy.filters.network.ext_proc", "envoy.filters.network.tcp_proxy"]
    assert listener_filters(cp, "plain", "kafka_broker_1") == [
        "envoy.filters.network.ext_proc", "envoy.filters.network.tcp_proxy"]


def test_rule_changes_reach_only_ext_proc_nodes_unless_api_lists_change() -> None:
    cp, rules = plane()
    cp.set_topology(ONE)
    envoy(cp, "plain")
    envoy(cp, "contrib", extensions=frozenset({FILTER_NAME}))
    ext_proc(cp, "xp-1")
    ext_proc(cp, "xp-2")
    before = {n: cp.cache.generation(n) for n in ("plain", "contrib", "xp-1", "xp-2")}
    ruleset = load_rule_text(RULES_YAML, "r.yaml")
    rules.set(ruleset)
    after = {n: cp.cache.generation(n) for n in before}
    assert after["plain"] == before["plain"]  # listeners untouched: no drain
    assert after["xp-1"] > before["xp-1"] and after["xp-2"] > before["xp-2"]
    snapshot = cp.cache.get("xp-1")
    assert snapshot is not None and snapshot.version(RULES) == ruleset.version
    assert not snapshot.has(LISTENER)
    # The contrib node enforces the global API lists in Envoy: its listener changed.
    assert after["contrib"] > before["contrib"]
    # The same rules again: nothing moves anywhere.
    rules.set(ruleset)
    assert {n: cp.cache.generation(n) for n in before} == after


def test_api_lists_can_stay_out_of_envoy() -> None:
    cp, rules = plane(kafka_broker_api_lists=False)
    cp.set_topology(ONE)
    envoy(cp, "contrib", extensions=frozenset({FILTER_NAME}))
    before = cp.cache.generation("contrib")
    rules.set(load_rule_text(RULES_YAML, "r.yaml"))
    assert cp.cache.generation("contrib") == before


def test_mesh_groups_front_their_brokers_and_advertise_the_others() -> None:
    groups = (EnvoyGroup("edge-a", frozenset({1}), "0.0.0.0", "a.example", 20000),
              EnvoyGroup("edge-b", frozenset({2}), "0.0.0.0", "b.example", 30000))
    cp, _ = plane(groups=groups)
    cp.set_topology(TWO)
    envoy(cp, "a-1", "edge-a")
    envoy(cp, "b-1", "edge-b")
    envoy(cp, "other", "unknown-cluster")
    a, b, other = (cp.cache.get(n) for n in ("a-1", "b-1", "other"))
    assert a is not None and b is not None and other is not None
    assert set(a.resources[LISTENER]) == {"kafka_broker_1"}
    assert set(b.resources[LISTENER]) == {"kafka_broker_2"}
    assert set(other.resources[LISTENER]) == {"kafka_broker_1", "kafka_broker_2"}
    plan_a = cp._group_plan(groups[0])
    assert plan_a.advertised_routes() == {1: ("a.example", 20000), 2: ("b.example", 30001)}
    assert [r.listen_port for r in plan_a.routes] == [20000]


def test_topology_change_reaches_every_envoy_and_no_ext_proc() -> None:
    cp, _ = plane()
    cp.set_topology(ONE)
    for node in ("e1", "e2", "e3"):
        envoy(cp, node)
    ext_proc(cp, "xp")
    xp = cp.cache.generation("xp")
    assert cp.set_topology(TWO)
    for node in ("e1", "e2", "e3"):
        snapshot = cp.cache.get(node)
        assert snapshot is not None
        assert set(snapshot.resources[LISTENER]) == {"kafka_broker_1", "kafka_broker_2"}
    assert cp.cache.generation("xp") == xp
    assert not cp.set_topology(TWO)  # unchanged: nothing published


def test_clusters_of_accepted_listeners_stay_until_new_ones_are_accepted() -> None:
    cp, _ = plane()
    cp.set_topology(TWO)
    envoy(cp, "e1")
    status = cp.fleet.nodes["e1"]
    first = cp.cache.get("e1")
    assert first is not None
    cp.fleet.ack(status, CLUSTER, first.version(CLUSTER), first)
    cp.fleet.ack(status, LISTENER, first.version(LISTENER), first)
    cp.set_topology(ONE)  # broker 2 gone
    second = cp.cache.get("e1")
    assert second is not None
    assert set(second.resources[LISTENER]) == {"kafka_broker_1"}
    assert "kafka_broker_2" in second.resources[CLUSTER]  # its old listener still runs
    cp.fleet.nack(status, LISTENER, second.version(LISTENER), "no")
    kept = cp.cache.get("e1")
    assert kept is not None and "kafka_broker_2" in kept.resources[CLUSTER]
    cp.fleet.ack(status, LISTENER, second.version(LISTENER), second)
    third = cp.cache.get("e1")
    assert third is not None and "kafka_broker_2" not in third.resources[CLUSTER]
    entry = next(n for n in cp.fleet_status() if n["node_id"] == "e1")
    listener = entry["types"]["envoy.config.listener.v3.Listener"]
    assert listener["last_nack"]["error"] == "no"
    assert listener["applied_version"] == second.version(LISTENER)


def test_fleet_status_lists_roles_connection_and_versions() -> None:
    fleet = Fleet()
    status = fleet.connected(NodeInfo("e1", "keg", "eu-west/a"))
    fleet.connected(NodeInfo("xp", "keg-ext-proc", role=EXT_PROC))
    fleet.sent(status, CLUSTER, "v1")
    fleet.disconnected("xp")
    view = {n["node_id"]: n for n in fleet.status()}
    assert view["e1"]["connected"] and view["e1"]["locality"] == "eu-west/a"
    assert view["e1"]["types"]["envoy.config.cluster.v3.Cluster"]["in_sync"] is False
    assert view["xp"]["role"] == EXT_PROC and not view["xp"]["connected"]
    # A restarted node opens its new stream before the old one closes: still connected.
    fleet.connected(NodeInfo("e1"))
    fleet.disconnected("e1")
    assert fleet.nodes["e1"].connected


def test_cache_wakes_only_the_node_that_changed() -> None:
    async def scenario() -> None:
        cache = SnapshotCache()
        snapshot = compile_snapshot(GatewayPlan((BrokerRoute(1, "10.0.0.1", 9092, 19092),),
                                                "0.0.0.0", "gw", "127.0.0.1", 1))
        a = asyncio.create_task(cache.wait_for_change("a", cache.generation("a")))
        b = asyncio.create_task(cache.wait_for_change("b", cache.generation("b")))
        cache.set("a", snapshot)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert a.done() and not b.done()
        cache.set(ANY_NODE, snapshot)  # the default moves everyone
        await asyncio.wait_for(b, 1)
        assert cache.get("b") is snapshot

    asyncio.run(scenario())


def test_groups_file(tmp_path: Path) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text("groups:\n  - {name: edge-a, brokers: [1, 2], listen_port_base: 20000}\n")
    (group,) = load_groups(path)
    assert group.brokers == frozenset({1, 2}) and group.listen_port_base == 20000
    path.write_text("groups:\n  - {name: edge-a, brokers: one}\n")
    with pytest.raises(ValueError, match=r"groups\[0\]: 'brokers' must be a list"):
        load_groups(path)
    path.write_text("groups:\n  - {name: a, port: 1}\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_groups(path)


def test_long_gone_nodes_leave_the_view() -> None:
    fleet = Fleet()
    fleet.connected(NodeInfo("old"))
    fleet.connected(NodeInfo("live"))
    fleet.disconnected("old")
    assert fleet.forget(3600) == []
    assert fleet.forget(0) == ["old"]
    assert set(fleet.nodes) == {"live"}


def test_a_rules_version_an_instance_nacks_is_rejected_and_the_last_good_one_served(
        tmp_path: Path) -> None:
    """The store as the rule source: an ext_proc NACK marks the version rejected in the
    store, and every ext_proc node -- the refusing one, a new one -- is served the last
    good version again; ACKs make a version live."""
    store = open_store(None, tmp_path)
    store.put_rule(Rule.model_validate({"id": "a", "action": {"observe": {}}}), Change("t"))
    settings = ControlPlaneSettings(bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1",
                                    ext_proc_port=1)
    cp = ControlPlane(settings, rules=StoreRuleProvider(store))
    cp.refresh_rules()  # what start() does, on this thread
    store.subscribe(lambda *_: cp.refresh_rules())
    ext_proc(cp, "xp-1")
    xp = cp.fleet.nodes["xp-1"]
    cp.fleet.ack(xp, RULES, "1", cp.cache.get("xp-1"))
    live = store.live()
    assert live is not None and live.number == 1

    store.put_rule(Rule.model_validate({"id": "b", "action": {"observe": {}}}), Change("t"))
    assert cp.rules_version == "2"
    cp.fleet.nack(xp, RULES, "2", "rule b: cannot build")
    verdict = store.verdict(2)
    assert verdict is not None and verdict.status == "rejected"
    assert verdict.detail == "rule b: cannot build" and verdict.node == "xp-1"
    assert cp.rules_version == "1"
    served = cp.cache.get("xp-1")
    assert served is not None and served.version(RULES) == "1"
    ext_proc(cp, "xp-new")
    fresh = cp.cache.get("xp-new")
    assert fresh is not None and fresh.version(RULES) == "1"
    cp.fleet.ack(xp, RULES, "1", served)  # the refusing node runs version 1 again
    live = store.live()
    assert live is not None and live.number == 1
    store.close()

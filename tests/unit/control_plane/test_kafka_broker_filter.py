"""Envoy's contrib kafka_broker filter: its message, and who gets it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from envoy.config.listener.v3 import listener_pb2

from control_plane.fleet import NodeInfo
from control_plane.kafka_broker import FILTER_NAME, global_api_lists, kafka_broker_config
from control_plane.service import ControlPlane, ControlPlaneSettings
from control_plane.snapshot import LISTENER
from control_plane.topology import Broker, Topology
from filter_rules import CompiledRuleSet, load_rule_text

RULES = """
rules:
  - id: only-data-apis
    match: {}
    action: {allow_apis: [ApiVersions, Metadata, Produce, Fetch, FindCoordinator]}
  - id: no-deletes
    action: {deny_apis: [DeleteTopics, DeleteRecords]}
  - id: bob-may-not-create
    match: {principals: {exact: [bob]}}
    action: {deny_apis: [CreateTopics]}
  - id: just-trying
    mode: dry-run
    action: {deny_apis: [Produce]}
"""


def test_message_bytes_follow_the_contrib_proto_field_numbers() -> None:
    config = kafka_broker_config("x", {1: ("h", 9)}, allowed=[3, 0], denied=[20])
    assert config.SerializeToString() == (
        b"\x0a\x01x"  # 1: stat_prefix
        b"\x1a\x09\x0a\x07\x08\x01\x12\x01h\x18\x09"  # 3: {rules: [{id 1, host h, port 9}]}
        b"\x22\x02\x00\x03"  # 4: api_keys_allowed, packed
        b"\x2a\x01\x14"  # 5: api_keys_denied
    )
    assert config.DESCRIPTOR.full_name == \
        "envoy.extensions.filters.network.kafka_broker.v3.KafkaBroker"


def test_only_unconditional_enforced_api_lists_reach_envoy() -> None:
    rules = CompiledRuleSet(load_rule_text(RULES, "r.yaml")).rules
    allowed, denied = global_api_lists(rules)
    assert allowed == frozenset({18, 3, 0, 1, 10})
    assert denied == frozenset({20, 21})  # not bob's CreateTopics, not the dry-run


def test_nodes_with_the_extension_get_the_filter_first(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(RULES)

    async def scenario() -> None:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=1,
            rules_dir=tmp_path))
        plane.refresh_rules()
        plane.set_topology(Topology("c", (Broker(1, "10.0.0.1", 9092),)))
        plane.fleet.connected(NodeInfo("contrib-envoy", "keg",
                                       extensions=frozenset({FILTER_NAME})))
        plane.fleet.connected(NodeInfo("plain-envoy", "keg",
                                       extensions=frozenset({"envoy.filters.network.ext_proc"})))
        names = {}
        for node in ("contrib-envoy", "plain-envoy"):
            snapshot = plane.cache.get(node)
            assert snapshot is not None
            listener = snapshot.resources[LISTENER]["kafka_broker_1"]
            assert isinstance(listener, listener_pb2.Listener)
            names[node] = [f.name for f in listener.filter_chains[0].filters]
        assert names["contrib-envoy"] == [FILTER_NAME, "envoy.filters.network.ext_proc",
                                          "envoy.filters.network.tcp_proxy"]
        assert names["plain-envoy"] == ["envoy.filters.network.ext_proc",
                                        "envoy.filters.network.tcp_proxy"]

    asyncio.run(scenario())

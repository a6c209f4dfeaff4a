"""keg's own Kafka filter: an Envoy dynamic module (envoy/kafka_filter), for nodes that can load it.

The module is built against one Envoy release's dynamic-module ABI
(`ENVOY_VERSION`, pinned in envoy/kafka_filter/src/abi.rs; a unit test keeps the two
equal). The control plane offers it only to Envoys whose xDS node reports that
major.minor in `user_agent_build_version`; every other node gets the network ext_proc
chain, so a mixed fleet works.

Neither xds-protos nor envoy-data-plane ships the dynamic-modules messages, so the two
this needs are defined here from their protos (Envoy's api/ tree):

    message DynamicModuleConfig { string name = 1; ... }
    message DynamicModuleNetworkFilter {
      DynamicModuleConfig dynamic_module_config = 1;
      string filter_name = 2;
      google.protobuf.Any filter_config = 3;   // StringValue: passed to the module as is
      bool terminal_filter = 4;
    }
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

import kafka_wire
from ext_proc.filters import WhoScope
from ext_proc.filters.rules import RuleEngine
from ext_proc.frames import (
    MAX_VERSION,
    FailOpenRange,
    InterestRange,
    handed_off_ranges,
    interest_table,
)
from ext_proc.tls_principal import SUBJECT
from filter_rules import CompiledRuleSet, RuleSet, RuleSetInvalid
from filter_rules.record_actions import RECORD_KINDS
from kafka_wire import ApiKey

log = logging.getLogger(__name__)

# What Envoy's NACK of a configuration naming the module says when it cannot load it
# (not on ENVOY_DYNAMIC_MODULES_SEARCH_PATH, or built for another ABI).
MODULE_LOAD_FAILED: Final = "Failed to load dynamic module"

# Kafka's sasl.oauthbearer.sub.claim.name default: the claim an OAUTHBEARER principal is.
DEFAULT_OAUTH_CLAIM: Final = "sub"

FILTER_NAME = "envoy.filters.network.dynamic_modules"
FILTER_TYPE = ("type.googleapis.com/envoy.extensions.filters.network.dynamic_modules.v3."
               "DynamicModuleNetworkFilter")
# The shared object Envoy loads: lib<MODULE_NAME>.so in ENVOY_DYNAMIC_MODULES_SEARCH_PATH.
MODULE_NAME = "keg_kafka_filter"
# The filter implementation inside the module.
MODULE_FILTER = "keg_kafka"
# The Envoy release (major, minor) whose ABI the module is built against.
ENVOY_VERSION = (1, 40)

_PACKAGE = "envoy.extensions.filters.network.dynamic_modules.v3"
_CONFIG_PACKAGE = "envoy.extensions.dynamic_modules.v3"
_F = descriptor_pb2.FieldDescriptorProto


def runs_module(build_version: tuple[int, int, int] | None) -> bool:
    """Whether an Envoy of this version (from its xDS node) can load the module."""
    return build_version is not None and build_version[:2] == ENVOY_VERSION


@cache
def _classes() -> dict[str, Any]:
    common = descriptor_pb2.FileDescriptorProto(
        name="keg/dynamic_modules/config.proto", package=_CONFIG_PACKAGE, syntax="proto3")
    common.message_type.add(name="DynamicModuleConfig", field=[
        _F(name="name", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)])
    network = descriptor_pb2.FileDescriptorProto(
        name="keg/dynamic_modules/network.proto", package=_PACKAGE, syntax="proto3",
        dependency=["keg/dynamic_modules/config.proto", "google/protobuf/any.proto"])
    network.message_type.add(name="DynamicModuleNetworkFilter", field=[
        _F(name="dynamic_module_config", number=1, type=_F.TYPE_MESSAGE, label=_F.LABEL_OPTIONAL,
           type_name=f".{_CONFIG_PACKAGE}.DynamicModuleConfig"),
        _F(name="filter_name", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL),
        _F(name="filter_config", number=3, type=_F.TYPE_MESSAGE, label=_F.LABEL_OPTIONAL,
           type_name=".google.protobuf.Any"),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(descriptor_pb2.FileDescriptorProto.FromString(
        any_pb2.DESCRIPTOR.serialized_pb).SerializeToString())
    pool.Add(common)
    pool.Add(network)
    return {
        "DynamicModuleConfig": message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{_CONFIG_PACKAGE}.DynamicModuleConfig")),
        "DynamicModuleNetworkFilter": message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{_PACKAGE}.DynamicModuleNetworkFilter")),
    }


@dataclass(frozen=True)
class NativeFilter:
    """What every native listener of a group shares: its route table, limits, the
    interest table of the live rule set (`interest`, None: nothing is handed off), and
    on mutual-TLS listeners how a client certificate names the principal (Kafka's
    ssl.principal.mapping.rules and `subject` / `uri_san`, ext_proc.tls_principal; the
    module applies them itself, see envoy/kafka_filter/src/core/tls_principal.rs)."""

    route_table: str
    max_frame_size: int = 100 * 1024 * 1024
    max_held_bytes: int = 1 << 30
    interest: Mapping[str, Any] | None = field(default=None, compare=False)
    principal_mapping_rules: str | None = None
    principal_from: str | None = None
    # The JWT claim an OAUTHBEARER token's principal is (the brokers').
    oauth_principal_claim: str = DEFAULT_OAUTH_CLAIM
    # The module's labelled metrics (its `metrics` object, envoy/kafka_filter/src/metrics.rs):
    # from the node's metadata, `module_metrics`.
    metrics: Mapping[str, Any] | None = field(default=None, compare=False)


# The node metadata key an Envoy names its module's metrics exporter with: {"address":
# "host:port", and optionally "topics", "max_topics", "max_clients", "max_principals",
# "max_series"}.
METRICS_KEY = "keg.metrics"


def module_metrics(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The module's `metrics` object from an Envoy's node metadata (None: it asks for
    none). Struct numbers arrive as floats: whole ones become the integers the module
    reads; anything else is passed as it is, for the module to refuse with a message
    (its NACK names the field)."""
    stated = metadata.get(METRICS_KEY)
    if stated is None:
        return None
    if not isinstance(stated, Mapping):
        return {"address": stated}  # "host:port" alone; anything else the module refuses
    return {key: int(value) if isinstance(value, float) and value.is_integer() else value
            for key, value in stated.items()}


@dataclass(frozen=True)
class HandOff:
    """Where the module hands frames to (the ext_proc service's workers) and how."""

    endpoints: tuple[str, ...]
    failure_mode_allow: bool = False
    timeout_ms: int = 2000
    max_bytes_per_connection: int = 16 << 20
    max_bytes: int = 256 << 20


Range = InterestRange


def interest_requests(ruleset: RuleSet) -> list[tuple[int, int, int]]:
    """The requests the module hands to the Python chain for `ruleset`, as (api key,
    min version, max version) ranges (`handed_off` without the selectors)."""
    return [(r.api_key, r.low, r.high) for r in handed_off(ruleset)[0]]


def handed_off(ruleset: RuleSet) -> tuple[list[Range], list[FailOpenRange]]:
    """What the module hands to the chain of an engine running `ruleset`: the ranges
    with their topic selectors (`ext_proc.frames.interest_ranges`), and those whose
    hand-off may fail open (`fail_open_ranges`). An engine the control plane cannot
    build (a secret only the ext_proc service can read) falls back to a superset
    without selectors that fails as the rule set says: every API some rule may apply
    to, all versions (Produce and Fetch with any record rule), plus what the chain
    always learns from."""
    try:
        engine = RuleEngine(CompiledRuleSet(ruleset))
    except RuleSetInvalid as err:
        log.warning("interest table from the rules alone (the control plane cannot build "
                    "their actions: %s)", err)
        return [Range(key, low, high, None, None) for key, low, high in _superset(ruleset)], []
    try:
        return handed_off_ranges(engine)
    finally:
        engine.records.close()


def _superset(ruleset: RuleSet) -> list[tuple[int, int, int]]:
    compiled = CompiledRuleSet(ruleset)
    wanted = {key for key, _, _ in interest_table(RuleEngine(CompiledRuleSet(RuleSet())))}
    for key in kafka_wire.known_api_keys():
        low, high = kafka_wire.supported_versions(key) or (0, 0)
        if any(compiled.interested(key, v, d) for v in range(low, high + 1)
               for d in ("request", "response")):
            wanted.add(key)
    if any(rule.kind in RECORD_KINDS for rule in compiled.rules):
        wanted |= {ApiKey.PRODUCE, ApiKey.FETCH}
    return [(key, 0, MAX_VERSION) for key in sorted(wanted)]


def _clauses_json(scope: WhoScope) -> list[dict[str, Any]]:
    return sorted((clause.to_json() for clause in scope),
                  key=lambda c: json.dumps(c, sort_keys=True))


def _range_json(r: Range) -> list[Any]:
    extra: dict[str, Any] = {}
    if r.unvouched is not None:
        extra["unvouched"] = r.unvouched.to_json()
    if r.who is not None:
        extra["who"] = _clauses_json(r.who)
    if r.checks is not None:
        extra["safeguards"] = r.checks.to_json()
    if r.whole is not None:
        extra["whole"] = _clauses_json(r.whole)
    head: list[Any] = [r.api_key, r.low, r.high]
    if not extra:
        return head if r.selector is None else [*head, r.selector.to_json()]
    return [*head, None if r.selector is None else r.selector.to_json(), extra]


def interest(ruleset: RuleSet, version: str, handoff: HandOff) -> dict[str, Any]:
    """The module's interest table for rule-set `version` (its JSON, see
    envoy/kafka_filter/src/core/interest.rs)."""
    ranges, fail_open = handed_off(ruleset)
    return {
        "version": version,
        # [api key, min, max] hands off every such request; a fourth element, a topic
        # selector, only those naming a selected topic; a fifth, {"unvouched": selector},
        # lets the module pass the other selected topics' batches whose schema ids the
        # service vouched for (docs/native.md); {"who": [clause, ...]} hands off only
        # requests of connections a clause admits (principals, networks, listeners).
        "requests": [_range_json(r) for r in ranges],
        "failure_mode_allow": handoff.failure_mode_allow,
        # Requests only learners and dry runs want: forwarded when the service cannot
        # take them.
        "fail_open": [[r.api_key, r.low, r.high] if r.unless is None
                      else [r.api_key, r.low, r.high, r.unless.to_json()] for r in fail_open],
        "endpoints": list(handoff.endpoints),
        "handoff_timeout_ms": handoff.timeout_ms,
        "max_bytes_per_connection": handoff.max_bytes_per_connection,
        "max_bytes": handoff.max_bytes,
    }


def module_config(native: NativeFilter, routes: Mapping[int, tuple[str, int]],
                  brokers: Iterable[tuple[int, str, int]] = ()) -> dict[str, Any]:
    """The module's JSON filter_config: gateway route per broker id, the broker's own
    endpoint where known (to recognise it inside DescribeConfigs values), and the
    interest table."""
    broker_of = {node: f"{host}:{port}" for node, host, port in brokers}
    entries = []
    for node, (host, port) in sorted(routes.items()):
        entry: dict[str, Any] = {"node_id": node, "gateway": f"{host}:{port}"}
        if node in broker_of:
            entry["broker"] = broker_of[node]
        entries.append(entry)
    config = {"route_table": native.route_table, "max_frame_size": native.max_frame_size,
              "max_held_bytes": native.max_held_bytes, "routes": entries}
    if native.interest is not None:
        config["interest"] = dict(native.interest)
    if native.principal_mapping_rules is not None:
        config["principal_mapping_rules"] = native.principal_mapping_rules
        config["principal_from"] = native.principal_from or SUBJECT
    if native.oauth_principal_claim != DEFAULT_OAUTH_CLAIM:
        config["oauth_principal_claim"] = native.oauth_principal_claim
    if native.metrics is not None:
        config["metrics"] = dict(native.metrics)
    return config


def network_filter(config: Mapping[str, Any]) -> Any:
    """A DynamicModuleNetworkFilter message loading keg's module with `config` (JSON)."""
    classes = _classes()
    packed = any_pb2.Any()
    packed.Pack(wrappers_pb2.StringValue(value=json.dumps(config, sort_keys=True)))
    message = classes["DynamicModuleNetworkFilter"](
        dynamic_module_config=classes["DynamicModuleConfig"](name=MODULE_NAME),
        filter_name=MODULE_FILTER,
    )
    # The message's Any comes from its own descriptor pool: copy the bytes across.
    message.filter_config.MergeFromString(packed.SerializeToString())
    return message
